"""The Pydantic AI agent of the adapter's golden journal (``support.jsonl``): Pydantic
AI's FunctionModel (deterministic), two tools of the agent's own, a toolset with an id,
and a tool without a step. Do not change it: the recorded journal must keep replaying
through it (a Pydantic AI upgrade that changes a step name or a payload's shape fails
``test_pydantic_ai_golden.py``)."""

from __future__ import annotations

from pydantic_ai import Agent, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

import fusee
from fusee.actors.registry import Registry, Workflow
from fusee.ai.pydantic import FuseeDurability, run


def _results(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        p for m in messages if isinstance(m, ModelRequest) for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]  # fmt: skip


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = _results(messages)
    if not done:
        return ModelResponse(
            parts=[
                ToolCallPart("lookup_order", {"order": "o-1"}, tool_call_id="g1"),
                ToolCallPart("note", {"text": "looked"}, tool_call_id="g2"),
            ]
        )
    if len(done) == 2:
        return ModelResponse(
            parts=[
                TextPart("refunding"),
                ToolCallPart("refund", {"order": "o-1", "amount": 30}, tool_call_id="g3"),
                ToolCallPart("ping", {}, tool_call_id="g4"),
            ]
        )
    return ModelResponse(parts=[TextPart(" | ".join(str(p.content) for p in done))])


def lookup_order(order: str) -> dict[str, str]:
    """Look an order up."""
    return {"order": order, "status": "shipped"}


def refund(order: str, amount: int) -> str:
    """Refund part of an order."""
    return f"refunded {amount} on {order}"


def note(text: str) -> str:
    """A note, not a step."""
    return f"noted {text}"


def ping() -> str:
    """Ping billing."""
    return "pong"


support = Agent(
    FunctionModel(_model, model_name="golden-model"),
    name="support",
    tools=[lookup_order, refund, Tool(note, metadata={"fusee": False})],
    toolsets=[FunctionToolset([ping], id="billing")],
    capabilities=[FuseeDurability()],
)


async def support_wf(ctx: fusee.Context, question: str) -> str:
    result = await run(ctx, lambda: support.run(question))
    return result.output


REGISTRY = Registry()
REGISTRY.add(Workflow("golden.pydantic_ai", support_wf, str, True))
RUNS = {"support": ("golden.pydantic_ai", "refund o-1")}
