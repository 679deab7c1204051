"""Review repro (fix/lim): a fast grant is named by a per-limit negative counter (-1,
-2, ...) and ActorCore.held is keyed by that number alone. A run holding fast permits
of two limits at once (ctx.all) holds -1 of each: held[-1] is overwritten, the first
release goes to the wrong limit, that limit frees a permit still in use, and the other
limit's permit is neither renewed nor released."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import fusee
from fusee.actors.registry import Registry, Workflow
from tests.workers.procs import wait_until

pytestmark = pytest.mark.timeout(120)


async def test_a_run_holding_permits_of_two_limits_releases_each_to_its_own(
    engine: fusee.Engine,
) -> None:
    await engine.limit("la", concurrent=1)
    await engine.limit("lb", concurrent=1)
    a_in, b_in, a_go, b_go = anyio.Event(), anyio.Event(), anyio.Event(), anyio.Event()

    async def step_a() -> str:
        a_in.set()
        await a_go.wait()
        return "a"

    async def step_b() -> str:
        b_in.set()
        await b_go.wait()
        return "b"

    async def pair(ctx: fusee.Context, _: Any) -> list[Any]:
        return await ctx.all([ctx.step("a", step_a, limit="la"), ctx.step("b", step_b, limit="lb")])

    registry = Registry()
    registry.add(Workflow("pair", pair, Any, True))

    async def shown(want: dict[str, int]) -> bool:
        got = {i.name: i.holders for i in await engine.limits()}
        return got == want

    async with engine.worker(registry=registry):
        run = await engine.start("pair", "pair-1", None)
        with anyio.fail_after(30):
            await a_in.wait()
            await b_in.wait()
        await wait_until(lambda: shown({"la": 1, "lb": 1}), timeout=30, what="both held")
        a_go.set()  # step a ends: its permit of "la" is released, b still holds "lb"'s
        await wait_until(
            lambda: shown({"la": 0, "lb": 1}), timeout=15, what="la released, lb still held"
        )
        b_go.set()
        assert await run.result(timeout=30) == ["a", "b"]


async def test_a_permit_of_one_limit_is_not_freed_by_the_release_of_another(
    engine: fusee.Engine,
) -> None:
    """The consequence: once step a (limit "la") ends, limit "lb" believes its only
    permit free while step b still holds it, and grants it to another run: two
    attempts in flight under lb's concurrent=1."""
    await engine.limit("la", concurrent=1)
    await engine.limit("lb", concurrent=1)
    a_in, b_in, a_go, b_go = anyio.Event(), anyio.Event(), anyio.Event(), anyio.Event()
    in_lb: list[str] = []
    peak = 0

    async def step_a() -> str:
        a_in.set()
        await a_go.wait()
        return "a"

    async def step_b() -> str:
        nonlocal peak
        in_lb.append("b")
        peak = max(peak, len(in_lb))
        b_in.set()
        await b_go.wait()
        in_lb.remove("b")
        return "b"

    async def step_c() -> str:
        nonlocal peak
        in_lb.append("c")
        peak = max(peak, len(in_lb))
        in_lb.remove("c")
        return "c"

    async def pair(ctx: fusee.Context, _: Any) -> list[Any]:
        return await ctx.all([ctx.step("a", step_a, limit="la"), ctx.step("b", step_b, limit="lb")])

    async def solo(ctx: fusee.Context, _: Any) -> str:
        return str(await ctx.step("c", step_c, limit="lb"))

    registry = Registry()
    registry.add(Workflow("pair", pair, Any, True))
    registry.add(Workflow("solo", solo, Any, True))
    async with engine.worker(registry=registry):
        run = await engine.start("pair", "pair-2", None)
        with anyio.fail_after(30):
            await a_in.wait()
            await b_in.wait()
        a_go.set()
        await wait_until(
            lambda: None if run is None else _ended(engine, "pair-2", "a"),
            timeout=30,
            what="step a ended",
        )
        c = await engine.start("solo", "solo-1", None)

        async def c_ran_or_waits() -> bool:
            infos = {i.name: i for i in await engine.limits()}
            return peak > 1 or infos["lb"].waiters == {"": 1}

        await wait_until(c_ran_or_waits, timeout=30, what="c waiting for lb (or running)")
        assert peak == 1, "two attempts in flight under lb's concurrent=1"
        b_go.set()
        assert await run.result(timeout=30) == ["a", "b"]
        assert await c.result(timeout=30) == "c"


async def _ended(engine: fusee.Engine, run_id: str, step: str) -> bool:
    """Step ``step`` of ``run_id`` is journaled completed (its permit released)."""
    from fusee.runtime.ids import escape
    from fusee.runtime.records import StepCompleted, decode_record

    for rec in await engine.store.read_journal(escape(run_id)):
        r = decode_record(rec.data)
        if isinstance(r, StepCompleted) and r.name == step:
            return True
    return False
