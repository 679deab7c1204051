"""A Pydantic AI agent whose one model response asks for two tool calls, run in
parallel (Pydantic AI's default) inside a workflow, for a kill test: ``FunctionModel``
(no server), one line per tool execution in ``arg["log"]`` and per model request in
the file ``FUSEE_TEST_MODEL_LOG`` names (the model is the agent's, made at import).
``lookup_order`` waits for the file ``arg["until"]`` (the test creates it), so a kill
lands in it by construction once ``refund`` ended."""

from __future__ import annotations

import os
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import fusee
from fusee.ai.pydantic import FuseeDurability, run, tool_key
from tests.workers.effects import record_line, wait_for_file


def _answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = [
        p for m in messages if isinstance(m, ModelRequest) for p in m.parts
        if p.part_kind == "tool-return"
    ]  # fmt: skip
    if not done:
        return ModelResponse(
            parts=[
                ToolCallPart("lookup_order", {"order": "A1"}, tool_call_id="c1"),
                ToolCallPart("refund", {"order": "A1", "amount": 5}, tool_call_id="c2"),
            ]
        )
    return ModelResponse(parts=[TextPart(" | ".join(f"{p.tool_name}={p.content}" for p in done))])


async def lookup_order(ctx: RunContext[dict[str, Any]], order: str) -> str:
    """Look an order up."""
    record_line(ctx.deps["log"], f"lookup_order {tool_key()}")
    await wait_for_file(ctx.deps["until"])
    return f"{order}:shipped"


async def refund(ctx: RunContext[dict[str, Any]], order: str, amount: int) -> str:
    """Refund part of an order."""
    record_line(ctx.deps["log"], f"refund {tool_key()}")
    return f"refunded {amount}"


def _counted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    record_line(os.environ["FUSEE_TEST_MODEL_LOG"], "model -")
    return _answer(messages, info)


agent = Agent(
    FunctionModel(_counted),
    name="support",
    deps_type=dict[str, Any],
    tools=[lookup_order, refund],
    capabilities=[FuseeDurability()],
)


@fusee.workflow("pyd_parallel")
async def pyd_parallel(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    result = await run(ctx, lambda: agent.run("refund A1", deps=arg))
    return result.output
