"""The reviewed defects of fusee.ai.openai (issue 14, review rev-agents), each the
behaviour a user is promised: parallel calls of one tool keep their own results after
a replay (and a mismatch is a DeterminismError, never a wrong result), a hook may call
``ctx.step``, a tool the SDK timed out is not run again, a built handoff agent is the
one built, the default client does not retry inside a step, a guardrail's
``output_info`` keeps its type, and what cannot be made durable is refused by name.

A replay is forced with ``WorkerConfig(always_replay=True)``: every step boundary
outside a tool phase evicts and replays (a crash, an eviction, a park do the same).
"""

from __future__ import annotations

import dataclasses
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
from tests.workers.procs import wait_until

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
            raw: Any = item.raw_item
            call_id = raw["call_id"] if isinstance(raw, dict) else raw.call_id
            out[call_id] = item.output
    return out


@fusee.workflow("oa_review")
async def wf(ctx: fusee.Context, question: str) -> Any:
    hooks: Any = None
    if ctx.run_id.startswith(("swap", "unordered")):
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
    EARLIER agent (other instructions, tools, model). Before the fix: hundreds of the
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
    built: Any = durable.handoffs[0]
    wrong = []
    for i in range(300):
        got = await built.on_invoke_handoff(None, json.dumps({"lang": str(i)}))
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
    each time. Before the fix the one call c1 charges 3 times in this run."""
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
        out = await (await engine.start("oa_review", "timeout", "charge 5")).result(timeout=30)
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
        out = await (await engine.start("oa_review", "swap", "where are o-1, o-2")).result(
            timeout=30
        )
    assert out["tools"] == {"c2": "o-1: shipped", "c3": "o-2: shipped"}


# -- 4. run() on the seed's agent: the OpenAI client's own retries are on ---------------


@fusee.workflow("oa_review_default_client")
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
            run_ = await engine.start("oa_review_default_client", "client", "hi")
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
        call_id: str = context.tool_call_id

        def audit() -> str:
            AUDITS.append(call_id)
            return call_id

        await self.ctx.step(f"audit:{call_id}", audit)


@pytest.mark.parametrize("attempt", range(8))
async def test_a_hook_that_calls_ctx_step_as_the_docs_say(
    engine: fusee.Engine, attempt: int
) -> None:
    """Eight runs (an ordinary in-process worker, no always-replay): each must end
    with each call's own result, each tool and each audit run once. Before the fix all
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
        out = await (await engine.start("oa_review", run_id, "o-1, o-2?")).result(timeout=30)
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


@fusee.workflow("oa_review_guard")
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
        out = await (await engine.start("oa_review_guard", "guard", "write my essay")).result(
            timeout=30
        )
    assert out == "asks for an essay"


# -- 7. a call outside the turnstile: a swap is a DeterminismError, not a wrong result ---


async def never(_ctx: Any, _params: Any, _call_id: str) -> bool:
    return False


async def test_a_call_that_takes_another_calls_result_is_a_determinism_error(
    engine: fusee.Engine,
) -> None:
    """A callable ``needs_approval`` keeps a tool out of the response's order (the SDK
    may skip its calls, which would hold the later ones up): with the hook's skew the
    replay hands c2's position to c3, and the call ID journaled beside the result
    makes that the run's DeterminismError (a determinism pause), never c2's answer
    given to c3."""
    SLOWED.clear()
    EFFECTS.clear()
    tool = dataclasses.replace(lookup_order, needs_approval=never)
    AGENTS["unordered"] = Agent(
        name="support",
        tools=[tool],
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
        run_ = await engine.start("oa_review", "unordered", "o-1, o-2?")

        async def paused() -> Any:
            info = await run_.describe()
            return info if info.status == "paused" else None

        info = await wait_until(paused, timeout=30, what="the run to pause")
    assert "the journaled step 'tool:lookup_order' is the result of the tool call 'c3'" in (
        info.reason or ""
    )
    assert "but the call 'c2' now takes its position" in (info.reason or "")


# -- 8. what cannot be made durable is refused, by name ---------------------------------


class Editor:
    def create_file(self, op: Any) -> None: ...
    def update_file(self, op: Any) -> None: ...
    def delete_file(self, op: Any) -> None: ...


def _refused_kinds() -> list[tuple[Any, str]]:
    from agents import (
        ApplyPatchTool,
        ComputerTool,
        CustomTool,
        HostedMCPTool,
        LocalShellTool,
        ShellTool,
    )

    async def custom(_ctx: Any, _input: str) -> str:
        return ""

    async def shell(_request: Any) -> str:
        return ""

    mcp: Any = {"type": "mcp", "server_label": "docs", "server_url": "http://mcp.invalid"}
    return [
        (ComputerTool(computer=Editor()), "a ComputerTool, which runs local code"),
        (LocalShellTool(executor=shell), "a LocalShellTool, which runs local code"),
        (
            ShellTool(executor=shell, environment={"type": "local"}),
            "a ShellTool with a local environment",
        ),
        (ApplyPatchTool(editor=Editor()), "an ApplyPatchTool, which runs local code"),
        (CustomTool("raw", "Raw text.", custom), "a CustomTool, which runs local code"),
        (
            HostedMCPTool(tool_config=mcp, on_approval_request=lambda _r: {"approve": True}),
            "a HostedMCPTool with on_approval_request",
        ),
    ]


@pytest.mark.parametrize("index", range(6))
def test_every_tool_kind_that_runs_local_code_is_refused_by_name(index: int) -> None:
    tool, why = _refused_kinds()[index]
    with pytest.raises(fusee.ConfigError) as refused:
        durable_agent(Agent(name="ops", tools=[tool]))
    assert f"agent 'ops': tool {getattr(tool, 'name', type(tool).__name__)!r} is {why}" in str(
        refused.value
    )


def test_an_agent_tool_whose_tool_needs_approval_is_refused_by_name() -> None:
    """The agent tool is one step: the SDK's nested interruption (and its side table
    of nested results) cannot be journaled, and after a replay the run would wait for
    good; refused until that is journaled (design.md, Known gaps)."""

    @function_tool(needs_approval=True)
    def wire(amount: int) -> str:
        """Wire money."""
        return f"wired {amount}"

    treasurer = Agent(name="treasurer", tools=[wire])
    desk = Agent(
        name="desk",
        tools=[treasurer.as_tool(tool_name="ask_treasurer", tool_description="Treasury.")],
    )
    with pytest.raises(fusee.ConfigError) as refused:
        durable_agent(desk)
    assert "tool 'ask_treasurer' runs an agent whose tool(s) ['wire'] need approval" in str(
        refused.value
    )


@fusee.workflow("oa_review_no_approver")
async def no_approver(ctx: fusee.Context, question: str) -> Any:
    try:
        await run(ctx, AGENTS[ctx.run_id], question)
    except fusee.ConfigError as e:
        return str(e)
    return "ran"


async def test_a_call_that_needs_approval_without_approve_is_refused(
    engine: fusee.Engine,
) -> None:
    """``approve=None``: nobody would be told the completion's URL, so the run would
    wait for good; it fails at the interruption, naming the tool."""

    @function_tool(needs_approval=True)
    def wire(amount: int) -> str:
        """Wire money."""
        EFFECTS.append(f"wire:{amount}")
        return f"wired {amount}"

    EFFECTS.clear()
    AGENTS["approver"] = Agent(
        name="treasurer",
        tools=[wire],
        model=ScriptedModel([[function_call("wire", {"amount": 7}, call_id="w1")]]),
    )
    async with engine.worker():
        out = await (await engine.start("oa_review_no_approver", "approver", "wire 7")).result(
            timeout=30
        )
    assert "tool(s) ['wire'] need approval, but run() has no approve=" in out
    assert EFFECTS == []


# -- 9. a dataclass output_info keeps its type too ----------------------------------------


@dataclasses.dataclass
class Flag:
    topic: str


@input_guardrail
async def flagged(ctx: Any, agent: Any, text: Any) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info=Flag(topic="orders"), tripwire_triggered=True)


@fusee.workflow("oa_review_flag")
async def flag_workflow(ctx: fusee.Context, question: str) -> Any:
    try:
        await run(ctx, AGENTS[ctx.run_id], question)
    except InputGuardrailTripwireTriggered as e:
        info = e.guardrail_result.output.output_info
        return [type(info).__name__, info.topic]
    return "ran"


async def test_a_dataclass_output_info_keeps_its_type_after_a_replay(engine: fusee.Engine) -> None:
    AGENTS["flag"] = Agent(
        name="desk", input_guardrails=[flagged], model=ScriptedModel([[assistant_message("x")]])
    )
    async with engine.worker(config=WorkerConfig(always_replay=True)):
        out = await (await engine.start("oa_review_flag", "flag", "hi")).result(timeout=30)
    assert out == ["Flag", "orders"]


# -- 10. group_id and tracing: the run's ID, tracing off --------------------------------

TRACES: list[str] = []


@function_tool
def probe() -> str:
    """Probe the trace the tool runs in."""
    from agents.tracing import get_current_trace

    TRACES.append(type(get_current_trace()).__name__)
    return "probed"


@fusee.workflow("oa_review_grouped")
async def grouped(ctx: fusee.Context, question: str) -> Any:
    agent = Agent(name="support", tools=[probe])  # the SDK's default model, by name
    result = await run(ctx, agent, question)
    return result.final_output


async def test_a_run_traces_nothing_and_keeps_the_sdks_prompt_cache_key(
    engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tracing is off in a durable run (the tool runs in a no-op trace), and the
    durable model answers the SDK's question whether to send its ``prompt_cache_key``
    (derived from ``RunConfig.group_id``, the run's ID) as the wrapped model does: for
    an official OpenAI endpoint yes (it was never sent under fusee before), for the
    fake server no (so that key cannot be seen offline)."""
    from agents import OpenAIResponsesModel
    from openai import AsyncOpenAI

    from fusee.ai.openai import DurableModel
    from tests.fakes.agents_server import AgentsFake
    from tests.fakes.openai_server import Reply

    TRACES.clear()
    script = [Reply(tool_calls=[("p1", "probe", "{}")]), Reply("done")]
    with AgentsFake(script) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        async with engine.worker(config=WorkerConfig(always_replay=True)):
            out = await (await engine.start("oa_review_grouped", "grouped", "hi")).result(
                timeout=30
            )
        assert out == "done"
        local = OpenAIResponsesModel("gpt-5", AsyncOpenAI(base_url=fake.base_url))
        assert DurableModel(local)._supports_default_prompt_cache_key() is False
    assert TRACES == ["NoOpTrace"]
    official = OpenAIResponsesModel("gpt-5", AsyncOpenAI(base_url="https://api.openai.com/v1"))
    assert DurableModel(official)._supports_default_prompt_cache_key() is True


# -- 11. the approvals of one interruption are asked at once -------------------------

ASKED: dict[str, str] = {}


@fusee.workflow("oa_review_approvals")
async def approvals(ctx: fusee.Context, question: str) -> Any:
    def ask(cb: Any, item: Any) -> None:
        ASKED[item.raw_item.call_id] = cb.token

    result = await run(ctx, AGENTS[ctx.run_id], question, approve=ask)
    return [result.final_output, sorted(outputs(result).values())]


async def test_two_calls_that_need_approval_are_asked_at_once(engine: fusee.Engine) -> None:
    """Two calls of one response need approval: both completions' URLs go out before
    anyone answers (``ctx.all``), and each answer reaches its own call."""

    @function_tool(needs_approval=True)
    def wire(amount: int) -> str:
        """Wire money."""
        EFFECTS.append(f"wire:{amount}")
        return f"wired {amount}"

    EFFECTS.clear()
    ASKED.clear()
    AGENTS["approvals"] = Agent(
        name="treasurer",
        tools=[wire],
        model=ScriptedModel(
            [
                [
                    function_call("wire", {"amount": 7}, call_id="w1"),
                    function_call("wire", {"amount": 8}, call_id="w2"),
                ],
                [assistant_message("done")],
            ]
        ),
    )
    async with engine.worker():
        run_ = await engine.start("oa_review_approvals", "approvals", "wire 7 and 8")
        await wait_until(lambda: len(ASKED) == 2 or None, timeout=20, what="both asks")
        assert await engine.complete(ASKED["w2"], {"approved": False, "reason": "no"})
        assert await engine.complete(ASKED["w1"], True)
        final, tools = await run_.result(timeout=30)
    assert final == "done"
    assert EFFECTS == ["wire:7"]
    assert tools == ["the call was not approved, so it did not run: no", "wired 7"]
