"""Workflows and an object for the web UI's browser test (tests/e2e/test_ui.py).

``ui-stream``: one ``model_call`` whose token ``i`` (``"t<i> "``) is written only once the
file ``<arg["gate"]>.<i>`` exists, so the test releases each token itself and watches it
arrive in the page. ``ui-wait``: waits for the signal ``go`` (to be cancelled).
``ui-pause``: a step that fails until the file ``arg["fixed"]`` exists, paused when its
one attempt runs out. ``ui-approve``: asks for the approval ``refund`` (a completion
wait) and returns its value. ``ui-slot``: a step under the limit ``ui-slot``, held until
the file ``arg["gate"]`` exists. ``ui-long``: ``arg["steps"]`` steps (the 500-step run
page).
``ui-cart``: an object whose ``add`` appends an item to ``items`` and whose ``hold``
runs until a file exists.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import fusee
from fusee.ai import model_call
from tests.workers.effects import wait_for_file

PAUSE = fusee.Retry(attempts=1, on_exhausted="pause")


def token(i: int) -> str:
    return f"t{i} "


@fusee.workflow("ui-stream")
async def ui_stream(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    async def source(resume: str) -> AsyncIterator[str]:
        for i in range(len(resume.split()), arg["tokens"]):
            await wait_for_file(f"{arg['gate']}.{i}")
            yield token(i)

    return await model_call(ctx, "model-0", source)


@fusee.workflow("ui-wait")
async def ui_wait(ctx: fusee.Context, arg: Any) -> Any:
    await ctx.step("prepare", lambda: "ready")
    return await ctx.wait_for("go")


@fusee.workflow("ui-pause")
async def ui_pause(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    def provider() -> str:
        if not Path(arg["fixed"]).exists():
            raise ConnectionError("the provider is down")
        return "answered"

    answer: str = await ctx.step("provider", provider, retry=PAUSE)
    return answer


@fusee.workflow("ui-approve")
async def ui_approve(ctx: fusee.Context, arg: Any) -> Any:
    approval = await ctx.await_completion("refund")
    await ctx.step("after-approval", lambda: "refunded" if approval is True else "kept")
    return approval


@fusee.workflow("ui-slot")
async def ui_slot(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    """One step under the limit ``ui-slot`` (fairness key ``arg["key"]``), held until the
    file ``arg["gate"]`` exists: a holder, and waiters behind it."""

    async def held() -> str:
        await wait_for_file(arg["gate"])
        return "done"

    done: str = await ctx.step("slot", held, limit="ui-slot", fairness_key=arg["key"])
    return done


@fusee.workflow("ui-long")
async def ui_long(ctx: fusee.Context, arg: dict[str, Any]) -> int:
    for i in range(arg["steps"]):
        await ctx.step(f"turn-{i}", lambda i=i: {"turn": i, "text": f"answer {i} " * 4})
    return int(arg["steps"])


async def add(ctx: Any, item: str) -> list[str]:
    items: list[str] = [*ctx.state.get("items", []), item]
    ctx.state.set("items", items)
    return items


async def hold(ctx: Any, gate: str) -> str:
    """Runs until the file ``gate`` exists (or it is cancelled): an invocation to cancel."""
    await wait_for_file(gate)
    return "released"


carts = fusee.object("ui-cart", {"add": add, "hold": hold})
