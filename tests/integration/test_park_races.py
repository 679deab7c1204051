"""Signals that come in the windows around a wait: while its timer is being set, and
while its run is leaving memory to park. Each window is held open by a hook on the
real store (the test decides when the store call goes on), so nothing here depends on
timing: before the fix, the signal in each was left unread."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import fusee
from fusee.runtime.ids import escape
from fusee.runtime.records import ObjectDone
from tests.helpers import hold_index_write, hold_store_call, poked_at
from tests.workers.procs import wait_until

pytestmark = pytest.mark.timeout(60)


@fusee.workflow("park_race")
async def park_race(ctx: fusee.Context, timeout: str | None) -> Any:
    return await ctx.wait_for("go", timeout=timeout)


async def test_a_signal_while_the_run_leaves_memory_to_park(engine: fusee.Engine) -> None:
    eid = escape("race-park")
    # the run's last write before it leaves memory: its index entry saying "waiting"
    entered, release = hold_index_write(engine, eid, "waiting")
    async with engine.worker() as worker:
        poked = poked_at(worker, eid)
        run = await engine.start(park_race, "race-park", None)
        await entered.wait()  # it decided to park; its inbox is no longer watched
        await run.signal("go", {"n": 1})
        await poked.wait()  # the worker delivered the signal, to the leaving actor
        release.set()
        assert await run.result(timeout=15) == {"n": 1}


async def test_a_signal_while_the_wait_sets_its_timer(engine: fusee.Engine) -> None:
    entered, release = hold_store_call(
        engine, "schedule_timer", lambda e, *_, **__: e == escape("race-timer")
    )
    async with engine.worker() as worker:
        poked = poked_at(worker, escape("race-timer"))
        run = await engine.start(park_race, "race-timer", "1d")
        await entered.wait()
        await run.signal("go", {"n": 2})
        await poked.wait()  # read by the running actor while its timer is set
        release.set()
        with anyio.fail_after(10):  # not a day later, when the timer fires
            assert await run.result(timeout=10) == {"n": 2}


async def _bump(ctx: Any) -> int:
    n = int(ctx.state.get("n", 0)) + 1
    ctx.state.set("n", n)
    return n


bumpers = fusee.object("park_race_bumper", {"bump": _bump})


async def test_a_call_while_the_object_goes_idle(engine: fusee.Engine) -> None:
    bumper = escape("@park_race_bumper/k")
    idling = anyio.Event()
    real_mark_idle = engine.store.mark_idle

    async def mark_idle(partition: int, eid: str, ttl: float) -> None:
        await real_mark_idle(partition, eid, ttl)
        if eid == bumper:
            idling.set()

    engine.store.mark_idle = mark_idle  # type: ignore[method-assign]
    # the worker's look at the inbox after the idle marker is written, held once answered
    # (empty): what comes now, it did not see
    entered, release = hold_store_call(
        engine, "read_inbox", lambda p, e, *_, **__: idling.is_set(), after=True
    )
    async with engine.worker() as worker:
        key = bumpers.key("k", engine=engine)
        assert await key.call("bump") == 1
        await entered.wait()  # it went idle, and reads its inbox once more
        poked = poked_at(worker, bumper, hints=1)  # the sender's hint: it found the idle marker
        # sent, not called: no caller waits and looks again, the worker alone must see it
        seq = await key.send("bump")
        await poked.wait()  # the invocation and the hint reached the worker while it left
        release.set()

        async def ran() -> bool:
            journal = await fusee.Run(engine, "@park_race_bumper/k").journal()
            return any(isinstance(r, ObjectDone) and r.inbox_seq == seq for _, r in journal)

        await wait_until(ran, timeout=15, what="the sent invocation to run")
        assert await key.state() == {"n": 2}
