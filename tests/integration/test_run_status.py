"""A run's derived status says whether anyone runs it: ``running`` only while its
partition's owner is alive, ``pending`` once every worker is gone (a worker killed
outright leaves its owner records behind)."""

from __future__ import annotations

from typing import Any

import fusee
from tests.workers.procs import owners, start_balanced

PARTITIONS = 4


async def test_a_run_nobody_can_run_is_pending_not_running(
    nats_server: Any, namespace: str, worker_procs: Any
) -> None:
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=PARTITIONS)
    try:
        procs = await start_balanced(worker_procs(partitions=PARTITIONS), engine, 1)
        (worker,) = procs.values()
        worker.kill()  # SIGKILL: no release, its owner records stay
        assert set((await owners(engine)).values()) == {next(iter(procs))}

        await engine.start("chain", "nobody-runs-me", {"steps": 1})
        info = await engine.run("nobody-runs-me").describe()
        assert info.status == "pending", info
        listed = {i.run_id: i.status for i in await engine.list_runs()}
        assert listed["nobody-runs-me"] == "pending", listed
    finally:
        await engine.close()
