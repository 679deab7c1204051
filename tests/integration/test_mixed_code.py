"""Workers that serve different code share one namespace: every run and key is taken by
a worker that has its code, whichever worker owns its partition; a worker that joins
with new code serves it without the others restarting; a run nobody serves says so."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import fusee
from fusee.actors.worker import owner_for
from fusee.runtime.ids import partition_of
from tests.workers.procs import HERE, WorkerProc, Workers, owners, wait_until

PARTITIONS = 16  # so that each worker owns partitions lacking the others' code

SERVED_BY = {
    "common": {"a", "b"},
    "only_a": {"a"},
    "only_b": {"b"},
    "only_c": {"c"},
    "v1": {"a", "c"},
    "v2": {"c"},
}


@pytest.fixture
async def engine16(nats_server: Any, namespace: str) -> AsyncIterator[fusee.Engine]:
    eng = await fusee.connect(nats_server.url, namespace=namespace, partitions=PARTITIONS)
    try:
        yield eng
    finally:
        await eng.close()


async def _start(workers: Workers, code: str) -> tuple[WorkerProc, str]:
    workers.module = HERE / f"code_{code}.py"
    proc = await workers.start()
    return proc, proc.find("worker.started")[0]["worker"]


def _run_ids(prefix: str, count: int) -> list[str]:
    """``count`` run IDs, one in each partition in turn."""
    out: list[str] = []
    n = 0
    while len(out) < count:
        rid = f"{prefix}-{n}"
        n += 1
        if partition_of(rid, PARTITIONS) == len(out) % PARTITIONS:
            out.append(rid)
    return out


async def test_three_workers_with_different_code_finish_every_run(
    engine16: fusee.Engine, worker_procs: Any
) -> None:
    workers = worker_procs(partitions=PARTITIONS)
    ids = {}
    for code in "abc":
        _, ids[code] = await _start(workers, code)

    async def balanced() -> bool:
        now = await owners(engine16)
        return all(now[p] == owner_for(p, set(ids.values())) for p in now)

    await wait_until(balanced, timeout=15, what="three workers to share the partitions")

    workflows = ["common", "only_a", "only_b", "only_c"]
    runs = []
    for i, rid in enumerate(_run_ids("mixed", 100)):
        runs.append((workflows[i % 4], await engine16.start(workflows[i % 4], rid, i)))
    tallies = [engine16.object("tally_b", f"k{i}") for i in range(10)]
    seqs = [await t.send("bump", 1) for t in tallies]

    results: dict[str, Any] = {}

    async def one(workflow: str, run: fusee.Run) -> None:
        results[run.run_id] = (workflow, await run.result(timeout=60))

    with anyio.fail_after(90):
        async with anyio.create_task_group() as tg:
            for workflow, run in runs:
                tg.start_soon(one, workflow, run)
    assert len(results) == 100
    for workflow, result in results.values():
        assert result["by"] in SERVED_BY[workflow], (workflow, result)
    for t, seq in zip(tallies, seqs, strict=True):
        assert await t.result(seq, timeout=30) == {"n": 1, "by": "b"}


async def test_a_worker_with_new_code_serves_it_without_restarting_the_old(
    engine16: fusee.Engine, worker_procs: Any
) -> None:
    workers = worker_procs(partitions=PARTITIONS)
    old, old_id = await _start(workers, "a")  # has v1, not v2
    v2 = [await engine16.start("v2", rid, rid) for rid in _run_ids("new", PARTITIONS)]
    v1 = await engine16.start("v1", "old-code", 1)
    assert (await v1.result(timeout=20))["by"] == "a"

    async def says_unserved() -> bool:
        for run in v2:
            info = await run.describe()
            if "no live worker serves workflow 'v2'" not in (info.reason or ""):
                return False
        return True

    await wait_until(says_unserved, timeout=20, what="the v2 runs to say nobody serves them")
    for run in v2:
        assert (await run.describe()).status == "pending"
    # a key of a type only the new code has, in a partition of the old worker's
    tally = engine16.object("tally_c", "new-type")
    queued = await tally.send("bump", 2)

    async def key_unserved() -> bool:
        return "no live worker serves object type 'tally_c'" in (
            (await tally.show()).unserved or ""
        )

    await wait_until(key_unserved, timeout=20, what="the key to say nobody serves its type")

    _, new_id = await _start(workers, "c")  # v1 and v2
    for run in v2:
        assert (await run.result(timeout=30))["by"] == "c"
    assert await tally.result(queued, timeout=30) == {"n": 2, "by": "c"}

    async def key_served() -> bool:  # when handed over, or at the latest when it idles
        return (await tally.show()).unserved is None

    await wait_until(key_served, timeout=15, what="the key's note to go")
    # some of them are in partitions the old worker keeps: handed over, not moved
    kept = [
        r for r in v2 if owner_for(partition_of(r.run_id, PARTITIONS), {old_id, new_id}) == old_id
    ]
    assert kept
    # a run of new code that waits, in a partition the old worker owns: the signal
    # reaches its guest (a parked guest is brought back like an owned run)
    rid = next(
        r
        for r in (f"wait-{n}" for n in range(1000))
        if owner_for(partition_of(r, PARTITIONS), {old_id, new_id}) == old_id
    )
    waiting = await engine16.start("v2_wait", rid, None)

    async def parked() -> bool:
        return (await waiting.describe()).status == "waiting"

    await wait_until(parked, timeout=20, what=f"{rid} to wait for its signal")
    assert await waiting.signal("go", 7)
    assert await waiting.result(timeout=20) == {"got": 7, "by": "c"}
    assert old.alive
    assert len(old.find("worker.started")) == 1  # never restarted
    assert old.find("actor.taken") == []  # it has nothing of v2 to take
