"""``fusee.ai.openai`` (issue 14): the OpenAI Agents SDK's ``Runner.run`` made durable,
in an in-process worker with the SDK's own ``agents.testing.ScriptedModel``.

Model calls are steps ``model``, function tools ``tool:<name>`` (``idempotency_key()``
``<step key>-<call id>``), guardrails ``guardrail:<name>``; handoffs are made durable
too; tools that cannot be are refused; outside a workflow the agent is ordinary.
Each test also passes under ``FUSEE_ALWAYS_REPLAY=1`` (every step replayed): the
model's ``calls`` then show it was never asked again for a journaled response.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import msgspec
import pytest
from agents import (
    Agent,
    ComputerTool,
    GuardrailFunctionOutput,
    InputGuardrailTripwireTriggered,
    Runner,
    function_tool,
    handoff,
    input_guardrail,
    set_tracing_disabled,
)
from agents.testing import ScriptedModel, assistant_message, function_call

import fusee
from fusee.ai.openai import durable_agent, idempotency_key, run, run_streamed
from fusee.runtime.records import StepCompleted
from tests.workers.procs import wait_until

pytestmark = pytest.mark.timeout(60)

set_tracing_disabled(True)

MODELS: dict[str, ScriptedModel] = {}  # run ID -> its agent's model
AGENTS: dict[str, Agent[Any]] = {}  # run ID -> the agent its workflow runs
EFFECTS: list[tuple[str, str]] = []  # (what, idempotency key), in the order they ran


@function_tool
def lookup_order(order: str) -> str:
    """Look an order up."""
    EFFECTS.append((f"lookup:{order}", idempotency_key()))
    return f"{order}: shipped"


# run ID -> engine: refund waits in that run until the second lookup's step is
# journaled, so its own step ends after the one the model asked for next
REFUND_AFTER_LOOKUP: dict[str, fusee.Engine] = {}


async def _second_lookup_journaled(engine: fusee.Engine, run_id: str) -> bool:
    records = await engine.run(run_id).journal()
    done = [r for _, r in records if isinstance(r, StepCompleted)]
    return sum(r.name == "tool:lookup_order" for r in done) >= 2


@function_tool
async def refund(order: str, amount: int) -> str:
    """Refund part of an order."""
    for run_id, engine in REFUND_AFTER_LOOKUP.items():
        await wait_until(
            functools.partial(_second_lookup_journaled, engine, run_id),
            timeout=10,
            what="the lookup beside the refund journaled",
        )
    EFFECTS.append((f"refund:{order}", idempotency_key()))
    return f"refunded {amount} on {order}"


def support_agent(model: ScriptedModel, **kw: Any) -> Agent[Any]:
    return Agent(
        name="support", instructions="Help.", tools=[lookup_order, refund], model=model, **kw
    )


TWO_TURNS = [
    [function_call("lookup_order", {"order": "o-1"}, call_id="c1")],
    [
        function_call("refund", {"order": "o-1", "amount": 3}, call_id="c2"),
        function_call("lookup_order", {"order": "o-2"}, call_id="c3"),
    ],
    [assistant_message("Refunded 3 on o-1.")],
]


@fusee.workflow("oa_support")
async def support(ctx: fusee.Context, question: str) -> Any:
    result = await run(ctx, AGENTS[ctx.run_id], question)
    return result.final_output


async def completed(engine: fusee.Engine, run_id: str) -> list[tuple[str, Any]]:
    """The run's completed steps, in position order (the journal's is the order they
    ended in), and their results."""
    done = [r for _, r in await engine.run(run_id).journal() if isinstance(r, StepCompleted)]
    return [
        (r.name, msgspec.json.decode(bytes(r.result))) for r in sorted(done, key=lambda r: r.pos)
    ]


async def test_model_calls_and_tools_are_steps_and_parallel_calls_keep_their_positions(
    engine: fusee.Engine,
) -> None:
    model = ScriptedModel(TWO_TURNS)
    AGENTS["r1"] = support_agent(model)
    EFFECTS.clear()
    REFUND_AFTER_LOOKUP["r1"] = engine
    try:
        async with engine.worker():
            run_ = await engine.start("oa_support", "r1", "refund o-1")
            assert await run_.result(timeout=20) == "Refunded 3 on o-1."
    finally:
        REFUND_AFTER_LOOKUP.clear()
    steps = await completed(engine, "r1")
    # the pinned names: the model's calls, then each tool call in the model's order
    # (refund ends after the lookup beside it, its step still comes first)
    assert [n for n, _ in steps] == [
        "model",
        "tool:lookup_order",
        "model",
        "tool:refund",
        "tool:lookup_order",
        "model",
    ]
    # each tool step journals its call's ID beside its result (a replay checks it)
    assert steps[3][1] == {"call_id": "c2", "output": "refunded 3 on o-1"}
    assert steps[4][1] == {"call_id": "c3", "output": "o-2: shipped"}
    # refund's step ended after the lookup's beside it: positions are the model's order
    ended = [r.name for _, r in await run_.journal() if isinstance(r, StepCompleted)]
    assert ended[3:5] == ["tool:lookup_order", "tool:refund"]
    assert len(model.calls) == 3  # never asked again for a journaled response
    keys = dict(EFFECTS)
    assert sorted(keys) == ["lookup:o-1", "lookup:o-2", "refund:o-1"]
    assert re.fullmatch("[0-9a-f]{32}-c2", keys["refund:o-1"])
    assert len({k.split("-")[0] for k in keys.values()}) == 3  # each its own step


async def test_outside_a_workflow_the_durable_agent_is_ordinary() -> None:
    model = ScriptedModel(TWO_TURNS)
    durable = durable_agent(support_agent(model))
    result = await Runner.run(durable, "refund o-1")
    assert result.final_output == "Refunded 3 on o-1."
    assert len(model.calls) == 3
    with pytest.raises(fusee.ConfigError, match="not inside a durable tool call"):
        idempotency_key()


@fusee.workflow("oa_handoff")
async def handoffs(ctx: fusee.Context, question: str) -> Any:
    result = await run(ctx, AGENTS[ctx.run_id], question)
    return [result.final_output, result.last_agent.name]


async def test_handoffs_are_made_durable(engine: fusee.Engine) -> None:
    refunds_model = ScriptedModel(
        [
            [function_call("refund", {"order": "o-9", "amount": 5}, call_id="r1")],
            [assistant_message("Refund done.")],
        ]
    )
    refunds = Agent(name="refunds", tools=[refund], model=refunds_model)
    billing = Agent(name="billing", model=ScriptedModel([]))
    triage_model = ScriptedModel([[function_call("transfer_to_refunds", {}, call_id="h1")]])
    triage = Agent(name="triage", handoffs=[handoff(refunds), billing], model=triage_model)
    billing.handoffs = [triage]  # a cycle
    AGENTS["h1"] = triage
    async with engine.worker():
        run_ = await engine.start("oa_handoff", "h1", "refund o-9")
        assert await run_.result(timeout=20) == ["Refund done.", "refunds"]
    assert [n for n, _ in await completed(engine, "h1")] == [
        "model",
        "model",
        "tool:refund",
        "model",
    ]
    assert (len(triage_model.calls), len(refunds_model.calls)) == (1, 2)


@input_guardrail
async def no_swearing(ctx: Any, agent: Any, text: Any) -> GuardrailFunctionOutput:
    EFFECTS.append(("guard", str(text)))
    return GuardrailFunctionOutput(output_info={"checked": True}, tripwire_triggered="darn" in text)


@fusee.workflow("oa_guarded")
async def guarded(ctx: fusee.Context, question: str) -> Any:
    try:
        result = await run(ctx, AGENTS[ctx.run_id], question)
    except InputGuardrailTripwireTriggered as e:
        return f"tripped: {e.guardrail_result.output.output_info}"
    return result.final_output


async def test_guardrails_are_steps_and_trip_as_before(engine: fusee.Engine) -> None:
    EFFECTS.clear()
    AGENTS["g1"] = support_agent(
        ScriptedModel([[assistant_message("hello")]]), input_guardrails=[no_swearing]
    )
    AGENTS["g2"] = support_agent(
        ScriptedModel([[assistant_message("never read")]]), input_guardrails=[no_swearing]
    )
    async with engine.worker():
        ok = await engine.start("oa_guarded", "g1", "hi")
        bad = await engine.start("oa_guarded", "g2", "darn it")
        assert await ok.result(timeout=20) == "hello"
        assert await bad.result(timeout=20) == "tripped: {'checked': True}"
    names = sorted(n for n, _ in await completed(engine, "g1"))
    assert names == ["guardrail:no_swearing", "model"]
    assert ("guardrail:no_swearing", {"info": {"checked": True}, "tripped": True}) in (
        await completed(engine, "g2")
    )
    assert sorted(EFFECTS) == [("guard", "darn it"), ("guard", "hi")]  # once each


@fusee.workflow("oa_refused")
async def refused(ctx: fusee.Context, arg: Any) -> Any:
    try:
        await run(ctx, AGENTS[ctx.run_id], "go", session=arg)
    except fusee.ConfigError as e:
        return str(e)
    return "ran"


async def test_tools_that_cannot_be_durable_are_refused_by_name(engine: fusee.Engine) -> None:
    class Screen:
        pass

    AGENTS["x1"] = Agent(
        name="ops", tools=[ComputerTool(computer=Screen())], model=ScriptedModel([])
    )
    AGENTS["x2"] = Agent(name="ops", model=ScriptedModel([]))
    async with engine.worker():
        out = await (await engine.start("oa_refused", "x1", None)).result(timeout=20)
        assert "agent 'ops': tool" in out
        assert "ComputerTool, which runs local code outside any step" in out
        out = await (await engine.start("oa_refused", "x2", "a-session")).result(timeout=20)
        assert "session= keeps the conversation outside the journal" in out


@fusee.workflow("oa_streamed")
async def streamed(ctx: fusee.Context, question: str) -> Any:
    result = run_streamed(ctx, AGENTS[ctx.run_id], question)
    kinds = [e.type async for e in result.stream_events()]
    return [result.final_output, len(kinds) > 0]


async def test_run_streamed_writes_the_text_to_a_token_stream(engine: fusee.Engine) -> None:
    model = ScriptedModel(
        [
            [function_call("lookup_order", {"order": "o-1"}, call_id="c1")],
            [assistant_message("o-1 has shipped.")],
        ]
    )
    AGENTS["s1"] = support_agent(model)
    async with engine.worker():
        run_ = await engine.start("oa_streamed", "s1", "where is o-1")
        assert await run_.result(timeout=20) == ["o-1 has shipped.", True]
        text = "".join([t async for t in engine.run("s1").stream("model-1")])
    assert text == "o-1 has shipped."
    assert [n for n, _ in await completed(engine, "s1")] == [
        "model-0",
        "tool:lookup_order",
        "model-1",
    ]
    assert len(model.calls) == 2


@function_tool(needs_approval=True)
def wire(amount: int) -> str:
    """Wire money."""
    EFFECTS.append(("wire", str(amount)))
    return f"wired {amount}"


@fusee.workflow("oa_approve")
async def approve(ctx: fusee.Context, question: str) -> Any:
    def ask(cb: Any, item: Any) -> None:
        TOKENS[ctx.run_id] = (cb.token, item.tool_name)

    result = await run(ctx, AGENTS[ctx.run_id], question, approve=ask)
    return result.final_output


TOKENS: dict[str, tuple[str, str]] = {}  # run ID -> its approval's token and tool


async def test_an_approval_is_a_completion_the_run_parks_on(engine: fusee.Engine) -> None:
    EFFECTS.clear()
    for run_id in ("a1", "a2"):
        AGENTS[run_id] = Agent(
            name="bank",
            tools=[wire],
            model=ScriptedModel(
                [
                    [function_call("wire", {"amount": 7}, call_id="w1")],
                    [assistant_message("finished")],
                ]
            ),
        )
    async with engine.worker():
        yes = await engine.start("oa_approve", "a1", "wire 7")
        no = await engine.start("oa_approve", "a2", "wire 7")
        for run_, answer in ((yes, True), (no, {"approved": False, "reason": "too much"})):
            asked = functools.partial(TOKENS.get, run_.run_id)
            token, tool = await wait_until(asked, timeout=20, what="the approval's ask")
            assert tool == "wire"
            assert await engine.complete(token, answer)
        assert await yes.result(timeout=20) == "finished"
        assert await no.result(timeout=20) == "finished"
    assert EFFECTS == [("wire", "7")]  # approved once, rejected once
    model = AGENTS["a2"].model
    assert isinstance(model, ScriptedModel)
    sent = str(model.calls[-1].input)
    assert "the call was not approved, so it did not run: too much" in sent


async def test_tool_use_behaviour_and_an_agent_as_a_tool(engine: fusee.Engine) -> None:
    """``tool_use_behavior="stop_on_first_tool"`` still ends the run with the tool's
    result; an agent used as a tool is one step, its own model call inside it."""
    EFFECTS.clear()
    stop_model = ScriptedModel([[function_call("lookup_order", {"order": "o-5"}, call_id="s1")]])
    AGENTS["t1"] = support_agent(stop_model, tool_use_behavior="stop_on_first_tool")
    expert_model = ScriptedModel([[assistant_message("o-7 is late")]])
    expert = Agent(name="expert", model=expert_model)
    outer_model = ScriptedModel(
        [
            [function_call("ask_expert", {"input": "o-7?"}, call_id="e1")],
            [assistant_message("The expert says o-7 is late.")],
        ]
    )
    AGENTS["t2"] = Agent(
        name="desk",
        tools=[expert.as_tool(tool_name="ask_expert", tool_description="Ask the expert.")],
        model=outer_model,
    )
    async with engine.worker():
        stop = await engine.start("oa_support", "t1", "where is o-5")
        assert await stop.result(timeout=20) == "o-5: shipped"
        nested = await engine.start("oa_support", "t2", "o-7?")
        assert await nested.result(timeout=20) == "The expert says o-7 is late."
    assert [n for n, _ in await completed(engine, "t1")] == ["model", "tool:lookup_order"]
    assert await completed(engine, "t2") == [
        ("model", (await completed(engine, "t2"))[0][1]),
        ("tool:ask_expert", {"call_id": "e1", "output": "o-7 is late"}),
        ("model", (await completed(engine, "t2"))[2][1]),
    ]
    assert (len(stop_model.calls), len(expert_model.calls), len(outer_model.calls)) == (1, 1, 2)
