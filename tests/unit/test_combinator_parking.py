"""Inside ``ctx.all`` / ``ctx.race`` a run parks only once every branch waits with its
timer set: a branch whose timer is still being scheduled is busy, not idle.

A sibling whose idle time runs out while the other branch's ``schedule_timer`` is in
flight must keep the run in memory (``wait.kept``); parking then would cancel the
schedule and leave a ``wait.started(until=...)`` with no timer to wake it (the review of
issue 11 found this). The schedule is held open until the sibling has decided, with an
event the test controls, not by sleeping.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import msgspec

import fusee
from fusee.actors import core as core_module
from fusee.actors.registry import Registry, Workflow
from fusee.runtime.records import RunStarted, encode_record
from tests.memory_store import MemoryStore, run_actor


class HeldTimers(MemoryStore):
    """Scheduling a timer waits until ``release`` is set (NATS slow, the store retrying)."""

    release: anyio.Event | None = None

    async def schedule_timer(
        self, eid: str, partition: int, pos: int, until: float, *, start: int = 0
    ) -> None:
        if pos == 2 and self.release is not None:  # the sleep's timer, not the signal's
            await self.release.wait()
        await super().schedule_timer(eid, partition, pos, until, start=start)


async def _both(ctx: fusee.Context, _arg: Any) -> Any:
    return await ctx.all([ctx.wait_for("go"), ctx.sleep(3600)])


class _Log:
    """The core's logger, watched: ``wait.kept`` releases the held schedule."""

    def __init__(self, real: Any, kept: anyio.Event) -> None:
        self.real, self.kept = real, kept

    def debug(self, event: str, **kw: Any) -> None:
        if event == "wait.kept":
            self.kept.set()
        self.real.debug(event, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_branch_setting_its_timer_keeps_the_run_in_memory(monkeypatch: Any) -> None:
    store = HeldTimers()
    started = RunStarted(workflow="both", input=msgspec.Raw(b"0"), started_at=time.time())
    store.seed("r", encode_record(started))
    registry = Registry()
    registry.add(Workflow("both", _both, Any, True))
    actor = run_actor(store, registry, clock=time.time, park_after=0.05)

    async def go() -> str:
        kept = anyio.Event()
        store.release = kept  # the sleep's schedule lands once the signal's wait kept
        monkeypatch.setattr(core_module, "log", _Log(core_module.log, kept))
        with anyio.fail_after(10):
            return await actor.run()

    outcome = anyio.run(go)
    assert outcome == "parked"
    assert ("r", 2) in store.timers  # parked with the sleep's timer set
