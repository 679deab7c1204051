"""A trip that books a hotel and a flight, then pays; each booking registers its undo.

A run's input is a dict: ``log`` (a file path), ``pay`` (``"ok"``, ``"fail"``: the card
is declined, or ``"hold"``: the payment hangs until cancelled), ``undo_delay`` (seconds
each compensation takes before its effect), ``bad_undo`` (the name of a compensation that
always fails, or absent), ``undo_hold`` (``{"name": ..., "until": <path>}``: that
compensation waits for the file before its effect; the test creates it). Every effect that happened appends ``<effect> <s.key>
<attempt>`` to ``log`` (as in chain.py), so a test counts effects across processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

import fusee
from tests.workers.effects import record, wait_for_file

UNDO_RETRY = fusee.Retry(attempts=2, initial=0.05, max=0.1)


def _book(arg: dict[str, Any], name: str, result: Any) -> Callable[..., Any]:
    def fn(s: fusee.StepInfo) -> Any:
        record(arg["log"], name, s.key, s.attempt)
        return result

    return fn


def _undo(arg: dict[str, Any], name: str, booking: str) -> Callable[..., Any]:
    hold = arg.get("undo_hold") or {}

    async def fn(s: fusee.StepInfo) -> str:
        await anyio.sleep(arg.get("undo_delay", 0.0))  # not cut short by a cancel
        if hold.get("name") == name:
            await wait_for_file(hold["until"])
        if arg.get("bad_undo") == name:
            record(arg["log"], f"{name}-failed", s.key, s.attempt)
            raise RuntimeError(f"{booking} cannot be cancelled")
        record(arg["log"], name, s.key, s.attempt)
        return f"{booking} cancelled"

    return fn


@fusee.workflow("trip")
async def trip(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    hotel = await ctx.step("tool:book-hotel", _book(arg, "book-hotel", {"id": "H1"}))
    ctx.compensate("tool:cancel-hotel", _undo(arg, "cancel-hotel", hotel["id"]), retry=UNDO_RETRY)
    flight = await ctx.step("tool:book-flight", _book(arg, "book-flight", {"id": "F1"}))
    ctx.compensate(
        "tool:cancel-flight", _undo(arg, "cancel-flight", flight["id"]), retry=UNDO_RETRY
    )

    async def pay(s: fusee.StepInfo) -> str:
        record(arg["log"], "pay", s.key, s.attempt)
        if arg["pay"] == "fail":
            raise fusee.FatalError("card declined")
        if arg["pay"] == "hold":
            await anyio.sleep(60)
        return "paid"

    paid = await ctx.step("tool:pay", pay)
    return {"hotel": hotel["id"], "flight": flight["id"], "paid": paid}
