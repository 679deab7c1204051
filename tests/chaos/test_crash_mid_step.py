"""SIGKILL the worker in the middle of a step: the run resumes on a new worker at the
running step, with the same ``s.key``; nothing that completed runs again."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from tests.workers.procs import (
    assert_chained,
    chain_input,
    chain_result,
    completed_keys,
    execution_lines,
    executions,
    wait_until,
)

pytestmark = pytest.mark.chaos


async def test_kill_during_third_step(
    nats_server: Any, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=2)
    try:
        procs = worker_procs(partitions=2)
        first = await procs.start()
        log = tmp_path / "effects.log"
        release = tmp_path / "release-s3"  # step 3 blocks until this file exists
        arg = chain_input(log, steps=5, delay=0.05, tag="crash")
        arg["hold"] = {"step": "s3", "until": str(release)}
        run = await engine.start("chain", "r-crash", arg)

        def in_step_3() -> bool:  # its body began: it wrote its line, then blocked
            return [name for name, _, _ in execution_lines(log)] == ["s1", "s2", "s3"]

        await wait_until(in_step_3, timeout=10, what="step 3 to begin")
        first.kill()  # step 3 cannot finish before `release` exists: the kill is mid-step
        journal = await run.journal()
        assert sorted(completed_keys(journal)) == [1, 2], "the kill did not land in step 3"

        release.touch()
        second = await procs.start()
        assert await run.result(timeout=20) == chain_result(arg)
        assert second.find("run.resumed", run_id="r-crash")

        journal = await run.journal()
        assert_chained(journal)
        keys = completed_keys(journal)
        assert sorted(keys) == [1, 2, 3, 4, 5]
        lines = execution_lines(log)
        ran = {pos: [ln for ln in lines if ln[1] == key] for pos, key in keys.items()}
        assert len(ran[1]) == 1, lines
        assert len(ran[2]) == 1, f"step 2 completed before the kill and ran again: {lines}"
        assert len(ran[3]) == 2, f"step 3 should run once on each worker: {lines}"
        assert {ln[1] for ln in ran[3]} == {keys[3]}  # the same s.key both times
        assert len(ran[4]) == len(ran[5]) == 1, lines
        assert sorted(executions(log)) == sorted(keys.values())
    finally:
        await engine.close()


@pytest.mark.slow
async def test_random_kills(
    nats_server: Any, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    seed = int(os.environ.get("FUSEE_CHAOS_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    print(f"FUSEE_CHAOS_SEED={seed}")
    iterations, runs_per, steps, delay = 20, 3, 4, 0.12
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        procs = worker_procs(partitions=4)
        worker = await procs.start()
        for i in range(iterations):
            log = tmp_path / f"effects-{i}.log"
            runs = {
                f"i{i}-r{j}": chain_input(log, steps=steps, delay=delay, tag=f"{i}.{j}")
                for j in range(runs_per)
            }
            for run_id, arg in runs.items():
                await engine.start("chain", run_id, arg)
            # a random point within the runs' duration (they run concurrently)
            await anyio.sleep(rng.uniform(0, steps * delay))
            worker.kill()
            worker = await procs.start()
            for run_id, arg in runs.items():
                context = f"seed {seed}, iteration {i}, run {run_id}"
                result = await engine.run(run_id).result(timeout=20)
                assert result == chain_result(arg), context
                journal = await engine.run(run_id).journal()
                assert_chained(journal)
                keys = completed_keys(journal)
                assert sorted(keys) == list(range(1, steps + 1)), context
                counts = executions(log)
                ran = [counts[k] for k in keys.values()]
                # one kill per iteration: at most the step running then ran once more
                assert min(ran) >= 1, (context, ran)
                assert sum(n - 1 for n in ran) <= 1, (context, ran, execution_lines(log))
            journaled: list[str] = []
            for run_id in runs:
                journaled += completed_keys(await engine.run(run_id).journal()).values()
            assert sorted(executions(log)) == sorted(journaled), (
                f"seed {seed}, iteration {i}: side effects of steps that are not journaled"
            )
    finally:
        await engine.close()
