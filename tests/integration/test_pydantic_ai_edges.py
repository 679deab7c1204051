"""fusee.ai.pydantic at its edges (the review of issue 14): agents sharing a stream
prefix, a run's timeout= across a park, approvals (cancel, two at once, approve_timeout),
step options reaching the steps (tools, the event handler's, the model's non-retryable
errors), a response stored on its stream's end marker."""

from __future__ import annotations

import collections
import time
from typing import Any

import anyio
import pytest
from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.messages import (
    FunctionToolCallEvent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import fusee
from fusee.ai.pydantic import FuseeDurability, run
from fusee.errors import InvalidToken, RunFailed
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.workers.procs import wait_until

CALLS: collections.Counter[str] = collections.Counter()
EFFECTS: list[str] = []
TOKENS: list[str] = []
ACTIVE = {"now": 0, "max": 0}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    CALLS.clear()
    EFFECTS.clear()
    TOKENS.clear()
    ACTIVE.update(now=0, max=0)


def tool_results(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        p for m in messages if isinstance(m, ModelRequest) for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]  # fmt: skip


# -- 1. two agents with the same stream_prefix: the second gets the first's answer ----------


def streaming(word: str) -> Any:
    async def fn(messages: list[ModelMessage], info: AgentInfo) -> Any:
        CALLS[word] += 1
        yield word

    return fn


alpha = Agent(
    FunctionModel(stream_function=streaming("alpha")),
    name="alpha",
    capabilities=[FuseeDurability(stream_prefix="chat")],
)
beta = Agent(
    FunctionModel(stream_function=streaming("beta")),
    name="beta",
    capabilities=[FuseeDurability(stream_prefix="chat")],
)


@fusee.workflow("pyde_prefix")
async def prefix_wf(ctx: fusee.Context) -> list[str]:
    async def go(agent: Agent[None, str]) -> str:
        async with agent.run_stream("hi") as result:
            return await result.get_output()

    first = await run(ctx, lambda: go(alpha))
    second = await run(ctx, lambda: go(beta))
    return [first, second]


async def test_two_agents_sharing_a_stream_prefix_each_get_their_own_answer(
    engine: fusee.Engine,
) -> None:
    # The streams are counted per stream name (chat/0 is alpha's, chat/1 beta's), and
    # a step takes a stored response only from an end marker naming that step: beta
    # never takes alpha's answer.
    async with engine.worker():
        r = await engine.start("pyde_prefix", "p", None)
        with anyio.fail_after(20):
            out = await r.result()
        texts = ["".join([t async for t in r.stream(f"chat/{n}")]) for n in (0, 1)]
    assert CALLS["beta"] == 1, "beta's model was never asked"
    assert out == ["alpha", "beta"]
    assert texts == ["alpha", "beta"]


# -- 2. agent.run(timeout=) counts from the run's journaled start -------------------------

ASKED: list[str] = []


def one_refund(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    CALLS["model"] += 1
    done = tool_results(messages)
    if not done:
        return ModelResponse(parts=[ToolCallPart("refund", {"amount": 5}, tool_call_id="r1")])
    return ModelResponse(parts=[TextPart(f"refund: {done[0].content}")])


def refund(amount: int) -> str:
    """Refund."""
    EFFECTS.append("refund")
    return f"refunded {amount}"


timed = Agent(
    FunctionModel(one_refund),
    name="timed",
    tools=[Tool(refund, requires_approval=True)],
    capabilities=[FuseeDurability(approve=lambda cb: ASKED.append(cb.token))],
)

TIMEOUT = 3.0


@fusee.workflow("pyde_timeout")
async def timeout_wf(ctx: fusee.Context) -> str:
    return (await run(ctx, lambda: timed.run("refund", timeout=TIMEOUT))).output


async def test_a_run_timeout_survives_a_park(engine: fusee.Engine) -> None:
    # Pydantic AI: "Inside a durable workflow ... the durability capability supplies a
    # replay-safe clock and start time, so a replayed or recovered run keeps the deadline
    # it started with" (get_run_clock / get_run_start_time; Temporal: workflow.now, DBOS
    # and Prefect: a journaled start). A run that waits for an approval leaves memory
    # after park_after (1 s), its live timer with it; the replay the answer starts
    # counts the deadline from the journaled start (ctx.now()), not its own now, so it
    # times out at once instead of running the refund after the deadline.
    ASKED.clear()
    async with engine.worker():
        r = await engine.start("pyde_timeout", "t", None)
        await wait_until(lambda: ASKED, timeout=10, what="the ask")
        started = time.monotonic()
        await wait_until(lambda: time.monotonic() - started > 1.5 * TIMEOUT, timeout=20,
                         what="the deadline to pass")  # fmt: skip
        try:
            await engine.complete(ASKED[0], True)
        except InvalidToken:
            pass  # the run already ended: its deadline passed
        with anyio.fail_after(20), pytest.raises(RunFailed):
            await r.result()  # the run timed out while it waited
    assert EFFECTS == [], "the refund ran after the run's deadline"


async def test_a_run_answered_before_its_deadline_finishes_after_a_park(
    engine: fusee.Engine,
) -> None:
    # the journaled start replays as it was: a run parked (and replayed) well within its
    # timeout= finishes
    ASKED.clear()
    async with engine.worker():
        r = await engine.start("pyde_timeout_long", "tl", None)
        await wait_until(lambda: ASKED, timeout=10, what="the ask")

        async def parked() -> bool:
            return (await r.describe()).status == "waiting"

        await wait_until(parked, timeout=10, what="the run to park")
        await engine.complete(ASKED[0], True)
        with anyio.fail_after(20):
            assert await r.result() == "refund: refunded 5"
    assert EFFECTS == ["refund"]
    values = [v.kind for _, rec in await r.journal() for v in (getattr(rec, "values", None) or [])]
    assert values == ["now"], "the run's start is journaled once"


@fusee.workflow("pyde_timeout_long")
async def timeout_long_wf(ctx: fusee.Context) -> str:
    return (await run(ctx, lambda: timed.run("refund", timeout=600))).output


# -- 3. cancelling a run parked on an approval --------------------------------------------


@fusee.workflow("pyde_cancel")
async def cancel_wf(ctx: fusee.Context) -> str:
    return (await run(ctx, lambda: timed.run("refund"))).output


async def test_cancel_while_parked_on_an_approval(engine: fusee.Engine) -> None:
    ASKED.clear()
    async with engine.worker():
        r = await engine.start("pyde_cancel", "c", None)
        await wait_until(lambda: ASKED, timeout=20, what="the ask")
        assert await r.cancel("no longer needed")
        with anyio.fail_after(20), pytest.raises(RunFailed):
            await r.result()
        # a completion after the cancel is refused or ignored: the refund never runs
        try:
            await engine.complete(ASKED[0], True)
        except fusee.errors.FuseeError:
            pass
    assert EFFECTS == []


# -- 4. two approvals of one response; approve_timeout ------------------------------------


def two_refunds(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = tool_results(messages)
    if not done:
        return ModelResponse(
            parts=[
                ToolCallPart("refund", {"amount": 1}, tool_call_id="q1"),
                ToolCallPart("refund", {"amount": 2}, tool_call_id="q2"),
            ]
        )
    return ModelResponse(parts=[TextPart(" | ".join(sorted(str(p.content) for p in done)))])


double = Agent(
    FunctionModel(two_refunds),
    name="double",
    tools=[Tool(refund, requires_approval=True)],
    capabilities=[FuseeDurability(approve=lambda cb: ASKED.append(cb.token))],
)
lapsing = Agent(
    FunctionModel(one_refund),
    name="lapsing",
    tools=[Tool(refund, requires_approval=True)],
    capabilities=[FuseeDurability(approve=lambda cb: ASKED.append(cb.token), approve_timeout=0.5)],
)


@fusee.workflow("pyde_double")
async def double_wf(ctx: fusee.Context, which: str) -> str:
    agent = double if which == "double" else lapsing
    return (await run(ctx, lambda: agent.run("refund"))).output


async def test_two_approvals_of_one_response(engine: fusee.Engine) -> None:
    ASKED.clear()
    async with engine.worker():
        r = await engine.start("pyde_double", "d", "double")
        await wait_until(lambda: len(ASKED) == 2, timeout=20, what="both asks")
        await engine.complete(ASKED[0], True)
        await engine.complete(ASKED[1], {"approved": False, "reason": "no"})
        with anyio.fail_after(20):
            out = await r.result()
    assert EFFECTS == ["refund"]
    assert "refunded" in out
    assert "not approved" in out


async def test_approve_timeout_denies(engine: fusee.Engine) -> None:
    ASKED.clear()
    async with engine.worker():
        r = await engine.start("pyde_double", "l", "lapsing")
        with anyio.fail_after(20):
            out = await r.result()
    assert EFFECTS == []
    assert "not approved in time" in out


# -- 5. tool_options and metadata["fusee"] reach the tool's step -----------

FLAKY = collections.Counter[str]()


def flaky_turns(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = tool_results(messages)
    if not done:
        return ModelResponse(parts=[ToolCallPart("flaky", {}, tool_call_id="f1")])
    return ModelResponse(parts=[TextPart(str(done[0].content))])


def flaky() -> str:
    """Fails its first attempt."""
    FLAKY["n"] += 1
    if FLAKY["n"] == 1:
        raise ConnectionError("flaky")
    return "ok"


RETRY3 = fusee.Retry(attempts=3, initial=0.01, max=0.01)
retried = Agent(
    FunctionModel(flaky_turns), name="retried", tools=[flaky],
    capabilities=[FuseeDurability(tool_options={"retry": RETRY3})],
)  # fmt: skip
strict = Agent(
    FunctionModel(flaky_turns), name="strict",
    tools=[Tool(flaky, metadata={"fusee": {"retry": fusee.Retry(attempts=1)}})],
    capabilities=[FuseeDurability(tool_options={"retry": RETRY3})],
)  # fmt: skip


@fusee.workflow("pyde_opts")
async def opts_wf(ctx: fusee.Context, which: str) -> str:
    agent = retried if which == "retried" else strict
    return (await run(ctx, lambda: agent.run("go"))).output


async def test_tool_options_and_metadata_reach_the_step(engine: fusee.Engine) -> None:
    FLAKY.clear()
    async with engine.worker():
        r = await engine.start("pyde_opts", "o1", "retried")
        with anyio.fail_after(20):
            assert await r.result() == "ok"  # tool_options' retry retried it
        FLAKY.clear()
        r = await engine.start("pyde_opts", "o2", "strict")
        with anyio.fail_after(20), pytest.raises(RunFailed):
            await r.result()  # metadata's attempts=1 did not
    assert FLAKY["n"] == 1


# -- 6. a streamed response stored on its end marker is not asked again ---
# The attempt here fails right after its end marker is stored, as a worker dying
# before the commit would.


class _DieAfterEnd:
    def __init__(self, writer: Any) -> None:
        self._w = writer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)

    async def end(self, final: Any = None) -> None:
        await self._w.end(final)
        if not CALLS["died"]:
            CALLS["died"] += 1
            raise ConnectionError("the worker died before the step's commit")


async def once_streamed(messages: list[ModelMessage], info: AgentInfo) -> Any:
    CALLS["model"] += 1
    yield "the answer"


ender = Agent(
    FunctionModel(stream_function=once_streamed),
    name="ender",
    capabilities=[
        FuseeDurability(model_options={"retry": fusee.Retry(attempts=2, initial=0.01, max=0.01)})
    ],
)


@fusee.workflow("pyde_ender")
async def ender_wf(ctx: fusee.Context) -> str:
    async def go() -> str:
        async with ender.run_stream("q") as result:
            return await result.get_output()

    return await run(ctx, go)


async def test_a_response_on_its_end_marker_is_not_asked_again(
    engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fusee.actors.context import token_stream as real

    class Stream:
        def __init__(self, ctx: Any, name: str) -> None:
            self._s = real(ctx, name)

        async def open(self) -> Any:
            return _DieAfterEnd(await self._s.open())

    # the seam the adapter opens its streams through
    monkeypatch.setattr("fusee.ai.pydantic.token_stream", Stream)
    async with engine.worker():
        r = await engine.start("pyde_ender", "e", None)
        with anyio.fail_after(20):
            assert await r.result() == "the answer"
    assert CALLS["died"] == 1
    assert CALLS["model"] == 1  # the second attempt took the stored response


# -- 7. the event handler's steps take event_options, not the model's --------------------

HANDLER_FAILS = collections.Counter[str]()


async def call_then_answer(messages: list[ModelMessage], info: AgentInfo) -> Any:
    if not tool_results(messages):
        yield {0: DeltaToolCall(name="refund", json_args='{"amount": 3}', tool_call_id="e1")}
        return
    yield "done"


async def fails_once(ctx: RunContext[None], events: Any) -> None:
    async for event in events:
        if isinstance(event, FunctionToolCallEvent) and not HANDLER_FAILS["n"]:
            HANDLER_FAILS["n"] += 1
            raise ConnectionError("the UI's socket dropped")


ONCE = fusee.Retry(attempts=1)
FAST = fusee.Retry(attempts=3, initial=0.01, max=0.01)


def handler_agent(name: str, **options: Any) -> Agent[None, str]:
    durability = FuseeDurability[None](event_stream_handler=fails_once, **options)
    return Agent(
        FunctionModel(stream_function=call_then_answer),
        name=name,
        tools=[refund],
        capabilities=[durability],
    )


handlers = {
    # the model's attempts=1 does not reach the handler's step: its retry is the default
    "default": handler_agent("handler_default", model_options={"retry": ONCE}),
    "once": handler_agent(
        "handler_once", model_options={"retry": FAST}, event_options={"retry": ONCE}
    ),
}


@fusee.workflow("pyde_handler")
async def handler_wf(ctx: fusee.Context, which: str) -> str:
    return (await run(ctx, lambda: handlers[which].run("go"))).output


async def test_the_event_handler_takes_event_options_not_the_models(
    engine: fusee.Engine,
) -> None:
    HANDLER_FAILS.clear()
    async with engine.worker():
        r = await engine.start("pyde_handler", "hd", "default")
        with anyio.fail_after(20):
            assert await r.result() == "done"  # retried, though the model's attempts=1
        HANDLER_FAILS.clear()
        r = await engine.start("pyde_handler", "ho", "once")
        with anyio.fail_after(20), pytest.raises(RunFailed, match="socket dropped"):
            await r.result()  # event_options' attempts=1: failed at once
    assert HANDLER_FAILS["n"] == 1


# -- 8. a rejected model request fails the run, also under on_exhausted="pause" -----------

REJECTED: dict[str, Agent[None, str]] = {}


@fusee.workflow("pyde_rejected")
async def rejected_wf(ctx: fusee.Context, key: str) -> str:
    return (await run(ctx, lambda: REJECTED[key].run("hi"))).output


@pytest.mark.parametrize("override", [False, True])
async def test_a_rejected_request_fails_instead_of_pausing(
    engine: fusee.Engine, override: bool
) -> None:
    # A 400 (Pydantic AI's ModelRequestRejectedError) is asked again in vain: the model
    # step fails at once, as Temporal's integration does; non_retryable_model_errors=()
    # gives the step's policy back its say (here: pause after 3 attempts).
    pause = fusee.Retry(attempts=3, initial=0.01, max=0.01, on_exhausted="pause")
    extra: dict[str, Any] = {"non_retryable_model_errors": ()} if override else {}
    with FakeOpenAI(replies=[Reply(status=400)] * 3, delay=0.0) as fake:
        provider = OpenAIProvider(base_url=fake.base_url, api_key="test")
        key = f"rej-{override}"
        REJECTED[key] = Agent(
            OpenAIChatModel("fake-gpt", provider=provider),
            name="rejected",
            capabilities=[FuseeDurability(model_options={"retry": pause}, **extra)],
        )
        async with engine.worker():
            r = await engine.start("pyde_rejected", key, key)
            if override:

                async def paused() -> bool:
                    return (await r.describe()).status == "paused"

                await wait_until(paused, timeout=20, what="the pause")
                assert len(fake.snapshot()) == 3
            else:
                with anyio.fail_after(20), pytest.raises(RunFailed, match="RequestRejected"):
                    await r.result()
                assert len(fake.snapshot()) == 1  # asked once, not again


# -- 9. agent.override(model=...) in a test: the same step names ---------------------------


def overridden_reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    CALLS["override"] += 1
    return ModelResponse(parts=[TextPart("from the override")])


SCRIPTED = FunctionModel(overridden_reply)
production = Agent(
    "openai:gpt-5", name="prod", capabilities=[FuseeDurability(models={"scripted": SCRIPTED})]
)


@fusee.workflow("pyde_override")
async def override_wf(ctx: fusee.Context) -> str:
    return (await run(ctx, lambda: production.run("hi"))).output


async def test_agent_override_swaps_the_model_in_a_workflow(engine: fusee.Engine) -> None:
    # a test swaps the production model for a scripted one registered in models=
    # (a Model instance cannot cross the step boundary: an unregistered one is refused)
    with production.override(model=SCRIPTED):
        async with engine.worker():
            r = await engine.start("pyde_override", "ov", None)
            with anyio.fail_after(20):
                assert await r.result() == "from the override"
            names = [rec.name for _, rec in await r.journal() if hasattr(rec, "name")]
    assert CALLS["override"] == 1
    assert "prod__model.request.scripted" in names, names


# -- 10. two agents at once: child workflows (docs/pydantic-ai.md) ------------------------


def answers(word: str) -> Any:
    def fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        CALLS[word] += 1
        return ModelResponse(parts=[TextPart(word)])

    return fn


researcher = Agent(FunctionModel(answers("notes")), name="researcher",
                   capabilities=[FuseeDurability()])  # fmt: skip
checker = Agent(FunctionModel(answers("facts")), name="checker",
                capabilities=[FuseeDurability()])  # fmt: skip


@fusee.workflow("pyde_research")
async def research_wf(ctx: fusee.Context, topic: str) -> str:
    return (await run(ctx, lambda: researcher.run(topic))).output


@fusee.workflow("pyde_check")
async def check_wf(ctx: fusee.Context, topic: str) -> str:
    return (await run(ctx, lambda: checker.run(topic))).output


@fusee.workflow("pyde_report")
async def report_wf(ctx: fusee.Context, topic: str) -> list[str]:
    got = await ctx.all(
        [
            ctx.child("pyde_research", f"{ctx.run_id}-notes", topic),
            ctx.child("pyde_check", f"{ctx.run_id}-facts", topic),
        ]
    )
    return list(got)


async def test_two_agents_at_once_as_child_workflows(engine: fusee.Engine) -> None:
    async with engine.worker():
        r = await engine.start("pyde_report", "rep", "tides")
        with anyio.fail_after(20):
            assert await r.result() == ["notes", "facts"]
        child = [n for _, rec in await engine.run("rep-notes").journal()
                 if (n := getattr(rec, "name", None))]  # fmt: skip
    assert CALLS["notes"] == CALLS["facts"] == 1
    assert "researcher__model.request" in child
