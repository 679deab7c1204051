"""The whole integration scenario in one workflow, for the least-privilege test
(tests/integration/test_nats_permissions.py): a worker whose NATS user has only the
worker role of nats/accounts.conf runs it.

``tour``: a step, a durable sleep, a signal, a token stream (``model_call``) and a
child run. ``tally``: a keyed object with an exclusive and a shared handler.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import fusee
from fusee.ai import model_call


@fusee.workflow("tour_child")
async def tour_child(ctx: fusee.Context, n: int) -> int:
    return int(await ctx.step("triple", lambda: n * 3))


@fusee.workflow("tour")
async def tour(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    first = await ctx.step("first", lambda: arg["n"] + 1)
    await ctx.sleep(arg["sleep"])
    signal = await ctx.wait_for("go")

    async def source(resume: str) -> AsyncIterator[str]:
        for word in ("one ", "two ", "three"):
            yield word

    text = await model_call(ctx, "model-0", source)
    child = await ctx.child(tour_child, f"{ctx.run_id}/child", first)
    return {"first": first, "signal": signal, "text": text, "child": child}


def _bump(ctx: Any, by: int) -> int:
    count = int(ctx.state.get("count", 0)) + by
    ctx.state.set("count", count)
    return count


tally = fusee.object(
    "tally",
    {"bump": _bump, "peek": fusee.shared(lambda ctx: ctx.state.get("count", 0))},
)
