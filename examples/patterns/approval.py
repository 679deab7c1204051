"""Approval before a tool runs: the agent proposes a refund, a person agrees, it runs.

    fusee dev examples/patterns/approval.py

``tool(refund, approve=ask)`` makes each call of ``refund`` first wait for a completion
(``agent/approve-<turn>-refund``); ``ask`` runs once, as its own step, to put the
completion's URL in front of someone (here a stand-in Slack). The wait holds no
process: the run parks until the answer comes. Completing it with ``true`` runs the
tool; ``{"approved": false, "reason": "..."}`` gives the model the refusal as the tool's
result, and the tool does not run. From a shell, ``curl -X POST <url> -d true``
against ``fusee api`` does the same as ``engine.complete`` here.
"""

from __future__ import annotations

import math
import time

import anyio
import msgspec

import fusee
import fusee.dev
from fusee.ai import AssistantMessage, ModelRequest, ToolCall, loop, tool
from fusee.testing import Reply, ScriptedModel, tool_call

# Slack, standing in: what was posted, (text, completion token), read by a person
posts, slack = anyio.create_memory_object_stream[tuple[str, str]](math.inf)
REFUNDS: dict[str, int] = {}  # the payment service, standing in: one refund per key


def refund(order: str, amount: int, s: fusee.StepInfo) -> str:
    """Refunds an order.

    Args:
        order: the order's number.
        amount: the amount to refund, in EUR.
    """
    REFUNDS.setdefault(s.key, amount)  # s.key: <the step's key>-<the model's tool-call ID>
    return f"refunded {amount} EUR on order {order}"


async def ask(cb: fusee.Completion, call: ToolCall) -> None:
    """Asks a person: posts the call and the completion's URL to (a stand-in) Slack."""
    args = msgspec.json.decode(call.arguments)
    text = f"Refund {args['amount']} EUR on order {args['order']}? {cb.url}"
    print(f"  [slack] {text}", flush=True)
    await posts.send((text, cb.token))


def scripted(request: ModelRequest, n: int) -> Reply:
    """The stand-in model: propose the refund, then tell the customer what came of it."""
    if not any(isinstance(m, AssistantMessage) for m in request.messages):
        order = request.messages[-1].content.split()[-1]
        return tool_call("refund", f"call_refund_{order}", order=order, amount=40)
    return f"About your refund: {request.messages[-1].content}."


model = ScriptedModel(scripted)


@fusee.workflow("approval")
async def support(ctx: fusee.Context, ticket: str) -> str:
    result = await loop(
        ctx,
        "agent",
        model=model,
        prompt=ticket,
        tools={"refund": tool(refund, approve=ask, approve_timeout="1d")},
    )
    return result.text


async def main(engine: fusee.Engine) -> None:
    stamp = time.strftime("%m%d-%H%M%S")
    for order, answer in [("1042", True), ("1043", {"approved": False, "reason": "over 30 EUR"})]:
        print()
        run = await engine.start(support, f"approval-{stamp}-{order}", f"Damaged parcel, {order}")
        with anyio.fail_after(30):
            _, token = await slack.receive()  # a person reads Slack
        await engine.complete(token, answer)
        print(f"  answered {answer} -> {await run.result(timeout='30s')}\n")
        print("\n".join(fusee.dev.format_journal(await run.journal())))
