"""A refund that waits for a person: the agent proposes, a human approves, the tool runs.

    fusee dev examples/refund.py

The run waits for the signal "approval" for up to a day, holding no memory while it
waits: its worker could restart, or another take over, and the approval still lands.
Here `main` plays the human and approves after a moment; from a shell you would send

    fusee runs signal <run-id> approval '{"approved": true, "by": "ana"}'

A refused or missing approval takes the other branch: nothing is refunded.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import fusee
import fusee.dev

REFUNDS: dict[str, int] = {}  # the payment service, standing in


async def propose(order: str) -> dict[str, Any]:
    await asyncio.sleep(0.2)  # the model reads the ticket
    return {"order": order, "amount": 40, "why": "parcel arrived damaged"}


async def refund(order: str, amount: int, *, idempotency_key: str) -> str:
    await asyncio.sleep(0.1)
    REFUNDS.setdefault(idempotency_key, amount)  # paying twice with one key pays once
    return f"refunded {amount} EUR on order {order}"


@fusee.workflow("refund")
async def refund_flow(ctx: fusee.Context, order: str) -> str:
    proposal = await ctx.step("model:propose", lambda: propose(order))
    try:
        decision = await ctx.wait_for("approval", timeout="1d")
    except fusee.Timeout:
        return f"no decision on the refund for order {order} within a day; nothing refunded"
    if not decision.get("approved"):
        return f"refund for order {order} refused by {decision.get('by', 'someone')}"
    return await ctx.step(
        "tool:refund",
        lambda s: refund(order, proposal["amount"], idempotency_key=s.key),
    )


async def main(engine: fusee.Engine) -> None:
    run_id = f"refund-1042-{time.strftime('%m%d-%H%M%S')}"
    run = await engine.start(refund_flow, run_id, "1042")
    print(f"\n  run {run_id} proposes a refund and waits for approval...")
    await asyncio.sleep(1.5)  # a person reads the proposal (the run has left memory by now)
    info = await run.describe()
    print(f"  status while it waits: {info.status}")
    await run.signal("approval", {"approved": True, "by": "ana"})
    print(f"  approved by ana -> {await run.result(timeout='30s')}\n")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
