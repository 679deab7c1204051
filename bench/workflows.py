"""Workflows the benchmarks run (imported by the benchmark and by its worker processes)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio

import fusee


@fusee.workflow("bench.noop")
async def noop_steps(ctx: fusee.Context, steps: int) -> int:
    for i in range(steps):
        await ctx.step(f"s{i}", _noop)
    return steps


async def _noop() -> None:
    return None


@fusee.workflow("bench.slow")
async def slow_step(ctx: fusee.Context, seconds: float) -> str:
    await ctx.step("before", _noop)
    await ctx.step("slow", lambda: anyio.sleep(seconds))
    return "done"


@fusee.workflow("bench.wait")
async def wait_for_go(ctx: fusee.Context, _arg: None) -> str:
    return str(await ctx.wait_for("go"))


async def _increment(ctx: fusee.ObjectContext) -> int:
    count: int = ctx.state.get("count", 0) + 1
    ctx.state.set("count", count)
    return count


# bench.objects: one counter per key, each call adds 1 to its state
counter = fusee.object("bench_counter", {"incr": _increment})


def _provider(flag: str) -> str:
    if not Path(flag).exists():
        raise ConnectionError("the provider is down")
    return "answered"


@fusee.workflow("bench.pause")
async def pause_on_provider(ctx: fusee.Context, flag: str) -> str:
    """bench.bulk: a step that pauses its run until the file ``flag`` exists."""
    return str(
        await ctx.step(
            "model",
            lambda: _provider(flag),
            retry=fusee.Retry(attempts=1, on_exhausted="pause"),
        )
    )


def _began() -> float:
    return time.time()


@fusee.workflow("bench.limited")
async def limited_at(ctx: fusee.Context, arg: dict[str, str]) -> list[Any]:
    """bench.limits: one step under limit ``arg["limit"]`` with fairness key
    ``arg["key"]``; the run's result is ``[key, the time its attempt began]``."""
    began = await ctx.step("call", _began, limit=arg["limit"], fairness_key=arg["key"])
    return [arg["key"], began]
