"""nats-server is SIGKILLed mid-run and restarted on the same store: nothing acked is lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

import fusee
from fusee.adapters.jetstream.server import EmbeddedServer
from tests.workers.procs import (
    assert_chained,
    chain_input,
    chain_result,
    completed_keys,
    executions,
)


async def test_run_survives_a_server_crash(
    nats_server_private: EmbeddedServer, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    server = nats_server_private
    engine = await fusee.connect(server.url, namespace=namespace, partitions=2)
    try:
        worker = await worker_procs(url=server.url, partitions=2).start()
        log = tmp_path / "effects.log"
        release = tmp_path / "release-s3"  # step 3 runs through the crash: held open
        arg = chain_input(log, steps=6, delay=0.05, tag="restart")
        arg["hold"] = {"step": "s3", "until": str(release)}
        run = await engine.start("chain", "r-restart", arg)
        await worker.wait_for("step.completed", run_id="r-restart", pos=2, timeout=10)

        port = server.port
        server.kill()
        # Every step.completed the worker logged was acked by the server before the kill.
        acked = {e["pos"] for e in worker.find("step.completed", run_id="r-restart")}
        assert acked == {1, 2}
        await anyio.to_thread.run_sync(server.restart)
        assert server.port == port
        release.touch()

        assert await run.result(timeout=25) == chain_result(arg)
        journal = await run.journal()
        assert_chained(journal)
        keys = completed_keys(journal)
        assert sorted(keys) == [1, 2, 3, 4, 5, 6]
        counts = executions(log)
        assert sorted(counts) == sorted(keys.values())
        for pos in acked:
            assert counts[keys[pos]] == 1, f"step {pos} was acked before the crash and ran again"
        # the step running at the crash may have run once more; nothing else did
        assert sum(n - 1 for n in counts.values()) <= 1, counts
        assert worker.alive
    finally:
        await engine.close()


async def test_objects_survive_a_server_crash(
    nats_server_private: EmbeddedServer, namespace: str, worker_procs: Any, tmp_path: Path
) -> None:
    """Invocations acknowledged before the crash all run, once each, in order."""
    server = nats_server_private
    engine = await fusee.connect(server.url, namespace=namespace, partitions=2)
    try:
        workers = worker_procs(url=server.url, partitions=2)
        workers.module = Path(__file__).resolve().parent.parent / "workers" / "objects.py"
        worker = await workers.start()
        counter = engine.object("counter", "through-a-crash")
        release = tmp_path / "release"  # the third call's step waits for it
        seqs = []
        for n in range(6):
            arg: dict[str, Any] = {"client": "c", "n": n, "step_delay": 0.05}
            if n == 2:
                arg["until"] = str(release)
            seqs.append(await counter.send("add", arg))
        await worker.wait_for("invocation.completed", key="through-a-crash", timeout=15)
        port = server.port
        server.kill()  # the third call cannot have finished: calls 3..6 span the crash
        assert len(worker.find("invocation.completed", key="through-a-crash")) <= 2
        await anyio.to_thread.run_sync(server.restart)
        assert server.port == port
        release.touch()

        assert [await counter.result(s, timeout=30) for s in seqs] == [1, 2, 3, 4, 5, 6]
        state = await counter.state()
        assert state["count"] == 6
        assert state["seen"] == [f"c:{n}" for n in range(6)]
        assert worker.alive
    finally:
        await engine.close()
