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
import fusee.dev

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


# -- a conversation: one keyed object per user ---------------------------------------------


async def ask(ctx: Any, question: str) -> str:
    # Exclusive: one turn at a time per user, in the order the messages came. Each turn
    # is an agent run (a child): its steps are durable, and so is the history below.
    history = ctx.state.get("history") or []
    turn = len(history) // 2 + 1
    reply = await ctx.child(agent, f"chat-{ctx.key}-turn-{turn}", question)
    history += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
    ctx.state.set("history", history)
    return str(reply)


chats = fusee.object(
    "support-chat",
    {"ask": ask, "history": fusee.shared(lambda ctx: ctx.state.get("history") or [])},
)


# -- what `fusee dev` runs ----------------------------------------------------------------


async def main(engine: fusee.Engine) -> None:
    run_id = f"support-42-{time.strftime('%m%d-%H%M%S')}"
    question = "Where is my order 1042?"
    run = await engine.start(agent, run_id, question, timeout="15m")
    reply = await run.result(timeout="30s")

    print(f"\n  Q: {question}\n  A: {reply}\n")
    print(f"Journal of run {run_id} (one durable record per line):")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
    print(
        "\nThe first lookup_order attempt failed and was retried with the same key."
        "\nThe run and its journal stay in NATS. Look at them again with:"
        f"\n  {fusee.dev.hint('runs', 'show', run_id)}"
        f"\n  {fusee.dev.hint('runs', 'list')}\n"
    )

    chat = chats.key("user-7", engine=engine)
    question = "Is order 7 on its way?"
    print(f"  Q (chat user-7): {question}\n  A: {await chat.call('ask', question)}\n")
    turns = await chat.call("history")
    print(f"The chat of user-7 holds {len(turns)} messages, in KV and in its journal:")
    print(f"  {fusee.dev.hint('objects', 'show', 'support-chat', 'user-7')}\n")
