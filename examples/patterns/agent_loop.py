"""The agent loop, written out: ask the model, run the tool it asks for, give it the
result, repeat.

    fusee dev examples/patterns/agent_loop.py

Each model call is the step ``model-<turn>`` and each tool call ``tool-<turn>-<tool>``,
so the journal reads as the conversation did, and a crash resumes at the call that was
running: the model is not asked again for answers it already gave. A tool that changes
the world takes the step's key (``s.key``) as its idempotency key. ``fusee.ai.loop``
is this loop as library code (see ``examples/agent.py``).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

import fusee
import fusee.dev
from fusee.ai import (
    AssistantMessage,
    Message,
    ModelRequest,
    ToolResultMessage,
    UserMessage,
    model_step,
)
from fusee.testing import Reply, ScriptedModel, tool_call

ORDERS = {"1042": {"status": "shipped", "carrier": "DHL", "eta": "Thursday"}}
NOTES: dict[str, str] = {}  # the ticket system, standing in: one note per idempotency key


def lookup_order(args: dict[str, Any], *, idempotency_key: str) -> dict[str, Any]:
    return {"order": args["order"], **ORDERS.get(args["order"], {"status": "not found"})}


def add_note(args: dict[str, Any], *, idempotency_key: str) -> str:
    NOTES.setdefault(idempotency_key, args["text"])  # sent twice with one key, noted once
    return f"noted ({len(NOTES)} notes)"


TOOLS = {"lookup_order": lookup_order, "add_note": add_note}


def scripted(request: ModelRequest, n: int) -> Reply:
    """The stand-in model: look the order up, note it on the ticket, answer."""
    turn = sum(isinstance(m, AssistantMessage) for m in request.messages)
    if turn == 0:
        return tool_call("lookup_order", "call_1", order="1042")
    if turn == 1:
        order = msgspec.json.decode(request.messages[-1].content)
        return tool_call("add_note", "call_2", text=f"told the customer: {order['status']}")
    order = msgspec.json.decode(request.messages[-3].content)
    return f"Order {order['order']} has {order['status']} with {order['carrier']}."


model = ScriptedModel(scripted)


@fusee.workflow("agent")
async def agent(ctx: fusee.Context, question: str) -> str:
    history: list[Message] = [UserMessage(question)]
    for turn in range(20):
        reply = await model_step(ctx, f"model-{turn}", model, ModelRequest(messages=history))
        if not reply.tool_calls:
            return reply.text
        # One call a turn, as the seed writes it: any call after tool_calls[0] is dropped
        # (not run, not answered). fusee.ai.loop runs every call of a turn.
        call = reply.tool_calls[0]
        args = msgspec.json.decode(call.arguments)
        result = await ctx.step(
            f"tool-{turn}-{call.name}",
            lambda s: TOOLS[call.name](args, idempotency_key=s.key),  # noqa: B023 (awaited here)
        )
        content = result if isinstance(result, str) else msgspec.json.encode(result).decode()
        history += [
            AssistantMessage(content=reply.text, tool_calls=[call]),
            ToolResultMessage(tool_call_id=call.id, name=call.name, content=content),
        ]
    raise fusee.FatalError("no answer after 20 turns")


async def main(engine: fusee.Engine) -> None:
    run = await engine.start(agent, f"agent-{time.strftime('%m%d-%H%M%S')}", "Where is 1042?")
    print(f"\n  {await run.result(timeout='30s')}\n")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
