"""Repros of the review of fusee.ai.pydantic (branch fix/pydantic, issue 14).

Run: cd <tree> && PYTHONPATH=<tree>/src:<tree> python -m pytest -q -p no:xdist review/rev-pydantic
Each test states what a user expects; it fails on fix/pydantic as reviewed.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import anyio
import pytest
from pydantic_ai import Agent, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from tests.workers.procs import wait_until

import fusee
from fusee.ai.pydantic import FuseeDurability, run
from fusee.errors import InvalidToken, RunFailed

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


@fusee.workflow("rev_pyd_prefix")
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
    # The stream counter is keyed by the step name ("alpha__model.request_stream"), the
    # stream by the prefix ("chat/0"): beta's first streamed step opens alpha's ended
    # stream "chat/0", takes its end marker's response as its own and never asks beta.
    async with engine.worker():
        r = await engine.start("rev_pyd_prefix", "p", None)
        with anyio.fail_after(20):
            out = await r.result()
    assert CALLS["beta"] == 1, "beta's model was never asked"
    assert out == ["alpha", "beta"]


# -- 2. agent.run(timeout=) is measured from each replay's wall clock ---------------------

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


@fusee.workflow("rev_pyd_timeout")
async def timeout_wf(ctx: fusee.Context) -> str:
    return (await run(ctx, lambda: timed.run("refund", timeout=TIMEOUT))).output


async def test_a_run_timeout_survives_a_park(engine: fusee.Engine) -> None:
    # Pydantic AI: "Inside a durable workflow ... the durability capability supplies a
    # replay-safe clock and start time, so a replayed or recovered run keeps the deadline
    # it started with" (get_run_clock / get_run_start_time; Temporal: workflow.now, DBOS
    # and Prefect: a journaled start). FuseeDurability overrides neither: the deadline is
    # a live asyncio timer from the wall clock of whichever replay is running. A run that
    # waits for an approval leaves memory after park_after (1 s); its timer goes with
    # it, and the replay that the answer starts measures a fresh TIMEOUT from its own
    # now: the refund runs hours after the run's deadline. (With TIMEOUT under
    # park_after the live timer fires first and the same workflow fails instead.)
    ASKED.clear()
    async with engine.worker():
        r = await engine.start("rev_pyd_timeout", "t", None)
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


# -- 3. sequential tool calls on every path: run_stream and iter too ---------------------


def two_calls(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not tool_results(messages):
        return ModelResponse(
            parts=[
                ToolCallPart("slow", {"tag": "a"}, tool_call_id="x1"),
                ToolCallPart("slow", {"tag": "b"}, tool_call_id="x2"),
            ]
        )
    return ModelResponse(parts=[TextPart("ok")])


async def two_calls_stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
    if not tool_results(messages):
        yield {0: DeltaToolCall(name="slow", json_args='{"tag": "a"}', tool_call_id="x1")}
        yield {1: DeltaToolCall(name="slow", json_args='{"tag": "b"}', tool_call_id="x2")}
        return
    yield "ok"


async def slow(tag: str) -> str:
    """Count how many calls run at once."""
    ACTIVE["now"] += 1
    ACTIVE["max"] = max(ACTIVE["max"], ACTIVE["now"])
    for _ in range(20):
        await anyio.lowlevel.checkpoint()
    ACTIVE["now"] -= 1
    return tag


par = Agent(
    FunctionModel(two_calls, stream_function=two_calls_stream),
    name="par",
    tools=[slow],
    capabilities=[FuseeDurability()],
)


@fusee.workflow("rev_pyd_paths")
async def paths_wf(ctx: fusee.Context, how: str) -> str:
    async def streamed() -> str:
        async with par.run_stream("go") as result:
            return await result.get_output()

    async def iterated() -> str:
        async with par.iter("go") as agent_run:
            async for _ in agent_run:
                pass
        assert agent_run.result is not None
        return agent_run.result.output

    fn = {"run": lambda: par.run("go"), "run_stream": streamed, "iter": iterated}[how]
    out = await run(ctx, fn)
    return out if isinstance(out, str) else out.output


@pytest.mark.parametrize("how", ["run", "run_stream", "iter"])
async def test_tool_calls_of_a_turn_run_one_at_a_time_on_every_path(
    engine: fusee.Engine, how: str
) -> None:
    async with engine.worker():
        r = await engine.start("rev_pyd_paths", f"h-{how}", how)
        with anyio.fail_after(20):
            assert await r.result() == "ok"
    assert ACTIVE["max"] == 1


# -- 4. cancelling a run parked on an approval --------------------------------------------


@fusee.workflow("rev_pyd_cancel")
async def cancel_wf(ctx: fusee.Context) -> str:
    return (await run(ctx, lambda: timed.run("refund"))).output


async def test_cancel_while_parked_on_an_approval(engine: fusee.Engine) -> None:
    ASKED.clear()
    async with engine.worker():
        r = await engine.start("rev_pyd_cancel", "c", None)
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


# -- 5. two approvals of one response; approve_timeout ------------------------------------


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


@fusee.workflow("rev_pyd_double")
async def double_wf(ctx: fusee.Context, which: str) -> str:
    agent = double if which == "double" else lapsing
    return (await run(ctx, lambda: agent.run("refund"))).output


async def test_two_approvals_of_one_response(engine: fusee.Engine) -> None:
    ASKED.clear()
    async with engine.worker():
        r = await engine.start("rev_pyd_double", "d", "double")
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
        r = await engine.start("rev_pyd_double", "l", "lapsing")
        with anyio.fail_after(20):
            out = await r.result()
    assert EFFECTS == []
    assert "not approved in time" in out


# -- 6. (missing test) tool_options and metadata["fusee"] reach the tool's step -----------
# Passes on fix/pydantic; no test there fails when _tool_options' merge or the tool
# config in _Backend.execute is dropped (checked by mutating both: 23 tests still pass).

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


@fusee.workflow("rev_pyd_opts")
async def opts_wf(ctx: fusee.Context, which: str) -> str:
    agent = retried if which == "retried" else strict
    return (await run(ctx, lambda: agent.run("go"))).output


async def test_tool_options_and_metadata_reach_the_step(engine: fusee.Engine) -> None:
    FLAKY.clear()
    async with engine.worker():
        r = await engine.start("rev_pyd_opts", "o1", "retried")
        with anyio.fail_after(20):
            assert await r.result() == "ok"  # tool_options' retry retried it
        FLAKY.clear()
        r = await engine.start("rev_pyd_opts", "o2", "strict")
        with anyio.fail_after(20), pytest.raises(RunFailed):
            await r.result()  # metadata's attempts=1 did not
    assert FLAKY["n"] == 1


# -- 7. (missing test) a streamed response stored on its end marker is not asked again ---
# Passes on fix/pydantic; no test there fails when _streamed_body's end-marker path
# ("a death before the commit does not ask again") is removed. The attempt here fails
# right after its end marker is stored, as a worker dying before the commit would.


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


@fusee.workflow("rev_pyd_ender")
async def ender_wf(ctx: fusee.Context) -> str:
    async def go() -> str:
        async with ender.run_stream("q") as result:
            return await result.get_output()

    return await run(ctx, go)


async def test_a_response_on_its_end_marker_is_not_asked_again(
    engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fusee.ai.pydantic as adapter

    real = adapter.token_stream

    class Stream:
        def __init__(self, ctx: Any, name: str) -> None:
            self._s = real(ctx, name)

        async def open(self) -> Any:
            return _DieAfterEnd(await self._s.open())

    monkeypatch.setattr(adapter, "token_stream", Stream)
    async with engine.worker():
        r = await engine.start("rev_pyd_ender", "e", None)
        with anyio.fail_after(20):
            assert await r.result() == "the answer"
    assert CALLS["died"] == 1
    assert CALLS["model"] == 1  # the second attempt took the stored response
