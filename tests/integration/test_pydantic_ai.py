"""fusee.ai.pydantic: a Pydantic AI agent's model requests and tool calls as steps
(real nats-server, in-process worker, Pydantic AI's FunctionModel as the model).

The step names are pinned here: Pydantic AI calls persisted names compatibility data,
and an upgrade that changes them strands runs in flight.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("pydantic_ai")

from fastmcp.client.transports import PythonStdioTransport
from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.exceptions import UserError
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.toolsets import FunctionToolset

import fusee
from fusee.actors.worker import WorkerConfig
from fusee.ai.pydantic import FuseeDurability, run, tool_key
from fusee.errors import ConfigError, RunFailed
from fusee.runtime.records import StepCompleted, WaitStarted
from tests.fakes.agent_openai import AgentFake
from tests.fakes.openai_server import Reply, tokenize
from tests.helpers import split_attempts
from tests.workers.procs import api_server, wait_until

CALLS: collections.Counter[str] = collections.Counter()  # model requests per run
EFFECTS: list[tuple[str, str]] = []  # (tool, key) per side effect
GATES: dict[str, anyio.Event] = {}


def tool_results(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        p for m in messages if isinstance(m, ModelRequest) for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]  # fmt: skip


def two_turns(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Turn 1 calls both tools at once; turn 2 answers with their results."""
    CALLS["model"] += 1
    done = tool_results(messages)
    if not done:
        return ModelResponse(
            parts=[
                ToolCallPart("lookup_order", {"order": "A1"}, tool_call_id="c1"),
                ToolCallPart("refund", {"order": "A1", "amount": 5}, tool_call_id="c2"),
            ]
        )
    return ModelResponse(parts=[TextPart(" | ".join(f"{p.tool_name}={p.content}" for p in done))])


async def lookup_order(order: str) -> str:
    """Look an order up."""
    EFFECTS.append(("lookup_order", tool_key() or "-"))
    return f"{order}:shipped"


async def refund(ctx: RunContext[None], order: str, amount: int) -> str:
    """Refund part of an order."""
    EFFECTS.append(("refund", tool_key() or "-"))
    key = tool_key()
    assert key is None or key.endswith(f"-{ctx.tool_call_id}")
    return f"refunded {amount}"


def audit(note: str) -> str:
    """Log a note (no step)."""
    EFFECTS.append(("audit", note))
    return "ok"


support = Agent(
    FunctionModel(two_turns),
    name="support",
    tools=[lookup_order, refund],
    capabilities=[FuseeDurability()],
)


@fusee.workflow("pyd_support")
async def support_wf(ctx: fusee.Context, question: str) -> str:
    result = await run(ctx, lambda: support.run(question))
    return result.output


EXPECTED = "lookup_order=A1:shipped | refund=refunded 5"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    CALLS.clear()
    EFFECTS.clear()


def step_names(journal: list[tuple[int, Any]]) -> list[str]:
    return [r.name for _, r in journal if isinstance(r, StepCompleted)]


@pytest.mark.parametrize("always_replay", [False, True])
async def test_two_calls_of_one_turn_take_positions_in_the_models_order(
    engine: fusee.Engine, always_replay: bool
) -> None:
    # The calls of a turn run at once (Pydantic AI's parallel mode, tasks of its own);
    # their steps take positions in the model's order, and every replay
    # (always_replay: after the steps running together ended) meets them there.
    # (Their completions skewed, and a kill: test_pydantic_ai_parallel.py.)
    config = WorkerConfig(always_replay=always_replay)
    async with engine.worker(config=config):
        run_ = await engine.start("pyd_support", f"p-{always_replay}", "refund A1")
        with anyio.fail_after(20):
            assert await run_.result() == EXPECTED
        journal = await run_.journal()
    by_pos = sorted((r.pos, r.name) for _, r in journal if isinstance(r, StepCompleted))
    assert [name for _, name in by_pos] == [
        "support__model.request",
        "support__function_toolset__<agent>.call_tool:lookup_order",
        "support__function_toolset__<agent>.call_tool:refund",
        "support__model.request",
    ]
    assert CALLS["model"] == 2  # never asked again for a journaled response
    assert sorted(t for t, _ in EFFECTS) == ["lookup_order", "refund"]  # each once
    keys = dict(EFFECTS)
    assert keys["refund"].endswith("-c2")
    assert keys["lookup_order"].endswith("-c1")
    assert keys["refund"].split("-")[0] != keys["lookup_order"].split("-")[0]


async def test_outside_run_the_agent_is_ordinary() -> None:
    result = await support.run("refund A1")
    assert result.output == EXPECTED
    assert CALLS["model"] == 2


async def test_the_same_agent_in_two_runs_gets_other_tool_keys(engine: fusee.Engine) -> None:
    async with engine.worker():
        for i in range(2):
            r = await engine.start("pyd_support", f"k{i}", "refund A1")
            with anyio.fail_after(20):
                assert await r.result() == EXPECTED
    refunds = [k for t, k in EFFECTS if t == "refund"]
    assert len(refunds) == 2
    assert refunds[0] != refunds[1]  # the call ID is c2 both times


# -- options, metadata, names ---------------------------------------------------------


def one_audit(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    CALLS["model"] += 1
    if not tool_results(messages):
        return ModelResponse(
            parts=[
                ToolCallPart("audit", {"note": "n1"}, tool_call_id="a1"),
                ToolCallPart("ping", {}, tool_call_id="p1"),
            ]
        )
    return ModelResponse(parts=[TextPart("done")])


def ping() -> str:
    """Ping billing."""
    EFFECTS.append(("ping", tool_key() or "-"))
    return "pong"


billing = FunctionToolset([ping], id="billing")
audited = Agent(
    FunctionModel(one_audit),
    name="audited",
    tools=[Tool(audit, metadata={"fusee": False})],
    toolsets=[billing],
    capabilities=[FuseeDurability(tool_options={"retry": fusee.Retry(attempts=2)})],
)


@fusee.workflow("pyd_audited")
async def audited_wf(ctx: fusee.Context) -> str:
    return (await run(ctx, lambda: audited.run("go"))).output


async def test_metadata_false_runs_without_a_step_and_toolsets_by_id(
    engine: fusee.Engine,
) -> None:
    async with engine.worker():
        r = await engine.start("pyd_audited", "a", None)
        with anyio.fail_after(20):
            assert await r.result() == "done"
        names = step_names(await r.journal())
    assert names == [
        "audited__model.request",
        "audited__function_toolset__billing.call_tool:ping",
        "audited__model.request",
    ]
    assert ("audit", "n1") in EFFECTS


def test_missing_names_are_clear_errors() -> None:
    with pytest.raises(UserError, match=r"unique `name`.*fusee"):
        Agent(FunctionModel(two_turns), capabilities=[FuseeDurability()])
    with pytest.raises(UserError, match=r"unique `id`.*fusee"):
        Agent(
            FunctionModel(two_turns),
            name="x",
            toolsets=[FunctionToolset([ping])],
            capabilities=[FuseeDurability()],
        )


def test_bad_step_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"'retries'.*fairness_key, limit, retry, timeout"):
        FuseeDurability(model_options={"retries": 3})
    with pytest.raises(ConfigError, match=r"fusee\.Retry"):
        FuseeDurability(tool_options={"retry": 3})


# -- streaming ------------------------------------------------------------------------


async def stream_two(messages: list[ModelMessage], info: AgentInfo) -> Any:
    CALLS["model"] += 1
    if not tool_results(messages):
        yield {0: DeltaToolCall(name="ping", json_args="{}", tool_call_id="s1")}
        return
    for word in ["hello ", "streamed ", "world"]:
        if word == "world":
            gate = GATES.get("stream")
            if gate is not None:
                await gate.wait()
        yield word


streamer = Agent(
    FunctionModel(stream_function=stream_two),
    name="streamer",
    tools=[ping],
    capabilities=[FuseeDurability()],
)


@fusee.workflow("pyd_stream")
async def stream_wf(ctx: fusee.Context) -> list[str]:
    async def go() -> list[str]:
        async with streamer.run_stream("hi") as result:
            return [chunk async for chunk in result.stream_text(delta=True)]

    return await run(ctx, go)


async def test_streamed_text_goes_live_to_the_token_stream(engine: fusee.Engine) -> None:
    GATES["stream"] = gate = anyio.Event()
    try:
        async with engine.worker():
            r = await engine.start("pyd_stream", "s", None)
            name = "streamer__model.request_stream/1"
            seen: list[str] = []

            async def follow() -> None:
                async for text in r.stream(name):
                    seen.append(text)

            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                # two deltas are stored while the step still waits before its third
                await wait_until(lambda: "".join(seen) == "hello streamed ", timeout=10,
                                 what="live tokens")  # fmt: skip
                assert not (await r.describe()).ended
                gate.set()
                with anyio.fail_after(20):
                    chunks = await r.result()
            names = step_names(await r.journal())
    finally:
        GATES.pop("stream", None)
    assert "".join(seen) == "hello streamed world"
    assert "".join(chunks) == "hello streamed world"
    assert names == [
        "streamer__model.request_stream",
        "streamer__function_toolset__<agent>.call_tool:ping",
        "streamer__model.request_stream",
    ]


# -- several toolsets, one an MCP server over stdio --------------------------------------

MCP_SERVER = Path(__file__).resolve().parents[1] / "fakes" / "mcp_server.py"


def mcp_turns(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    CALLS["model"] += 1
    done = tool_results(messages)
    if not done:
        return ModelResponse(parts=[ToolCallPart("stock", {"item": "bolt"}, tool_call_id="m1")])
    if len(done) == 1:
        return ModelResponse(parts=[ToolCallPart("ping", {}, tool_call_id="m2")])
    return ModelResponse(parts=[TextPart(" | ".join(str(p.content) for p in done))])


def mcp_agent(log: Path) -> Agent[None, str]:
    env = {"FAKE_MCP_LOG": str(log), "FAKE_MCP_STARTS": str(log.with_suffix(".starts"))}
    warehouse = MCPToolset(PythonStdioTransport(MCP_SERVER, env=env), id="warehouse")
    return Agent(
        FunctionModel(mcp_turns),
        name="stocker",
        toolsets=[warehouse, FunctionToolset([ping], id="billing")],
        capabilities=[FuseeDurability()],
    )


MCP_AGENTS: dict[str, Agent[None, str]] = {}


@fusee.workflow("pyd_mcp")
async def mcp_wf(ctx: fusee.Context, key: str) -> str:
    return (await run(ctx, lambda: MCP_AGENTS[key].run("stock?"))).output


@pytest.mark.parametrize("always_replay", [False, True])
async def test_an_mcp_server_over_stdio_beside_a_function_toolset(
    engine: fusee.Engine, tmp_path: Path, always_replay: bool
) -> None:
    log = tmp_path / "mcp.log"
    MCP_AGENTS[str(always_replay)] = mcp_agent(log)
    async with engine.worker(config=WorkerConfig(always_replay=always_replay)):
        r = await engine.start("pyd_mcp", f"m-{always_replay}", str(always_replay))
        with anyio.fail_after(30):
            assert await r.result() == "bolt: 7 in stock | pong"
        names = step_names(await r.journal())
    assert names == [
        "stocker__mcp_server__warehouse.get_tools",
        "stocker__model.request",
        "stocker__mcp_server__warehouse.call_tool",
        "stocker__model.request",
        "stocker__function_toolset__billing.call_tool:ping",
        "stocker__model.request",
    ], names
    assert log.read_text() == "stock bolt\n"  # the server got one call, replays or not
    # the stdio server's process is started by the first step that needs it (inside
    # that step, under its retries) and kept for the rest of the agent run; replays
    # that run no MCP step start none
    assert log.with_suffix(".starts").read_text().count("start") == 1
    assert CALLS["model"] == 3


# -- approvals: a completion wait with a callback URL ----------------------------------

ASKED: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)


def approval_turns(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    CALLS["model"] += 1
    done = tool_results(messages)
    if not done:
        return ModelResponse(
            parts=[ToolCallPart("refund", {"order": "A1", "amount": 40}, tool_call_id="r1")]
        )
    return ModelResponse(parts=[TextPart(f"refund: {done[0].content}")])


def ask(cb: Any, call: ToolCallPart) -> None:
    ASKED[call.tool_call_id].append((cb.token, call.tool_name))


approver = Agent(
    FunctionModel(approval_turns),
    name="approver",
    tools=[Tool(refund, requires_approval=True)],
    capabilities=[FuseeDurability(approve=ask)],
)


@fusee.workflow("pyd_approval")
async def approval_wf(ctx: fusee.Context) -> str:
    return (await run(ctx, lambda: approver.run("refund A1"))).output


@pytest.mark.parametrize(
    ("answer", "output"),
    [
        (True, "refund: refunded 40"),
        (
            {"approved": False, "reason": "over the limit"},
            "refund: the call was not approved, so it did not run: over the limit",
        ),
    ],
)
async def test_an_approval_parks_the_run_until_its_callback_url_is_answered(
    engine: fusee.Engine,
    nats_server: Any,
    namespace: str,
    tmp_path: Path,
    answer: Any,
    output: str,
) -> None:
    ASKED.clear()
    with api_server(nats_server.url, namespace, tmp_path) as api:
        base = (await api.wait_for("api.serving", timeout=20))["url"]
        async with engine.worker():
            r = await engine.start("pyd_approval", "ap", None)

            async def parked() -> bool:
                j = await r.journal()
                return any(isinstance(x, WaitStarted) and x.wait == "completion" for _, x in j)

            await wait_until(parked, timeout=20, what="the approval wait")
            token = await wait_until(lambda: ASKED["r1"], timeout=10, what="the ask")
            assert not EFFECTS  # nothing ran before a person answered
            async with httpx.AsyncClient(timeout=20) as client:
                got = await client.post(f"{base}/v1/completions/{token[0][0]}", json=answer)
            assert got.status_code == 200, got.text
            with anyio.fail_after(20):
                assert await r.result() == output
            names = step_names(await r.journal())
    assert ASKED["r1"] == [(token[0][0], "refund")]  # asked once, also across the replay
    ran = [t for t, _ in EFFECTS]
    assert ran == (["refund"] if answer is True else [])
    assert names[:2] == ["approver__model.request", "ask/approve:refund:r1"]
    assert names[-1] == "approver__model.request"
    assert ("approver__function_toolset__<agent>.call_tool:refund" in names) == (answer is True)
    assert CALLS["model"] == 2


async def stream_cut_once(messages: list[ModelMessage], info: AgentInfo) -> Any:
    CALLS["model"] += 1
    yield "first "
    yield "try "
    if CALLS["model"] == 1:
        raise ConnectionError("the stream was cut")
    yield "done"


cut_streamer = Agent(
    FunctionModel(stream_function=stream_cut_once),
    name="cut",
    capabilities=[
        FuseeDurability(model_options={"retry": fusee.Retry(attempts=3, initial=0.01, max=0.01)})
    ],
)


@fusee.workflow("pyd_stream_cut")
async def stream_cut_wf(ctx: fusee.Context) -> str:
    async def go() -> str:
        async with cut_streamer.run_stream("hi") as result:
            return await result.get_output()

    return await run(ctx, go)


async def test_a_retried_streamed_request_writes_a_reset_marker(engine: fusee.Engine) -> None:
    async with engine.worker():
        r = await engine.start("pyd_stream_cut", "cut", None)
        with anyio.fail_after(20):
            assert await r.result() == "first try done"
        events = [e async for e in r.stream_events("cut__model.request_stream/0")]
    attempts = split_attempts(events)
    texts = ["".join(e.text for e in a if e.kind == "token") for a in attempts]
    assert texts == ["first try ", "first try done"]  # the cut attempt, then the retry
    assert attempts[1][0].kind == "attempt"
    assert [e.kind for e in events][-1] == "end"
    assert CALLS["model"] == 2


HANDLED: list[str] = []


async def handle(ctx: RunContext[None], events: Any) -> None:
    async for event in events:
        HANDLED.append(type(event).__name__)


handled = Agent(
    FunctionModel(stream_function=stream_two),
    name="handled",
    tools=[ping],
    capabilities=[FuseeDurability(event_stream_handler=handle)],
)


@fusee.workflow("pyd_handled")
async def handled_wf(ctx: fusee.Context) -> str:
    async def go() -> str:
        # iter, as a UI would drive it; the handler makes its requests streamed ones
        async with handled.iter("hi") as agent_run:
            async for _ in agent_run:
                pass
        assert agent_run.result is not None
        return agent_run.result.output

    return await run(ctx, go)


async def test_an_event_stream_handler_and_iter(engine: fusee.Engine) -> None:
    HANDLED.clear()
    async with engine.worker():
        r = await engine.start("pyd_handled", "h", None)
        with anyio.fail_after(20):
            assert await r.result() == "hello streamed world"
        names = step_names(await r.journal())
        text = "".join([t async for t in r.stream("handled__model.request_stream/1")])
    assert text == "hello streamed world"
    assert names == [
        "handled__model.request_stream",
        "handled__event_stream_handler",
        "handled__function_toolset__<agent>.call_tool:ping",
        "handled__event_stream_handler",
        "handled__model.request_stream",
    ], names
    # the model's events live, inside the model step; the tool's in steps of their own
    assert "PartDeltaEvent" in HANDLED
    assert "FunctionToolCallEvent" in HANDLED
    assert "FunctionToolResultEvent" in HANDLED


unasked = Agent(
    FunctionModel(approval_turns),
    name="unasked",
    tools=[Tool(refund, requires_approval=True)],
    capabilities=[FuseeDurability()],
)


@fusee.workflow("pyd_unasked")
async def unasked_wf(ctx: fusee.Context) -> str:
    return (await run(ctx, lambda: unasked.run("refund A1"))).output


async def test_an_approval_without_approve_fails_naming_the_tool(
    engine: fusee.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # The callback URL is a credential and no engine call lists a run's waiting
    # completions: without approve= nobody could answer, so the run fails, naming the
    # tool, before the tool runs; the URL is in no log.
    caplog.set_level("DEBUG", logger="fusee")
    async with engine.worker():
        r = await engine.start("pyd_unasked", "un", None)
        with anyio.fail_after(20), pytest.raises(RunFailed) as failed:
            await r.result()
    assert "tool 'refund' of agent 'unasked' needs approval" in str(failed.value)
    assert "approve=" in str(failed.value)
    assert not EFFECTS
    assert not [m for m in caplog.messages if "/v1/completions/" in m]


async def test_run_checks_its_context() -> None:
    with pytest.raises(fusee.InvalidArgument, match="ctx is a NoneType"):
        await run(None, lambda: support.run("x"))  # type: ignore[arg-type]


# -- the real openai client, streaming (SSE) through Pydantic AI's OpenAI model ----------

SSE_TEXT = "Refunds take three days, and yours is on its way."
SSE_AGENTS: dict[str, Agent[None, str]] = {}


@fusee.workflow("pyd_sse")
async def sse_wf(ctx: fusee.Context, key: str) -> str:
    async def go() -> str:
        async with SSE_AGENTS[key].run_stream("how long?") as result:
            return await result.get_output()

    return await run(ctx, go)


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_the_openai_client_streams_to_the_token_stream(
    engine: fusee.Engine, api: str
) -> None:
    with AgentFake(lambda key, turn: Reply(SSE_TEXT), delay=0.0) as fake:
        provider = OpenAIProvider(base_url=fake.base_url, api_key="test")
        model_cls = OpenAIChatModel if api == "chat" else OpenAIResponsesModel
        SSE_AGENTS[api] = Agent(
            model_cls("fake-gpt", provider=provider),
            name="sse",
            capabilities=[FuseeDurability()],
        )
        async with engine.worker():
            r = await engine.start("pyd_sse", f"sse-{api}", api)
            with anyio.fail_after(20):
                assert await r.result() == SSE_TEXT
            events = [e async for e in r.stream_events("sse__model.request_stream/0")]
        assert [r.path for r in fake.snapshot()] == [
            "/v1/chat/completions" if api == "chat" else "/v1/responses"
        ]
        assert all(r.body.get("stream") for r in fake.snapshot())
    tokens = [e.text for e in events if e.kind == "token"]
    assert "".join(tokens) == SSE_TEXT
    assert tokens == tokenize(SSE_TEXT)  # as the server sent them, one message each
    assert events[-1].kind == "end"
