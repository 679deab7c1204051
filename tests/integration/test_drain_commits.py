"""A step's body that returned counts on its actor until its result is journaled
(``results_in_flight``): what a drain past its timeout waits for instead of cancelling
the commit (``Worker._drain``). Every way a step ends gives the count back, so a drain
never waits for a result that is not coming."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import fusee
from fusee.actors.registry import Registry
from fusee.runtime.ids import escape
from tests.helpers import registry_of

pytestmark = pytest.mark.timeout(60)


def _registry(go: anyio.Event, held: anyio.Event, max_value: int) -> Registry:
    tries: dict[str, int] = {}

    async def flaky() -> int:
        tries["flaky"] = tries.get("flaky", 0) + 1
        if tries["flaky"] == 1:
            raise RuntimeError("the first attempt fails")
        return 2

    async def unencodable() -> object:
        return object()  # not JSON: the step fails (NotEncodable)

    async def hold() -> str:
        held.set()
        await go.wait()
        return "done"

    async def ends(ctx: fusee.Context, _arg: Any) -> list[Any]:
        out: list[Any] = [await ctx.step("ok", lambda: 1)]
        out.append(await ctx.step("flaky", flaky, retry=fusee.Retry(attempts=2, initial=0.01)))
        try:
            await ctx.step("unencodable", unencodable, retry=fusee.Retry(attempts=1))
        except fusee.StepFailedError as exc:
            out.append(exc.error_type)
        big = await ctx.step("big", lambda: "x" * (max_value + 10))  # stored out of line
        out.append(len(big))
        out.append(await ctx.step("hold", hold))
        return out

    return registry_of(ends, "ends")


async def test_every_way_a_step_ends_gives_its_result_count_back(engine: fusee.Engine) -> None:
    go, held = anyio.Event(), anyio.Event()
    max_value = engine.store.max_value
    async with engine.worker(registry=_registry(go, held, max_value)) as worker:
        run = await engine.start("ends", "counted", None)
        with anyio.fail_after(30):
            await held.wait()  # in "hold": every step before it ended its own way
        slot = worker.actors[escape("counted")]
        assert slot.actor is not None
        assert slot.actor.results_in_flight == 0
        go.set()
        result = await run.result(timeout=30)
        assert result == [1, 2, "fusee.NotEncodable", max_value + 10, "done"]
