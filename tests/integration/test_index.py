"""The run index: a projection of the journal that never goes back, each run listed once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

import fusee
from fusee.actors.run_index import project_index
from fusee.runtime.ids import partition_of
from fusee.runtime.index import RunInfo, encode_info
from fusee.runtime.records import WaitStarted
from tests.workers.procs import owners, start_balanced, wait_until

WAITS = Path(__file__).resolve().parent.parent / "workers" / "waits.py"
PARTITIONS = 4


async def test_a_frozen_owner_that_parks_late_does_not_move_the_index_back(
    nats_server: Any, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=PARTITIONS)
    try:
        workers = worker_procs(partitions=PARTITIONS)
        workers.module = WAITS
        by_id = await start_balanced(workers, engine, 2)
        run = await engine.start("approver", "r-late-park", {"log": str(tmp_path / "fx.log")})
        owner = by_id[(await owners(engine))[partition_of("r-late-park", PARTITIONS)] or ""]

        async def waiting() -> bool:
            return any(isinstance(r, WaitStarted) for _, r in await run.journal())

        # Frozen while its actor still holds the waiting run (it parks after a second).
        await wait_until(waiting, timeout=10, what="the run to wait")
        owner.freeze()
        try:
            other = next(p for p in by_id.values() if p is not owner)
            await other.wait_for("run.resumed", run_id="r-late-park", timeout=15)
            await run.signal("approval", {"approved": True})
            assert (await run.result(timeout=15))["approved"] is True
        finally:
            owner.thaw()

        # The frozen copy wakes up, finds its wait idle and parks: its index write says
        # "waiting" from an older journal, and must not replace "completed".
        def shut_out() -> list[dict[str, Any]]:
            return (
                owner.find("run.parked", run_id="r-late-park")
                + owner.find("actor.fenced", run_id="r-late-park")
                + owner.find("partition.lost")
            )

        await wait_until(shut_out, timeout=10, what="the frozen owner to let the run go")
        await wait_until(
            lambda: owner.find("partition.lost") or owner.find("partition.released"),
            timeout=10,
            what="the frozen owner to drop the partition",
        )
        infos = {i.run_id: i for i in await engine.list_runs()}
        assert infos["r-late-park"].status == "completed"
        assert (await run.describe()).status == "completed"
    finally:
        await engine.close()


async def test_each_run_is_listed_once_while_entries_change(engine: fusee.Engine) -> None:
    store = engine.store
    n = 1500
    eids = [f"busy-{i}" for i in range(n)]

    def info(i: int, status: Any) -> bytes:
        return encode_info(RunInfo(run_id=eids[i], workflow="w", status=status))

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(store.runs.put, eids[i], info(i, "running"))
    listings: list[list[str]] = []
    stop = anyio.Event()

    async def churn() -> None:
        # entries change while the listing reads them (runs ending as it lists)
        i = 0
        while not stop.is_set():
            await store.runs.put(eids[i % n], info(i % n, "completed"))
            i += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(churn)
        for _ in range(5):
            listings.append([i.run_id for i in await engine.list_runs()])
        stop.set()
    for listed in listings:
        assert len(listed) == len(set(listed)) == n


async def test_an_entry_made_from_less_of_the_journal_is_refused(engine: fusee.Engine) -> None:
    """The frozen owner's late write, made directly: what it would write is refused
    (the process test above may see the owner drop the partition first)."""
    store, eid = engine.store, "stale-writer"
    done = RunInfo(run_id=eid, workflow="w", status="completed")
    assert await project_index(store, eid, done, journal_seq=9)
    late = RunInfo(run_id=eid, workflow="w", status="waiting")
    assert not await project_index(store, eid, late, journal_seq=5)
    starter = RunInfo(run_id=eid, workflow="w", status="pending")
    assert not await project_index(store, eid, starter, journal_seq=9)
    infos = {i.run_id: i for i in await engine.list_runs()}
    assert infos[eid].status == "completed"
