"""Two worker processes share the partitions; when one dies, the other finishes its runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

import fusee
from fusee.runtime.ids import partition_of
from tests.workers.procs import (
    assert_chained,
    chain_input,
    chain_result,
    completed_keys,
    executions,
    owners,
    start_balanced,
)

PARTITIONS = 16  # enough that each of two workers ranks first for some


async def _results(engine: fusee.Engine, runs: dict[str, dict[str, Any]], timeout: float) -> None:
    """Wait for every run, concurrently; each must return what ``chain`` computes."""
    got: dict[str, Any] = {}

    async def one(run_id: str) -> None:
        got[run_id] = await engine.run(run_id).result(timeout=timeout)

    async with anyio.create_task_group() as tg:
        for run_id in runs:
            tg.start_soon(one, run_id)
    assert got == {run_id: chain_result(arg) for run_id, arg in runs.items()}


async def test_two_workers_share_and_fail_over(
    nats_server: Any, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=PARTITIONS)
    try:
        ids = await start_balanced(worker_procs(partitions=PARTITIONS), engine, 2)
        owned = await owners(engine)

        # 50 runs of short steps: each completes, and each step ran exactly once.
        log = tmp_path / "effects.log"
        runs = {f"a-{i}": chain_input(log, steps=3, delay=0.02, tag=f"a-{i}") for i in range(50)}
        for run_id, arg in runs.items():
            await engine.start("chain", run_id, arg)
        await _results(engine, runs, timeout=20)
        counts = executions(log)
        journaled: list[str] = []
        for run_id in runs:
            journal = await engine.run(run_id).journal()
            assert_chained(journal)
            keys = completed_keys(journal)
            assert sorted(keys) == [1, 2, 3]
            journaled += keys.values()
        assert sorted(counts) == sorted(journaled)
        assert set(counts.values()) == {1}, "a step ran more than once without any crash"
        # both workers did some of the work
        for wid, proc in ids.items():
            mine = [p for p, o in owned.items() if o == wid]
            assert mine, f"worker {wid} owns no partition: {owned}"
            assert proc.find("run.completed"), f"worker {proc.name} completed no run"

        # Kill one worker while new runs are in flight: the other finishes all of them.
        owned = await owners(engine)
        victim_id = next(wid for wid in ids if wid == owned[partition_of("b-0", PARTITIONS)])
        victim = ids[victim_id]
        survivor = next(p for p in ids.values() if p is not victim)
        log2 = tmp_path / "effects2.log"
        release = tmp_path / "release-s3"  # no run gets past step 3 before the kill
        runs2 = {f"b-{i}": chain_input(log2, steps=4, delay=0.05, tag=f"b-{i}") for i in range(20)}
        for arg in runs2.values():
            arg["hold"] = {"step": "s3", "until": str(release)}
        for run_id, arg in runs2.items():
            await engine.start("chain", run_id, arg)
        await victim.wait_for("step.completed", run_id="b-0", timeout=10)
        victim.kill()  # every run in flight: none could end before `release`
        assert not [e for e in victim.find("run.completed") if e["run_id"] in runs2]
        release.touch()
        with anyio.fail_after(25):
            await _results(engine, runs2, timeout=25)
        victim_runs = {r for r in runs2 if owned[partition_of(r, PARTITIONS)] == victim_id}
        assert victim_runs, "the victim owned none of the new runs"
        for run_id in victim_runs:
            # the worker logs run.completed just after the record is stored, which is
            # when result() returns: give the line a moment to reach the log file
            await survivor.wait_for("run.completed", run_id=run_id, timeout=5)
        counts = executions(log2)
        journaled = []
        for run_id in runs2:
            journal = await engine.run(run_id).journal()
            assert_chained(journal)
            keys = completed_keys(journal)
            journaled += keys.values()
            assert sorted(keys) == [1, 2, 3, 4]
            ran = [counts[k] for k in keys.values()]
            # one kill: at most the step running at that moment ran a second time
            assert all(n >= 1 for n in ran), (run_id, ran)
            if run_id in victim_runs:
                assert sum(n - 1 for n in ran) <= 1, (run_id, ran)
            else:
                assert set(ran) == {1}, (run_id, ran)
        assert sorted(counts) == sorted(journaled)
    finally:
        await engine.close()
