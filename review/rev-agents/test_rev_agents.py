"""Repros of the rev-agents review (fix/agents, issue 14: fusee.ai.openai).

Run: cd <tree> && PYTHONPATH=<tree>/src:<tree> /work/main/.venv/bin/python -m pytest -q \
        -p no:xdist review/rev-agents/test_rev_agents.py

Each test asserts what a user of the adapter is promised and FAILS on fix/agents.
A replay is forced the way the builder's own tests do it (``FUSEE_ALWAYS_REPLAY``:
``WorkerConfig(always_replay=True)``, every step boundary evicts and replays; a
crash, an eviction, a park/resume do the same in production).
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from agents import (
    Agent,
    Handoff,
    RunHooks,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call

import fusee
from fusee.actors.worker import WorkerConfig
from fusee.ai.openai import durable_agent, run

pytestmark = pytest.mark.timeout(60)

set_tracing_disabled(True)

AGENTS: dict[str, Agent[Any]] = {}
EFFECTS: list[str] = []
SLOWED: set[str] = set()


def outputs(result: Any) -> dict[str, Any]:
    """The tool results the SDK handed the model, by tool-call ID."""
    out: dict[str, Any] = {}
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem):
            raw = item.raw_item
            call_id = raw["call_id"] if isinstance(raw, dict) else raw.call_id
            out[call_id] = item.output
    return out


@fusee.workflow("rev_oa")
async def wf(ctx: fusee.Context, question: str) -> Any:
    hooks: Any = None
    if ctx.run_id.startswith("swap"):
        hooks = SlowFirstStart()
    elif ctx.run_id.startswith("audit"):
        hooks = AuditedStart(ctx)
    result = await run(ctx, AGENTS[ctx.run_id], question, hooks=hooks)
    return {"final": result.final_output, "tools": outputs(result)}


# -- 1. a Handoff whose on_invoke_handoff builds its agent -----------------------------


async def test_a_handoff_that_builds_its_agent_gets_the_agent_it_built() -> None:
    """``_Maker.seen`` is keyed by ``id(agent)`` and keeps no reference to the agent:
    an agent built in ``on_invoke_handoff`` dies once its clone is made, and the next
    one built often gets its address, so the durable Handoff returns the clone of the
    EARLIER agent (other instructions, tools, model). On fix/agents: hundreds of the
    300 calls below get a stale agent."""

    async def build(_ctx: Any, args: str) -> Agent[Any]:
        lang = json.loads(args)["lang"]
        return Agent(name=f"agent-{lang}", instructions=f"Answer in {lang}.")

    transfer = Handoff(
        tool_name="transfer",
        tool_description="Hand off to a language agent.",
        input_json_schema={"type": "object", "properties": {"lang": {"type": "string"}}},
        on_invoke_handoff=build,
        agent_name="by-language",
    )
    durable = durable_agent(Agent(name="triage", handoffs=[transfer]))
    wrong = []
    for i in range(300):
        got = await durable.handoffs[0].on_invoke_handoff(None, json.dumps({"lang": str(i)}))
        if got.name != f"agent-{i}":
            wrong.append((i, got.name))
    assert wrong == [], f"{len(wrong)} handoffs got another agent, e.g. {wrong[:3]}"


# -- 2. FunctionTool.timeout_seconds: the SDK's timeout is outside the step ------------

RUNS_OF_CHARGE: list[str] = []


@function_tool(timeout=0.2)
async def charge(amount: int) -> str:
    """Charge the card."""
    RUNS_OF_CHARGE.append(f"charge {amount}")  # the side effect, then a slow reply
    await anyio.sleep(2)
    return f"charged {amount}"


@function_tool
def lookup_order(order: str) -> str:
    """Look an order up."""
    EFFECTS.append(f"lookup:{order}")
    return f"{order}: shipped"


async def test_a_tool_call_the_sdk_timed_out_does_not_run_again_on_replay(
    engine: fusee.Engine,
) -> None:
    """``@function_tool(timeout=)`` (``FunctionTool.timeout_seconds``) is the SDK's ``asyncio.wait_for`` AROUND
    ``on_invoke_tool``, i.e. around the step: the timeout cancels the step (nothing is
    journaled), the SDK hands the model its timeout message, and every later replay
    (a crash, an eviction, a park) finds the position empty and runs the charge again,
    each time. On fix/agents the one call c1 charges 3 times in this run."""
    RUNS_OF_CHARGE.clear()
    AGENTS["timeout"] = Agent(
        name="billing",
        tools=[charge, lookup_order],
        model=ScriptedModel(
            [
                [function_call("charge", {"amount": 5}, call_id="c1")],
                [function_call("lookup_order", {"order": "o-1"}, call_id="c2")],
                [assistant_message("done")],
            ]
        ),
    )
    async with engine.worker(config=WorkerConfig(always_replay=True)):
        out = await (await engine.start("rev_oa", "timeout", "charge 5")).result(timeout=30)
    assert out["final"] == "done"
    assert "timed out" in str(out["tools"]["c1"])  # what the model was told, live
    assert RUNS_OF_CHARGE == ["charge 5"], f"one call ran {len(RUNS_OF_CHARGE)} times"


# -- 3. two calls of one tool in a turn: positions follow the tasks' timing ------------


class SlowFirstStart(RunHooks[Any]):
    """A hook that awaits real I/O (an audit POST, a metrics push...): the first time,
    call c2's takes longer. The docs say hooks "must be deterministic": this one is,
    in what it does; only its latency varies, as any network call's does."""

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        call_id = getattr(context, "tool_call_id", None)
        if call_id == "c2" and call_id not in SLOWED:
            SLOWED.add(call_id)
            await anyio.sleep(0.1)


async def test_parallel_calls_of_one_tool_keep_their_own_results_after_a_replay(
    engine: fusee.Engine,
) -> None:
    """Tool steps take positions in the order the SDK's tasks reach them, and a replay
    matches a position by step NAME only. Live, c3 reached its step first (c2's hook
    was slower); on replay c2 does, takes c3's journaled result, and c3 takes c2's: no
    DeterminismError (both are ``tool:lookup_order``), the run completes with the
    answers swapped. design.md's Known gaps calls this "a determinism pause, not a
    wrong result"; for two calls of one tool it is a wrong result."""
    SLOWED.clear()
    AGENTS["swap"] = Agent(
        name="support",
        tools=[lookup_order],
        model=ScriptedModel(
            [
                [
                    function_call("lookup_order", {"order": "o-1"}, call_id="c2"),
                    function_call("lookup_order", {"order": "o-2"}, call_id="c3"),
                ],
                [assistant_message("done")],
            ]
        ),
    )
    async with engine.worker(config=WorkerConfig(always_replay=True)):
        out = await (await engine.start("rev_oa", "swap", "where are o-1, o-2")).result(timeout=30)
    assert out["tools"] == {"c2": "o-1: shipped", "c3": "o-2: shipped"}


# -- 4. run() on the seed's agent: the OpenAI client's own retries are on ---------------


@fusee.workflow("rev_oa_default_client")
async def default_client(ctx: fusee.Context, question: str) -> Any:
    # the seed's agent: no model (the SDK's default), no client of the user's
    agent = Agent(name="support", instructions="Help with orders.")
    retry = fusee.Retry(attempts=2, initial=0.01, max=0.02)
    try:
        await run(ctx, agent, question, model_options={"retry": retry})
    except Exception as e:  # noqa: BLE001 - the step failed for good: what we count
        return type(e).__name__
    return "answered"


async def test_run_on_the_seeds_agent_makes_one_request_per_attempt(
    engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task: "SDK retries off inside the step (AsyncOpenAI max_retries=0)".
    ``durable_agent(agent)`` gives a model name a client with ``max_retries=0``, but
    ``run(ctx, agent, ...)``, the issue's entry point, resolves the agent's model
    through the run's default ``MultiProvider``, whose ``AsyncOpenAI`` keeps the
    client's default ``max_retries=2``: each fusee attempt is 3 requests with the
    client's in-memory backoff (what Temporal's default provider turns off). On
    fix/agents the fake server gets 6 requests for 2 attempts."""
    from tests.fakes.agents_server import AgentsFake
    from tests.fakes.openai_server import Reply

    with AgentsFake([Reply("never sent")]) as fake:
        fake.down.set()  # every request a 500
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        async with engine.worker():
            run_ = await engine.start("rev_oa_default_client", "client", "hi")
            assert await run_.result(timeout=30) != "answered"
        assert len(fake.snapshot()) == 2, f"{len(fake.snapshot())} requests for 2 attempts"


# -- 5. docs/openai-agents.md: "Call ctx.step in them [hooks]" ---------------------------

AUDITS: list[str] = []


class AuditedStart(RunHooks[Any]):
    """What docs/openai-agents.md tells a user to do with a hook that is not
    deterministic: "Call ``ctx.step`` in them". ``on_tool_start`` runs in the SDK's
    tool tasks, outside ``concurrent_calls``: two of a turn's hooks commit at once
    (unlocked: the fence), and each tool's position now follows its hook's step's
    timing (live) or none (replay)."""

    def __init__(self, ctx: fusee.Context) -> None:
        self.ctx = ctx

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        call_id = context.tool_call_id

        def audit() -> str:
            AUDITS.append(call_id)
            return call_id

        await self.ctx.step(f"audit:{call_id}", audit)


@pytest.mark.parametrize("attempt", range(8))
async def test_a_hook_that_calls_ctx_step_as_the_docs_say(
    engine: fusee.Engine, attempt: int
) -> None:
    """Eight runs (an ordinary in-process worker, no always-replay): each must end
    with each call's own result, each tool and each audit run once. On fix/agents all
    8 fence (``actor.fenced``: the two audits' commits are not under the commit lock,
    the same fault ``concurrent_calls`` fixed for the tool steps alone), replay, and
    run the second audit step twice; the tool positions then follow the audits'
    timing (see test 3)."""
    EFFECTS.clear()
    AUDITS.clear()
    run_id = f"audit-{attempt}"
    AGENTS[run_id] = Agent(
        name="support",
        tools=[lookup_order],
        model=ScriptedModel(
            [
                [
                    function_call("lookup_order", {"order": "o-1"}, call_id="c2"),
                    function_call("lookup_order", {"order": "o-2"}, call_id="c3"),
                ],
                [assistant_message("done")],
            ]
        ),
    )
    async with engine.worker():
        out = await (await engine.start("rev_oa", run_id, "o-1, o-2?")).result(timeout=30)
    assert out["tools"] == {"c2": "o-1: shipped", "c3": "o-2: shipped"}
    assert sorted(EFFECTS) == ["lookup:o-1", "lookup:o-2"]
    assert sorted(AUDITS) == ["c2", "c3"]


# -- 6. a guardrail's output_info comes back as a dict ---------------------------------

from agents import (  # noqa: E402
    GuardrailFunctionOutput,
    InputGuardrailTripwireTriggered,
    input_guardrail,
)
from pydantic import BaseModel  # noqa: E402


class Verdict(BaseModel):
    is_homework: bool
    reasoning: str


@input_guardrail
async def homework(ctx: Any, agent: Any, text: Any) -> GuardrailFunctionOutput:
    verdict = Verdict(is_homework=True, reasoning="asks for an essay")
    return GuardrailFunctionOutput(output_info=verdict, tripwire_triggered=True)


@fusee.workflow("rev_oa_guard")
async def guarded(ctx: fusee.Context, question: str) -> Any:
    try:
        await run(ctx, AGENTS[ctx.run_id], question)
    except InputGuardrailTripwireTriggered as e:
        return e.guardrail_result.output.output_info.reasoning  # the SDK docs' pattern
    return "ran"


async def test_a_guardrails_output_info_keeps_its_type(engine: fusee.Engine) -> None:
    """The SDK docs' guardrail returns a pydantic model as ``output_info`` and the
    caller reads its fields. The durable guardrail hands back the journaled JSON (a
    dict), live and on replay: ``.reasoning`` is an AttributeError and the run fails.
    "Guardrails keep working" (the task) is not true for this, the docs' own example."""
    AGENTS["guard"] = Agent(
        name="tutor", input_guardrails=[homework], model=ScriptedModel([[assistant_message("x")]])
    )
    async with engine.worker():
        out = await (await engine.start("rev_oa_guard", "guard", "write my essay")).result(
            timeout=30
        )
    assert out == "asks for an essay"
