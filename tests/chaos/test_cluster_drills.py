"""Drills on a 3-node R3 cluster (research/reliability.md §3.3 F3, F11): the stream
leader SIGKILLed under load, a node wiped and brought back, workers restarted in turn.

Every drill checks what a user relies on: every run finishes with its result, nothing
acknowledged is lost (each journal is whole, chained, every step once), and no finished
step runs again (the side-effect file counts every execution, across processes).
"""

from __future__ import annotations

import functools
import itertools
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from tests.cluster import LoopbackCluster, move_leader, stream_leader
from tests.workers.procs import (
    HERE,
    Workers,
    assert_chained,
    chain_input,
    chain_result,
    completed_keys,
    executions,
    wait_until,
)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

PARTITIONS = 8


class WritePause:
    """A probe appending to its own run's journal back to back through the cluster:
    the longest gap between two acknowledged appends is the write pause a client saw."""

    def __init__(self, engine: fusee.Engine) -> None:
        self.engine = engine
        self.acked: list[float] = []
        self.stopped = anyio.Event()

    async def run(self) -> None:
        store, fence, n = self.engine.store, 0, 0
        with store.retrying_for(60.0):
            while not self.stopped.is_set():
                n += 1
                fence = await store.append(
                    "probe", "run.started" if n == 1 else "step.completed", b"{}",
                    fence=fence, msg_id=f"probe:{n}",
                )  # fmt: skip
                self.acked.append(time.monotonic())
                await anyio.sleep(0.005)

    def longest_after(self, t: float) -> float:
        times = [x for x in self.acked if x >= t - 1.0]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def _results(engine: fusee.Engine, runs: dict[str, Any], timeout: float) -> dict[str, Any]:
    got: dict[str, Any] = {}

    async def one(run_id: str) -> None:
        got[run_id] = await engine.run(run_id).result(timeout=timeout)

    with anyio.fail_after(timeout + 5):
        async with anyio.create_task_group() as tg:
            for run_id in runs:
                tg.start_soon(one, run_id)
    return got


async def _check_chains(engine: fusee.Engine, runs: dict[str, Any], log: Path) -> None:
    """Each run returned its result, its journal is whole, and every step ran once."""
    got = await _results(engine, runs, timeout=90)
    assert got == {rid: chain_result(arg) for rid, arg in runs.items()}
    counts = executions(log)
    journaled: list[str] = []
    for rid, arg in runs.items():
        journal = await engine.run(rid).journal()
        assert_chained(journal)
        keys = completed_keys(journal)
        assert sorted(keys) == list(range(1, arg["steps"] + 1)), rid
        journaled += keys.values()
    assert sorted(counts) == sorted(journaled)
    ran_again = {k: n for k, n in counts.items() if n != 1}
    assert not ran_again, f"steps that ran more than once (no worker died): {ran_again}"


async def test_the_stream_leader_sigkilled_under_load(
    nats_cluster: LoopbackCluster, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    """50 runs of 4 steps on two workers; the journal stream's leader is SIGKILLed
    mid-run. The others elect a new one (a write pause of a few seconds, printed),
    the worker that was connected to it reconnects to another node, every run ends."""
    cluster = nats_cluster
    engine = await fusee.connect(
        cluster.urls, namespace=namespace, replicas=3, partitions=PARTITIONS
    )
    try:
        stream = engine.store.layout.stream
        leader = cluster.node("n1")
        await move_leader(cluster, stream, leader)
        workers = worker_procs(url=cluster.url, partitions=PARTITIONS)
        first = await workers.start()
        # the second knows only the leader's address: it must move by the servers the
        # cluster told it about (nats-py's discovered servers)
        second = await workers.start(url=leader.url)
        probe = WritePause(engine)
        log = tmp_path / "effects.log"
        runs = {f"k-{i}": chain_input(log, steps=4, delay=0.05, tag=f"k-{i}") for i in range(50)}
        async with anyio.create_task_group() as tg:
            tg.start_soon(probe.run)
            for rid, arg in runs.items():
                await engine.start("chain", rid, arg)
            await wait_until(lambda: len(executions(log)) >= 40, timeout=30, what="runs under way")
            now = await stream_leader(cluster, stream)
            assert now is leader, f"the leader moved before the kill: {leader.name} -> {now.name}"
            killed_at = time.monotonic()
            leader.kill()
            await wait_until(
                lambda: sum(t > killed_at for t in probe.acked[-20:]) >= 20,
                timeout=30,
                what="20 appends acknowledged after the kill",
            )
            pause = probe.longest_after(killed_at)
            await _check_chains(engine, runs, log)
            probe.stopped.set()
        new_leader = await stream_leader(cluster, stream)
        assert new_leader is not leader
        print(f"\nwrite pause after SIGKILL of stream leader {leader.name}: {pause:.2f} s")
        for w in (first, second):
            assert w.alive, w.tail()
            assert w.find("run.completed"), f"worker {w.name} completed no run"
        # the worker that knew only the killed node's address moved to another node
        moved = {e["server"] for e in second.find("nats.reconnected")}
        assert moved, second.tail()
        assert f"127.0.0.1:{leader.port}" not in moved, moved
        # the killed node comes back and catches up with the new leader
        cluster.restart(leader)
        await wait_until(
            lambda: leader.stream_last_seq(stream) == new_leader.stream_last_seq(stream),
            timeout=30,
            what=f"{leader.name} to catch up",
        )
    finally:
        await engine.close()


async def test_a_node_wiped_and_restarted_catches_up(
    nats_cluster: LoopbackCluster, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    """A node of three loses its disk mid-run (killed, store removed, started again):
    the runs go on on the other two, and the node gets every record back from its peers."""
    cluster = nats_cluster
    engine = await fusee.connect(
        cluster.urls, namespace=namespace, replicas=3, partitions=PARTITIONS
    )
    try:
        stream = engine.store.layout.stream
        await worker_procs(url=cluster.url, partitions=PARTITIONS).start()
        log = tmp_path / "effects.log"
        runs = {f"w-{i}": chain_input(log, steps=4, delay=0.05, tag=f"w-{i}") for i in range(30)}
        for rid, arg in list(runs.items())[:15]:
            await engine.start("chain", rid, arg)
        await wait_until(lambda: len(executions(log)) >= 10, timeout=30, what="runs under way")
        victim = cluster.node("n2")
        victim.kill()
        victim.wipe()
        assert not victim.store.exists()
        for rid, arg in list(runs.items())[15:]:
            await engine.start("chain", rid, arg)  # started with the node away
        cluster.restart(victim)
        await _check_chains(engine, runs, log)
        others = [n for n in cluster.nodes if n is not victim]
        await wait_until(
            lambda: victim.stream_last_seq(stream) == others[0].stream_last_seq(stream) > 0,
            timeout=30,
            what=f"wiped {victim.name} to hold the journal stream again",
        )
        # the wiped node answers reads of every journal by itself
        alone = await fusee.connect([victim.url], namespace=namespace)
        try:
            for rid in runs:
                assert_chained(await alone.run(rid).journal())
        finally:
            await alone.close()
    finally:
        await engine.close()


def _at_least(runs: dict[str, Any], count: int) -> bool:
    return len(runs) >= count


SERVED_BY = {"common": {"a", "b"}, "only_a": {"a"}, "only_b": {"b"}, "only_c": {"c"}}


async def test_a_rolling_restart_of_three_workers_with_different_code(
    nats_cluster: LoopbackCluster, namespace: str, tmp_path: Path
) -> None:
    """Workers a, b, c (different registries: tests/workers/code_*.py) are restarted
    one at a time while 200 runs are started: every run completes, none fails."""
    cluster = nats_cluster
    engine = await fusee.connect(cluster.urls, namespace=namespace, replicas=3, partitions=16)
    pool = {
        code: Workers(cluster.url, namespace, tmp_path, 16, HERE / f"code_{code}.py")
        for code in "abc"
    }
    try:
        procs = {code: await w.start() for code, w in pool.items()}
        workflows = list(SERVED_BY)
        runs: dict[str, tuple[str, fusee.Run]] = {}
        results: dict[str, Any] = {}

        async def start_all() -> None:
            for i in range(200):
                workflow = workflows[i % len(workflows)]
                runs[f"roll-{i}"] = (workflow, await engine.start(workflow, f"roll-{i}", i))
                await anyio.sleep(0.02)  # spread over the restarts, not a deadline

        async with anyio.create_task_group() as tg:
            tg.start_soon(start_all)
            for k, code in enumerate("abc"):
                at = 20 + 60 * k  # each restart while runs are being started
                await wait_until(
                    functools.partial(_at_least, runs, at), timeout=30, what=f"{at} runs started"
                )
                assert procs[code].stop() == 0, procs[code].tail()
                procs[code] = await pool[code].start()
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for rid, (_, run) in runs.items():

                    async def one(rid: str = rid, run: fusee.Run = run) -> None:
                        results[rid] = await run.result(timeout=110)

                    tg.start_soon(one)
        assert len(results) == 200
        for rid, (workflow, _) in runs.items():
            assert results[rid]["by"] in SERVED_BY[workflow], (rid, workflow, results[rid])
    finally:
        for w in pool.values():
            w.cleanup()
        await engine.close()
