"""``generate`` and tool calls through the real provider SDKs: ``openai`` (Chat
Completions and Responses) and ``anthropic``, each against a local server that speaks
its wire protocol (``tests/fakes/openai_server.py``, ``tests/fakes/anthropic_server.py``),
as JSON and as SSE, from a workflow run by a worker (real nats-server).

Each test checks what the provider would see (the request bodies: the schema, the
re-ask's feedback, the tool results in the provider's own shape) and what the workflow
got (the parsed output, the tool calls, the journal's steps).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import msgspec
import pytest

import fusee
from fusee.ai import (
    Model,
    ModelRequest,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
    anthropic_model,
    generate,
    model_step,
    openai_model,
)
from fusee.runtime.records import StepCompleted, StepRetrying
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.openai_server import FakeOpenAI, Reply

PROVIDERS = ["openai-chat", "openai-responses", "anthropic"]
MODELS: dict[str, Model] = {}  # run ID -> the model its workflow asks
FAST = fusee.Retry(attempts=3, initial=0.01, max=0.02)


class Triage(msgspec.Struct):
    category: str
    priority: Literal["low", "high"]


def serve(provider: str, replies: list[Reply | str]) -> tuple[FakeOpenAI, Model]:
    if provider == "anthropic":
        fake: FakeOpenAI = FakeAnthropic(replies).start()
        return fake, anthropic_model("fake-claude", base_url=fake.base_url, api_key="test")
    fake = FakeOpenAI(replies=replies, delay=0).start()
    api: Literal["chat", "responses"] = "responses" if provider == "openai-responses" else "chat"
    return fake, openai_model("fake-gpt", base_url=fake.base_url, api_key="test", api=api)


@pytest.fixture
async def engine(nats_server: Any, namespace: str) -> Any:
    async with await fusee.connect(nats_server.url, namespace=namespace, partitions=2) as eng:
        yield eng


@pytest.fixture
def fakes() -> Iterator[list[FakeOpenAI]]:
    started: list[FakeOpenAI] = []
    yield started
    for fake in started:
        fake.stop()


@fusee.workflow("ai_ticket")
async def ticket(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    model = MODELS[ctx.run_id]
    triage = await generate(
        ctx,
        "classify",
        model=model,
        prompt=f"Classify: {arg['subject']}",
        output=Triage,
        reask=2,
        stream=arg["stream"],
        retry=FAST,
    )
    reply = await generate(
        ctx,
        "draft-reply",
        model=model,
        prompt=f"Reply to a {triage.output.priority} ticket",
        stream=arg["stream"],
        retry=FAST,
    )
    return {
        "category": triage.output.category,
        "reply": reply.text,
        "reasks": triage.reasks,
        "tokens": [triage.usage.input_tokens, triage.usage.output_tokens],
        "model": triage.model,
    }


SEARCH = ToolSpec(
    name="search_kb",
    description="Search the knowledge base.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}},
)
LOOKUP = ToolSpec(
    name="lookup_order",
    description="Find an order.",
    parameters={"type": "object", "properties": {"order": {"type": "integer"}}},
)


def run_tool(name: str, args: dict[str, Any]) -> str:
    if name == "search_kb":
        return f"KB: refunds take 5 days ({args['query']})"
    return f"order {args['order']}: shipped"


@fusee.workflow("ai_tools")
async def tools(ctx: fusee.Context, stream: bool) -> dict[str, Any]:
    """Two turns by hand: the model calls two tools at once, gets both results."""
    model = MODELS[ctx.run_id]
    history: list[Any] = [UserMessage("Where is my refund for order 7?")]
    first = await model_step(
        ctx,
        "agent/turn-0",
        model,
        ModelRequest(messages=history, tools=[SEARCH, LOOKUP]),
        stream=stream,
        retry=FAST,
    )
    history.append(first.message())
    results = await ctx.all(
        ctx.step(f"agent/tool-0-{c.name}", lambda c=c: run_tool(c.name, c.args()))
        for c in first.tool_calls
    )
    for call, result in zip(first.tool_calls, results, strict=True):
        history.append(ToolResultMessage(tool_call_id=call.id, name=call.name, content=result))
    final = await model_step(
        ctx,
        "agent/turn-1",
        model,
        ModelRequest(messages=history, tools=[SEARCH, LOOKUP]),
        stream=stream,
        retry=FAST,
    )
    return {
        "calls": [[c.id, c.name, c.args()] for c in first.tool_calls],
        "finish": [first.finish_reason, final.finish_reason],
        "text": final.text,
    }


def schema_sent(provider: str, body: dict[str, Any]) -> dict[str, Any]:
    if provider == "openai-chat":
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema"
        assert fmt["json_schema"]["name"] == "Triage"
        return dict(fmt["json_schema"]["schema"])
    if provider == "openai-responses":
        fmt = body["text"]["format"]
        assert fmt["type"] == "json_schema"
        assert fmt["name"] == "Triage"
        return dict(fmt["schema"])
    assert body["output_config"]["format"]["type"] == "json_schema"
    return dict(body["output_config"]["format"]["schema"])


def conversation(provider: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """(role or item type, text) of each message or item the provider got."""
    out: list[tuple[str, str]] = []
    for m in body.get("input") or body.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list):  # Anthropic's blocks
            for b in content:
                out.append((f"{m['role']}:{b['type']}", b.get("text") or json.dumps(b)))
        else:
            out.append((m.get("role") or m["type"], content or json.dumps(m)))
    return out


async def journal_names(engine: fusee.Engine, run_id: str) -> list[str]:
    return [r.name for _, r in await engine.run(run_id).journal() if isinstance(r, StepCompleted)]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_generate_structured_output_with_a_reask(
    engine: fusee.Engine, fakes: list[FakeOpenAI], provider: str, stream: bool
) -> None:
    fake, model = serve(
        provider,
        [
            "It is a billing question.",  # not JSON: re-asked
            '{"category": "billing", "priority": "high"}',
            "We will refund you.",
        ],
    )
    fakes.append(fake)
    run_id = f"ticket-{provider}-{stream}"
    MODELS[run_id] = model
    async with engine.worker():
        run = await engine.start("ai_ticket", run_id, {"subject": "refund", "stream": stream})
        result = await run.result(timeout=20)
    assert result["category"] == "billing"
    assert result["reply"] == "We will refund you."
    assert result["reasks"] == 1
    assert result["tokens"] == [22, 14]  # two asks of (11, 7)
    assert result["model"] == ("fake-claude" if provider == "anthropic" else "fake-gpt")
    assert await journal_names(engine, run_id) == ["classify", "classify#reask-1", "draft-reply"]

    first, second, third = (r.body for r in fake.snapshot())
    assert all(bool(b.get("stream")) == stream for b in (first, second, third))
    schema = schema_sent(provider, first)
    assert schema["type"] == "object"
    assert schema["required"] == ["category", "priority"]
    assert conversation(provider, first)[-1][1] == "Classify: refund"
    # the re-ask: the bad answer as the assistant's, then the error as the user's
    sent = conversation(provider, second)
    assert [text for _, text in sent[:2]] == ["Classify: refund", "It is a billing question."]
    assert sent[1][0].startswith("assistant")
    assert sent[2][0].startswith("user")
    assert "not JSON" in sent[2][1]
    assert schema_sent(provider, second) == schema
    assert not {"response_format", "output_config", "text"} & third.keys(), "no schema: plain text"


def two_calls_then_answer() -> list[Reply | str]:
    """The tool tests' script: one turn calling ``search_kb`` and ``lookup_order`` at
    once, then the answer."""
    return [
        Reply(
            tool_calls=[
                ("call_a", "search_kb", '{"query": "refund"}'),
                ("call_b", "lookup_order", '{"order": 7}'),
            ]
        ),
        "Your refund is on its way.",
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_parallel_tool_calls_round_trip(
    engine: fusee.Engine, fakes: list[FakeOpenAI], provider: str, stream: bool
) -> None:
    fake, model = serve(provider, two_calls_then_answer())
    fakes.append(fake)
    run_id = f"tools-{provider}-{stream}"
    MODELS[run_id] = model
    async with engine.worker():
        result = await (await engine.start("ai_tools", run_id, stream)).result(timeout=20)
    assert result["calls"] == [
        ["call_a", "search_kb", {"query": "refund"}],
        ["call_b", "lookup_order", {"order": 7}],
    ]
    assert result["finish"] == ["tool_calls", "stop"]
    assert result["text"] == "Your refund is on its way."
    names = await journal_names(engine, run_id)
    assert names[0] == "agent/turn-0"
    assert sorted(names[1:3]) == ["agent/tool-0-lookup_order", "agent/tool-0-search_kb"]
    assert names[3] == "agent/turn-1"

    first, second = (r.body for r in fake.snapshot())
    tools_sent = first["tools"]
    if provider == "openai-chat":
        assert [t["function"]["name"] for t in tools_sent] == ["search_kb", "lookup_order"]
        assert tools_sent[0]["function"]["parameters"] == SEARCH.parameters
        msgs = second["messages"]
        assert [c["id"] for c in msgs[1]["tool_calls"]] == ["call_a", "call_b"]
        assert [(m["role"], m["tool_call_id"]) for m in msgs[2:]] == [
            ("tool", "call_a"),
            ("tool", "call_b"),
        ]
        assert msgs[2]["content"] == "KB: refunds take 5 days (refund)"
    elif provider == "openai-responses":
        assert [t["name"] for t in tools_sent] == ["search_kb", "lookup_order"]
        items = second["input"]
        assert [(i.get("type"), i.get("call_id")) for i in items[1:]] == [
            ("function_call", "call_a"),
            ("function_call", "call_b"),
            ("function_call_output", "call_a"),
            ("function_call_output", "call_b"),
        ]
        assert items[4]["output"] == "order 7: shipped"
    else:
        assert [t["name"] for t in tools_sent] == ["search_kb", "lookup_order"]
        assert tools_sent[1]["input_schema"] == LOOKUP.parameters
        msgs = second["messages"]
        assert [b["id"] for b in msgs[1]["content"]] == ["call_a", "call_b"]
        assert msgs[1]["content"][1]["input"] == {"order": 7}
        # both results in the one user message that follows, as the API requires
        assert len(msgs) == 3
        assert [(b["type"], b["tool_use_id"]) for b in msgs[2]["content"]] == [
            ("tool_result", "call_a"),
            ("tool_result", "call_b"),
        ]


@fusee.workflow("ai_streamed")
async def streamed(ctx: fusee.Context) -> str:
    g = await generate(ctx, "answer", model=MODELS[ctx.run_id], prompt="Explain", stream=True,
                       retry=FAST)  # fmt: skip
    return g.text


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_stream_cut_without_its_terminal_event_is_retried(
    engine: fusee.Engine, fakes: list[FakeOpenAI], provider: str
) -> None:
    """The server closes the first stream cleanly after 3 tokens (no finish_reason, no
    response.completed, no message_stop): the SDK ends quietly, the adapter raises
    TruncatedStream, and the step's retry asks again."""
    text = "A cut stream is never taken for a whole answer."
    fake, model = serve(provider, [Reply(text, cut_after=3), Reply(text)])
    fakes.append(fake)
    run_id = f"cut-{provider}"
    MODELS[run_id] = model
    async with engine.worker():
        result = await (await engine.start("ai_streamed", run_id)).result(timeout=20)
        events = [e async for e in engine.run(run_id).stream_events("answer")]
    assert result == text
    journal = [r for _, r in await engine.run(run_id).journal()]
    retried = [r for r in journal if isinstance(r, StepRetrying)]
    assert [(r.name, r.error_type) for r in retried] == [("answer", "fusee.TruncatedStream")]
    assert [r.ending for r in await fake.settled(2)] == ["cut", "done"]
    # no prefill: the stored stream has the cut attempt, a boundary, then the whole text
    kinds = [e.kind for e in events]
    assert kinds.count("attempt") == 1
    after = kinds.index("attempt")
    assert "".join(e.text for e in events[after:] if e.kind == "token") == text


@fusee.workflow("ai_tool_mode")
async def tool_mode(ctx: fusee.Context, stream: bool) -> Any:
    g = await generate(ctx, "classify", model=MODELS[ctx.run_id], prompt="Classify",
                       output=Triage, stream=stream, retry=FAST)  # fmt: skip
    return {"out": msgspec.to_builtins(g.output), "finish": g.response.finish_reason}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_anthropic_structured_output_through_the_forced_output_tool(
    engine: fusee.Engine, fakes: list[FakeOpenAI], stream: bool
) -> None:
    """``output_mode="tool"``: the output is a tool the model is made to call, and its
    input is the answer (a stop, not a tool call)."""
    answer = '{"category": "billing", "priority": "high"}'
    fake = FakeAnthropic([Reply(tool_calls=[("toolu_1", "Triage", answer)])]).start()
    fakes.append(fake)
    run_id = f"tool-mode-{stream}"
    MODELS[run_id] = anthropic_model(
        "fake-claude", base_url=fake.base_url, api_key="test", output_mode="tool"
    )
    async with engine.worker():
        result = await (await engine.start("ai_tool_mode", run_id, stream)).result(timeout=20)
    assert result == {"out": {"category": "billing", "priority": "high"}, "finish": "stop"}
    body = fake.snapshot()[0].body
    assert body["tool_choice"] == {"type": "tool", "name": "Triage"}
    assert [t["name"] for t in body["tools"]] == ["Triage"]
    assert body["tools"][0]["input_schema"]["required"] == ["category", "priority"]
    assert "output_config" not in body


def test_anthropic_prefill_with_the_output_tool_is_refused() -> None:
    """A resumed stream of the forced output tool would be the stored partial JSON
    followed by a whole new tool input: the combination is refused."""
    with pytest.raises(fusee.ConfigError, match=r"prefill=True with output_mode='tool'"):
        anthropic_model("c", base_url="http://127.0.0.1:9", api_key="k", output_mode="tool",
                        prefill=True)  # fmt: skip


@fusee.workflow("ai_empty_answer")
async def empty_answer(ctx: fusee.Context) -> Any:
    g = await generate(ctx, "classify", model=MODELS[ctx.run_id], prompt="Classify",
                       output=Triage, reask=1, retry=FAST)  # fmt: skip
    return {"out": msgspec.to_builtins(g.output), "reasks": g.reasks}


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_reask_after_an_empty_answer_is_accepted_by_the_provider(
    engine: fusee.Engine, fakes: list[FakeOpenAI], provider: str
) -> None:
    """The empty answer goes back as the assistant's (an empty string: OpenAI refuses
    null content without tool calls), then the error as the user's."""
    fake, model = serve(provider, ["", '{"category": "billing", "priority": "low"}'])
    fakes.append(fake)
    run_id = f"empty-{provider}"
    MODELS[run_id] = model
    async with engine.worker():
        result = await (await engine.start("ai_empty_answer", run_id)).result(timeout=20)
    assert result == {"out": {"category": "billing", "priority": "low"}, "reasks": 1}
    sent = conversation(provider, fake.snapshot()[1].body)
    assert sent[-1][0].startswith("user")
    assert "not accepted" in sent[-1][1]
