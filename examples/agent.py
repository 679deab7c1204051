"""A support agent: it plans, looks the order up, and answers. Each call is a durable step.

    fusee dev examples/agent.py

The "model" is scripted and the order service is a dict, so this runs offline. Swap in
a real client: the workflow does not change.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import fusee
from fusee.adapters.cli.options import command_hint
from fusee.adapters.cli.render import format_journal

# -- a scripted model and a tool, standing in for real ones -----------------------------

ORDERS = {"1042": {"status": "shipped", "carrier": "DHL", "eta": "Thursday"}}
_seen_keys: set[str] = set()


async def plan(question: str) -> dict[str, Any]:
    """The model reads the question and asks for a tool call."""
    await asyncio.sleep(0.3)  # thinking...
    order = re.search(r"\d+", question)
    return {"tool": "lookup_order", "args": {"order": order.group() if order else "?"}}


async def lookup_order(order: str, *, idempotency_key: str) -> dict[str, Any]:
    """The order service. Its first answer to a key is lost, as a flaky network would."""
    await asyncio.sleep(0.1)
    if idempotency_key not in _seen_keys:
        _seen_keys.add(idempotency_key)
        raise TimeoutError("order service did not answer")
    return {"order": order, **ORDERS.get(order, {"status": "not found"})}


async def answer(question: str, order: dict[str, Any]) -> str:
    """The model writes the reply from the tool's result."""
    await asyncio.sleep(0.3)
    if order["status"] == "not found":
        return f"I could not find order {order['order']}. Could you check the number?"
    return (
        f"Order {order['order']} has {order['status']} with {order['carrier']} "
        f"and should arrive on {order['eta']}."
    )


# -- the workflow -------------------------------------------------------------------------


@fusee.workflow("agent")
async def agent(ctx: fusee.Context, question: str) -> str:
    # Each step's result is journaled in NATS: after a crash the run resumes at the
    # step that was running, and nothing that finished runs again.
    call = await ctx.step("plan", lambda: plan(question))
    order = await ctx.step(
        "tool:lookup_order",
        # s.key is the same on every attempt and after a crash: an idempotency key.
        lambda s: lookup_order(**call["args"], idempotency_key=s.key),
        retry=fusee.Retry(attempts=3, initial="200ms"),
        timeout="10s",
    )
    return await ctx.step("answer", lambda: answer(question, order))


# -- what `fusee dev` runs ----------------------------------------------------------------


async def main(engine: fusee.Engine) -> None:
    run_id = f"support-42-{time.strftime('%m%d-%H%M%S')}"
    question = "Where is my order 1042?"
    run = await engine.start(agent, run_id, question, timeout="15m")
    reply = await run.result(timeout="30s")

    print(f"\n  Q: {question}\n  A: {reply}\n")
    print(f"Journal of run {run_id} (one durable record per line):")
    print("\n".join(format_journal(await run.journal())))
    print(
        "\nThe first lookup_order attempt failed and was retried with the same key."
        "\nThe run and its journal stay in NATS. Look at them again with:"
        f"\n  {command_hint('runs', 'show', run_id)}"
        f"\n  {command_hint('runs', 'list')}\n"
    )
