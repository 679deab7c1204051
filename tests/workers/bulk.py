"""Workflows for the bulk-operation tests: each run does what its input's ``mode`` says.

``done`` returns, ``fail`` raises, ``block`` runs a step that never ends (``running``
until cancelled), ``wait`` waits for a signal (``waiting`` once parked), ``pause`` runs a
step that fails until the file ``flag`` exists, pausing when its 2 attempts run out; each
execution of that step appends the run's ID to the file ``log``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

import fusee


def _provider(arg: dict[str, Any], run_id: str) -> str:
    with Path(arg["log"]).open("a") as f:
        f.write(run_id + "\n")
    if not Path(arg["flag"]).exists():
        raise ConnectionError("the provider is down")
    return "answered"


async def _forever() -> None:
    await anyio.sleep(3600)


async def _body(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    mode = arg["mode"]
    if mode == "fail":
        raise ValueError("failed on purpose")
    if mode == "block":
        await ctx.step("block", _forever)
    elif mode == "wait":
        await ctx.wait_for("go")
    elif mode == "pause":
        return str(
            await ctx.step(
                "model",
                lambda: _provider(arg, ctx.run_id),
                retry=fusee.Retry(attempts=2, initial="1ms", max="2ms", on_exhausted="pause"),
            )
        )
    return str(mode)


@fusee.workflow("bk_a")
async def bk_a(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    return str(await _body(ctx, arg))


@fusee.workflow("bk_b")
async def bk_b(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    return str(await _body(ctx, arg))
