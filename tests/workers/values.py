"""A workflow that takes ctx.now(), ctx.random() and ctx.uuid(), then waits for a signal:
kill its worker while it waits, and the values after the restart must be the same."""

from __future__ import annotations

from typing import Any

import fusee
from tests.workers.effects import record_line as record


@fusee.workflow("values")
async def values(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    taken = {
        "now": ctx.now().isoformat(),
        "random": ctx.random(),
        "uuid": str(ctx.uuid()),
    }
    record(arg["log"], f"code {taken['now']} {taken['random']!r} {taken['uuid']}")
    booked = await ctx.step("book", lambda: f"booking {taken['uuid']}")
    await ctx.wait_for("go")
    return {**taken, "booked": booked, "after": str(ctx.uuid())}
