"""Review repro (fix/lim): "every ROLLUP_EVERY-th snapshot is a rollup, so the journal
holds at most ROLLUP_EVERY" counts commits with ActorCore.commits, which starts at 0 in
each activation. A limit actor that parks between steps (park_after idle: any limit
used now and then) writes 2 snapshots an activation and never reaches the N-th: its
journal is never rolled up and grows without bound (R3 not met)."""

from __future__ import annotations

from typing import Any

import pytest

import fusee
from fusee.runtime.ids import escape
from fusee.runtime.limits import limit_actor_id
from tests.helpers import registry_of as _registry
from tests.workers.procs import wait_until

pytestmark = pytest.mark.timeout(120)


async def _six_uses_parked_between(engine: fusee.Engine, limit: str) -> str:
    """Limit ``limit`` (concurrent=5) used by 6 one-step runs in turn, its actor
    parked before each next one; its eid."""
    await engine.limit(limit, concurrent=5)
    eid = escape(limit_actor_id(limit))

    async def once(ctx: fusee.Context, _: Any) -> str:
        await ctx.step("call", lambda: None, limit=limit)
        return "ok"

    async with engine.worker(registry=_registry(once, "once")) as worker:
        for i in range(6):
            run = await engine.start("once", f"{limit}-{i}", None)
            assert await run.result(timeout=30) == "ok"
            await wait_until(
                lambda: eid not in worker.actors or None, timeout=30, what="the limit parks"
            )
    return eid


async def test_a_limit_that_parks_between_steps_keeps_its_journal_bounded(
    engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fusee.actors import limit_actor as limit_actor_module

    monkeypatch.setattr(limit_actor_module, "ROLLUP_EVERY", 4)
    eid = await _six_uses_parked_between(engine, "sp")
    records = await engine.store.read_journal(eid)
    assert len(records) <= 4, f"{len(records)} snapshots kept, ROLLUP_EVERY=4"


async def test_a_limit_that_parks_between_steps_trims_its_inbox(
    engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for the inbox: ``_untrimmed`` counts per activation, so a limit whose
    activations read fewer than TRIM_AFTER requests each never trims."""
    from fusee.actors import limit_actor as limit_actor_module
    from fusee.runtime.ids import partition_of

    monkeypatch.setattr(limit_actor_module, "TRIM_AFTER", 2)
    eid = await _six_uses_parked_between(engine, "sq")
    p = partition_of(limit_actor_id("sq"), engine.partitions)
    left = await engine.store.read_inbox(p, eid)
    assert len(left) <= 2, f"{len(left)} inbox messages kept, TRIM_AFTER=2"
