"""SIGKILL workers again and again while runs sleep, wait for signals and get them: every
run ends with the right result, nothing that finished runs again, no signal is lost."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from fusee.runtime.records import WaitDone
from tests.workers.procs import assert_chained, executions

pytestmark = pytest.mark.chaos

WAITS = Path(__file__).resolve().parent.parent / "workers" / "waits.py"


async def test_kills_while_runs_sleep_and_wait_for_signals(
    nats_server: Any, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    seed = int(os.environ.get("FUSEE_CHAOS_SEED", random.randrange(1 << 30)))
    print(f"FUSEE_CHAOS_SEED={seed}")
    rng = random.Random(seed)
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        workers = worker_procs(partitions=4)
        workers.module = WAITS
        worker = await workers.start()
        log = tmp_path / "effects.log"
        sleepers = {f"s-{i}": rng.uniform(0.5, 3.0) for i in range(6)}
        approvers = [f"a-{i}" for i in range(6)]
        for run_id, nap in sleepers.items():
            await engine.start("sleeper", run_id, {"log": str(log), "sleep": nap})
        for run_id in approvers:
            await engine.start("approver", run_id, {"log": str(log)})

        pending = list(approvers)
        for _ in range(5):
            await anyio.sleep(rng.uniform(0.2, 0.9))
            # signal some of the waiting runs, sometimes while no worker is alive
            for run_id in rng.sample(pending, k=min(len(pending), 2)):
                await engine.run(run_id).signal("approval", {"approved": True}, key="once")
                pending.remove(run_id)
            worker.kill()
            await anyio.sleep(rng.uniform(0.0, 0.5))
            worker = await workers.start()
        for run_id in pending:
            await engine.run(run_id).signal("approval", {"approved": True}, key="once")

        for run_id in sleepers:
            assert await engine.run(run_id).result(timeout=40) == ["before", "slept", "after"]
        for run_id in approvers:
            assert await engine.run(run_id).result(timeout=40) == {
                "approved": True,
                "timed_out": False,
            }
            journal = await engine.run(run_id).journal()
            assert_chained(journal)
            assert sum(isinstance(r, WaitDone) for _, r in journal) == 1
        # a step runs again only if a kill landed between its call and its commit
        counts = executions(log)
        assert len(counts) == 2 * (len(sleepers) + len(approvers)), counts
        assert sum(n - 1 for n in counts.values()) <= 5, counts
    finally:
        await engine.close()
