"""A worker rides out its nats-server stalling (SIGSTOP) or restarting, and serves again
when it is back; a stop signal ends it within a bounded grace whatever NATS's state.

The stall and the downtime are parameters of the scenario (how long NATS is away), not
sleeps that order events: what the test then waits for, it polls for with a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from fusee.actors.worker import WorkerConfig
from fusee.adapters.jetstream.server import EmbeddedServer
from tests.workers.procs import CHAIN, WorkerProc, chain_input, chain_result, executions, wait_until

# what a stop signal may take at most: the drain of running steps, then a little
GRACE = WorkerConfig().drain_timeout + 4.0
# ... and with a finished step's result still being journaled, its grace too
COMMIT_GRACE = GRACE + WorkerConfig().commit_grace


@pytest.fixture
def server(nats_server_private: EmbeddedServer) -> Iterator[EmbeddedServer]:
    """The test's own server, thawed at the end whatever the test did to it."""
    yield nats_server_private
    if nats_server_private.running:
        os.kill(nats_server_private.pid, signal.SIGCONT)


def _freeze(server: EmbeddedServer) -> None:
    os.kill(server.pid, signal.SIGSTOP)


def _thaw(server: EmbeddedServer) -> None:
    os.kill(server.pid, signal.SIGCONT)


async def _serves(engine: fusee.Engine, tmp_path: Path, run_id: str) -> float:
    """Start a short run now; the seconds until its result came."""
    arg = chain_input(tmp_path / f"{run_id}.log", steps=2, delay=0.01, tag=run_id)
    began = time.monotonic()
    run = await engine.start("chain", run_id, arg)
    assert await run.result(timeout=60) == chain_result(arg)
    return time.monotonic() - began


def _outage_lines(worker: WorkerProc) -> tuple[int, int]:
    return len(worker.find("nats.unreachable")), len(worker.find("nats.reachable"))


@pytest.mark.parametrize("stall", [10.0])
async def test_worker_rides_out_a_stalled_server(
    server: EmbeddedServer, namespace: str, tmp_path: Path, worker_procs: Any, stall: float
) -> None:
    engine = await fusee.connect(server.url, namespace=namespace, partitions=2)
    try:
        worker = await worker_procs(url=server.url, partitions=2).start()
        await _serves(engine, tmp_path, "r-before")

        _freeze(server)
        try:
            await anyio.sleep(stall)  # the scenario: NATS answers nothing for `stall` s
            assert worker.alive, f"the worker exited during the stall:\n{worker.tail()}"
        finally:
            _thaw(server)
        took = await _serves(engine, tmp_path, "r-after-stall")
        print(f"\nserved again {took:.2f}s after a {stall:.0f}s stall")
        assert worker.alive, worker.tail()
        await worker.wait_for("nats.reachable", timeout=15)
        # one line when the outage began, one when it ended: not one per retry
        assert _outage_lines(worker) == (1, 1), worker.tail()
        assert not worker.find("actor.crashed"), worker.tail()
    finally:
        await engine.close()


@pytest.mark.parametrize("stall", [10.0])
async def test_two_workers_keep_their_runs_through_a_stall(
    server: EmbeddedServer, namespace: str, tmp_path: Path, worker_procs: Any, stall: float
) -> None:
    """Nothing is dropped or run twice for the stall: only a fence drops an actor."""
    engine = await fusee.connect(server.url, namespace=namespace, partitions=4)
    try:
        workers = worker_procs(url=server.url, partitions=4)
        procs = [await workers.start(), await workers.start()]
        log = tmp_path / "effects.log"
        arg = chain_input(log, steps=4, delay=0.5, tag="through")
        run = await engine.start("chain", "r-through", arg)
        await wait_until(  # the stall begins while step 2 runs
            lambda: any(w.find("step.completed", run_id="r-through", pos=1) for w in procs),
            timeout=15,
            what="step 1 of r-through",
        )
        _freeze(server)
        try:
            await anyio.sleep(stall)
        finally:
            _thaw(server)
        assert await run.result(timeout=60) == chain_result(arg)
        assert len(executions(log)) == 4
        assert all(n == 1 for n in executions(log).values()), executions(log)
        for w in procs:
            assert w.alive, w.tail()
            assert not w.find("actor.crashed"), w.tail()
            assert not w.find("partition.lost"), w.tail()
    finally:
        await engine.close()


@pytest.mark.parametrize("down", [10.0])
async def test_worker_rides_out_a_server_restart(
    server: EmbeddedServer, namespace: str, tmp_path: Path, worker_procs: Any, down: float
) -> None:
    engine = await fusee.connect(server.url, namespace=namespace, partitions=2)
    try:
        worker = await worker_procs(url=server.url, partitions=2).start()
        await _serves(engine, tmp_path, "r-before")

        port = server.port
        server.kill()
        await anyio.sleep(down)  # the scenario: no server at all for `down` s
        began = time.monotonic()
        await anyio.to_thread.run_sync(server.restart)
        assert server.port == port
        took = await _serves(engine, tmp_path, "r-after-restart")
        print(
            f"\nserved again {took:.2f}s after the restarted server was up "
            f"({time.monotonic() - began:.2f}s after its start)"
        )
        assert worker.alive, worker.tail()
        await worker.wait_for("nats.reachable", timeout=15)
        assert _outage_lines(worker) == (1, 1), worker.tail()
        assert not worker.find("actor.crashed"), worker.tail()
    finally:
        await engine.close()


def _cli_worker(url: str, namespace: str, tmp_path: Path) -> WorkerProc:
    log_path = tmp_path / "cli-worker.log"
    env = {k: v for k, v in os.environ.items() if k not in ("FUSEE_NATS_URL", "FUSEE_STORE")}
    cmd = [sys.executable, "-m", "fusee", "worker", str(CHAIN), "--nats", url]
    cmd += ["--namespace", namespace, "--log-format", "json"]
    with log_path.open("ab") as err:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env
        )
    return WorkerProc("cli", proc, log_path)


@pytest.mark.parametrize("how", ["stopped", "gone", "stopped mid-step"])
async def test_sigterm_ends_a_worker_whose_server_is_away(
    server: EmbeddedServer, namespace: str, tmp_path: Path, how: str
) -> None:
    worker = _cli_worker(server.url, namespace, tmp_path)
    try:
        await worker.wait_for("worker.started", timeout=20)
        if how == "stopped mid-step":
            # a step that ends during the outage: its commit cannot land, the drain
            # gives up after drain_timeout and the commit's grace
            engine = await fusee.connect(server.url, namespace=namespace)
            try:
                arg = chain_input(tmp_path / "effects.log", steps=2, delay=1.0)
                await engine.start("chain", "r-mid-step", arg)
                await worker.wait_for("run.started", run_id="r-mid-step")
            finally:
                await engine.close()
        if how.startswith("stopped"):
            _freeze(server)
        else:
            server.kill()
        worker.proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        try:
            code = worker.proc.wait(timeout=GRACE + 10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {GRACE + 10:.0f}s after SIGTERM:\n{worker.tail()}")
        took = time.monotonic() - began
        print(f"\nexited {took:.2f}s after SIGTERM (server {how}), code {code}")
        bound = COMMIT_GRACE if how == "stopped mid-step" else GRACE
        assert took <= bound, f"{took:.1f}s after SIGTERM, more than {bound}s:\n{worker.tail()}"
        assert code == 0, worker.tail()
    finally:
        worker.kill()


async def test_a_step_that_finished_as_its_worker_stopped_is_committed_not_run_again(
    server: EmbeddedServer, namespace: str, tmp_path: Path
) -> None:
    """SIGTERM just as a step's body returned, its commit waiting for a stalled server:
    the drain does not cancel the commit at ``drain_timeout`` (it logs
    ``drain.committing`` and waits ``commit_grace`` more); the server back, the
    result lands and the worker exits 0; the next worker goes on from it, and the
    step ran once. Before, the drain cancelled the commit and the step ran again."""
    log_file, gate, returned = tmp_path / "effects.log", tmp_path / "gate", tmp_path / "ret"
    arg = chain_input(log_file, steps=2, delay=0.0, tag="finishing")
    arg["hold"] = {"step": "s1", "until": str(gate)}
    arg["returned"] = {"step": "s1", "file": str(returned)}
    worker = _cli_worker(server.url, namespace, tmp_path)
    engine = await fusee.connect(server.url, namespace=namespace)
    try:
        await worker.wait_for("worker.started", timeout=20)
        run = await engine.start("chain", "r-finishing", arg)
        await wait_until(lambda: log_file.exists(), timeout=30, what="s1 running")
        _freeze(server)
        try:
            gate.touch()  # s1's body returns; its commit cannot land
            await wait_until(lambda: returned.exists(), timeout=10, what="s1 returned")
            worker.proc.send_signal(signal.SIGTERM)
            began = time.monotonic()
            waiting = await worker.wait_for("drain.committing", timeout=GRACE)
            assert waiting["run_ids"] == ["r-finishing"], waiting
        finally:
            _thaw(server)
        try:
            code = await anyio.to_thread.run_sync(lambda: worker.proc.wait(COMMIT_GRACE + 10))
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running after SIGTERM:\n{worker.tail()}")
        took = time.monotonic() - began
        assert code == 0, worker.tail()
        assert took <= COMMIT_GRACE, f"{took:.1f}s after SIGTERM:\n{worker.tail()}"
        assert worker.find("step.completed", step="s1"), worker.tail()
        (tmp_path / "second").mkdir()
        second = _cli_worker(server.url, namespace, tmp_path / "second")
        try:
            assert await run.result(timeout=60) == chain_result(arg)
        finally:
            second.kill()
        ran = [line.split()[0] for line in log_file.read_text().splitlines()]
        assert ran.count("s1") == 1, ran  # committed by the stopping worker, not run again
        assert ran.count("s2") == 1, ran
        print(f"\nexited {took:.2f}s after SIGTERM, s1's result committed once NATS answered")
    finally:
        worker.kill()
        await engine.close()
