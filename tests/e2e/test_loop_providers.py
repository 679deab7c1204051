"""``fusee.ai.loop`` through the real provider SDKs (issue 13): ``openai`` (Chat
Completions and Responses) and ``anthropic`` against the local servers that speak
their wire protocol (``tests/fakes/``), as JSON and as SSE, from a workflow run by a
worker on a real nats-server.

What a user's provider would see: the tools' schemas made from the functions'
signatures and docstrings, both parallel calls' results in the provider's own shape
(a tool that raised as an error result), and what the loop returns.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import fusee
from fusee.ai import Model, loop
from fusee.runtime.records import StepCompleted, StepFailed
from tests.e2e.test_ai_providers import (
    FAST,
    PROVIDERS,
    engine,
    fakes,
    serve,
    two_calls_then_answer,
)
from tests.fakes.openai_server import FakeOpenAI

LOOP_MODELS: dict[str, Model] = {}  # run ID -> the model its loop asks
__all__ = ("engine", "fakes")  # the fixtures of the generate tests, shared


def search_kb(query: str) -> str:
    """Search the knowledge base.

    Args:
        query: the words to look for.
    """
    return f"KB: refunds take 5 days ({query})"


def lookup_order(order: int) -> str:
    """Find an order.

    Args:
        order: the order's number.
    """
    raise LookupError(f"order {order} is archived")


@fusee.workflow("ai_loop")
async def agent(ctx: fusee.Context, stream: bool) -> dict[str, Any]:
    result = await loop(
        ctx,
        "agent",
        model=LOOP_MODELS[ctx.run_id],
        prompt="Where is my refund for order 7?",
        tools={"search_kb": search_kb, "lookup_order": lookup_order},
        stream=stream,
        retry=FAST,
    )
    return {"text": result.text, "iterations": result.iterations, "usage": result.usage}


ERROR = "tool 'lookup_order' failed: LookupError: order 7 is archived"
SEARCH_PARAMS = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "the words to look for."}},
    "required": ["query"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_loop_with_parallel_tool_calls_through_the_real_client(
    engine: fusee.Engine, fakes: list[FakeOpenAI], provider: str, stream: bool
) -> None:
    fake, model = serve(provider, two_calls_then_answer())
    fakes.append(fake)
    run_id = f"loop-{provider}-{stream}"
    LOOP_MODELS[run_id] = model
    async with engine.worker():
        run = await engine.start("ai_loop", run_id, stream)
        result = await run.result(timeout=30)
    assert result["text"] == "Your refund is on its way."
    assert result["iterations"] == 2
    journal = [r for _, r in await run.journal() if isinstance(r, StepCompleted | StepFailed)]
    assert [(type(r).__name__, r.name) for r in sorted(journal, key=lambda r: r.pos)] == [
        ("StepCompleted", "agent/turn-0"),
        ("StepCompleted", "agent/tool-0-search_kb"),
        ("StepFailed", "agent/tool-0-lookup_order"),
        ("StepCompleted", "agent/turn-1"),
    ]

    first, second = (r.body for r in fake.snapshot())
    assert all(bool(b.get("stream")) == stream for b in (first, second))
    tools_sent = first["tools"]
    if provider == "openai-chat":
        fns = [t["function"] for t in tools_sent]
        assert [f["name"] for f in fns] == ["search_kb", "lookup_order"]
        assert fns[0]["description"] == "Search the knowledge base."
        assert fns[0]["parameters"] == SEARCH_PARAMS
        msgs = second["messages"]
        assert [c["id"] for c in msgs[1]["tool_calls"]] == ["call_a", "call_b"]
        assert [(m["role"], m["tool_call_id"], m["content"]) for m in msgs[2:]] == [
            ("tool", "call_a", "KB: refunds take 5 days (refund)"),
            ("tool", "call_b", ERROR),
        ]
    elif provider == "openai-responses":
        assert [t["name"] for t in tools_sent] == ["search_kb", "lookup_order"]
        assert tools_sent[0]["parameters"] == SEARCH_PARAMS
        outputs = [i for i in second["input"] if i.get("type") == "function_call_output"]
        assert [(i["call_id"], i["output"]) for i in outputs] == [
            ("call_a", "KB: refunds take 5 days (refund)"),
            ("call_b", ERROR),
        ]
    else:
        assert [t["name"] for t in tools_sent] == ["search_kb", "lookup_order"]
        assert tools_sent[0]["input_schema"] == SEARCH_PARAMS
        msgs = second["messages"]
        assert [b["id"] for b in msgs[1]["content"] if b["type"] == "tool_use"] == [
            "call_a",
            "call_b",
        ]
        results = msgs[2]["content"]  # both results in the one user message that follows
        assert [(b["tool_use_id"], b.get("is_error", False)) for b in results] == [
            ("call_a", False),
            ("call_b", True),
        ]
        assert json.dumps(results[1]["content"]).find("order 7 is archived") >= 0
