"""Code of worker "b" for tests of workers that serve different code
(tests/integration/test_mixed_code.py): each module registers its own workflows and
object types, some shared with the other modules, and tags results with its name."""

from __future__ import annotations

from typing import Any

import fusee
from tests.workers.effects import traced

WHO = "b"


async def _work(ctx: fusee.Context, arg: Any) -> dict[str, Any]:
    # a dict argument may name a side-effect log and a file the step waits for
    ran = await ctx.step("work", traced(WHO, arg))
    return {"arg": arg, "by": ran}


fusee.workflow("common")(_work)
fusee.workflow("only_b")(_work)


async def bump(ctx: Any, arg: int) -> dict[str, Any]:
    ctx.state.set("n", (ctx.state.get("n") or 0) + arg)
    return {"n": ctx.state.get("n"), "by": WHO}


fusee.object("tally_b", {"bump": bump})
