"""Undo on failure: an agent that books registers how to undo each booking. If the run
fails or is cancelled, the compensations run, newest first.

    fusee dev examples/patterns/undo_on_failure.py

Each booking is a step that passes its key as the idempotency key; right after it,
``ctx.compensate`` registers the undo (journaling nothing). The flight is sold out, so
the run fails, and before it ends the car and then the hotel are cancelled, each as the
durable step ``compensate:<name>``: a crash during the undo resumes it, and nothing
undone is undone twice. A trip that completes undoes nothing.

The model is scripted and the services are dicts, so this runs offline.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

import fusee
import fusee.dev
from fusee.ai import ModelRequest, generate
from fusee.testing import ScriptedModel


class Plan(msgspec.Struct):
    city: str
    nights: int
    flight: str


def plan(request: ModelRequest, n: int) -> dict[str, Any]:
    city = getattr(request.messages[-1], "content", "").rsplit(" ", 1)[-1]
    return {"city": city, "nights": 3, "flight": "LH 99" if city == "Atlantis" else "LH 12"}


model = ScriptedModel(plan)


class SoldOut(Exception):
    """No seat left: trying again does not help."""


BOOKINGS: dict[str, dict[str, Any]] = {}  # the booking services, standing in


def book(kind: str, what: str, key: str) -> str:
    booking = f"{kind[0].upper()}-{key}"
    BOOKINGS.setdefault(booking, {"what": what, "status": "booked"})  # one per key
    return booking


def cancel(booking: str) -> str:
    BOOKINGS[booking]["status"] = "cancelled"
    return f"cancelled {booking}"


def buy_ticket(flight: str, key: str) -> str:
    if flight == "LH 99":
        raise SoldOut(f"flight {flight} is sold out")
    return book("ticket", flight, key)


@fusee.workflow("book-trip")
async def book_trip(ctx: fusee.Context, request: str) -> dict[str, str]:
    trip = (await generate(ctx, "model:plan", model=model, prompt=request, output=Plan)).output
    hotel = await ctx.step("tool:book-hotel", lambda s: book("hotel", trip.city, s.key))
    ctx.compensate("tool:cancel-hotel", lambda: cancel(hotel))
    car = await ctx.step("tool:rent-car", lambda s: book("car", trip.city, s.key))
    ctx.compensate("tool:cancel-car", lambda: cancel(car))
    ticket = await ctx.step(
        "tool:buy-ticket",
        lambda s: buy_ticket(trip.flight, s.key),
        retry=fusee.Retry(attempts=3, non_retryable=(SoldOut,)),
    )
    return {"hotel": hotel, "car": car, "ticket": ticket}


async def main(engine: fusee.Engine) -> None:
    stamp = time.strftime("%m%d-%H%M%S")
    ok = await engine.start(book_trip, f"trip-{stamp}-lisbon", "Three nights in Lisbon")
    print(f"\n  Lisbon: {await ok.result(timeout='30s')}")
    run = await engine.start(book_trip, f"trip-{stamp}-atlantis", "Three nights in Atlantis")
    try:
        await run.result(timeout="30s")
    except fusee.RunFailed as e:
        print(f"  Atlantis: failed, {e.error_type}: {e.message}\n")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
    print("\nThe car, then the hotel, were cancelled: newest first.\n")
