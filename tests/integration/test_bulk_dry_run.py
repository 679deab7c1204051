"""A dry-run bulk action (issue 12's second review): it asks each run what the real
pass would (``Run.resume(dry_run=True)``, ``Run.cancel(dry_run=True)``), so its summary
says what the pass will do, and it writes nothing, not even the prune of a stale
paused listing that a reader does."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

import fusee
from fusee.adapters.jetstream.store import NatsStore
from fusee.runtime.index import RunInfo, encode_info
from fusee.runtime.records import WaitStarted, encode_record, kind_of
from tests.integration.test_pause_workers import PAUSING, _paused
from tests.workers.procs import wait_until


async def _paused_listings(store: NatsStore) -> list[str]:
    return [eid async for found in store.listed_pages("paused", None) for eid, _, _ in found]


async def test_a_dry_run_writes_nothing(engine: fusee.Engine) -> None:
    store = engine.store
    await store.open_listings()
    raw = encode_info(
        RunInfo(run_id="s-1", workflow="w", status="paused", created_at=time.time(), partition=0)
    )
    await store.put_index("s-1", raw, journal_seq=1, last=0)
    await store.clear_run_active(0, "s-1", listed=raw)  # paused: listed
    await store.mark_run_active(0, "s-1", raw)  # a resume sent, not taken yet
    assert await _paused_listings(store) == ["s-1"]
    summary = await engine.bulk_resume(workflow="w", dry_run=True)
    assert summary.done == 0
    assert await _paused_listings(store) == ["s-1"]  # a dry run changes nothing stored
    await engine.bulk_resume(workflow="w")  # the real pass prunes it, as a reader does
    assert await _paused_listings(store) == []


async def test_a_dry_run_counts_a_gap_pause_as_the_real_pass_does(
    engine: fusee.Engine, tmp_path: Path, worker_procs: Any
) -> None:
    workers = worker_procs()
    workers.module = PAUSING
    await workers.start()
    run = await engine.start("pz_code", "r-gap", {"log": str(tmp_path / "effects.log")})

    async def waiting() -> bool:
        return any(isinstance(r, WaitStarted) for _, r in await run.journal())

    await wait_until(waiting, timeout=20, what="the run to wait for its signal")
    (wait,) = [r for _, r in await run.journal() if isinstance(r, WaitStarted)]
    forged = msgspec.structs.replace(wait, prev=1, prev_hash="0123456789abcdef")
    last = await engine.store.last_in_journal(run.eid)
    assert last is not None
    await engine.store.append(
        run.eid, kind_of(forged), encode_record(forged), fence=last.seq, msg_id="forged"
    )
    await run.signal("go")
    await wait_until(lambda: _paused(run), timeout=20, what="the run to pause on the gap")

    async def listed() -> bool:
        return [i.run_id for i in await engine.list_runs(status="paused")] == ["r-gap"]

    await wait_until(listed, timeout=20, what="the gap pause listed")
    dry = await engine.bulk_resume(workflow="pz_code", dry_run=True)
    real = await engine.bulk_resume(workflow="pz_code")
    assert (real.done, real.skipped, list(real.failed)) == (0, 0, ["r-gap"]), dry
    assert (dry.done, dry.skipped, dry.failed) == (real.done, real.skipped, real.failed)
    assert (await run.describe()).status == "paused"  # neither pass resumed it
