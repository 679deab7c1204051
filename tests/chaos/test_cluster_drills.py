"""Drills on a 3-node R3 cluster (research/reliability.md §3.3 F3, F11): the stream
leader SIGKILLed under load, a node wiped and brought back, runs reloaded through
followers at every step, workers restarted in turn.

Every drill checks what a user relies on: every run finishes with its result, nothing
acknowledged is lost (each journal is whole, chained, every step once; the write probe's
journal holds exactly the appends it was acknowledged, on every node), and no finished
step runs again (the side-effect file counts every execution, across processes).
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import time
from pathlib import Path
from typing import Any

import anyio
import nats
import pytest

import fusee
from fusee.actors.worker import owner_for
from fusee.adapters.jetstream.layout import MSG_ID, Layout
from fusee.adapters.jetstream.store import NatsStore
from fusee.runtime.records import StepCompleted
from tests.cluster import LoopbackCluster, move_leader, stream_leader
from tests.workers.procs import (
    HERE,
    WorkerProc,
    Workers,
    assert_chained,
    chain_input,
    chain_result,
    completed_keys,
    execution_lines,
    executions,
    owners,
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
        self.ids: list[str] = []  # the Msg-IDs of the appends acknowledged, in order
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
                self.ids.append(f"probe:{n}")
                await anyio.sleep(0.005)

    async def check_on(self, cluster: LoopbackCluster, namespace: str) -> None:
        """The probe's journal, read through each node alone, holds exactly the
        appends acknowledged: none lost, none twice, in order."""
        for node in cluster.nodes:
            store = await NatsStore.connect([node.url], namespace)
            try:
                got = [m.headers.get(MSG_ID) for m in await store.read_journal("probe")]
            finally:
                await store.close()
            assert got == self.ids, (node.name, len(got), len(self.ids))

    def longest_after(self, t: float) -> float:
        times = [x for x in self.acked if x >= t - 1.0]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


class FollowerReads:
    """Writers on the leader's node append a record and send an inbox message, back
    to back, and read both at once through every follower: what a worker's load and
    its parking read do right after another writer's ack. Each read that misses what
    was acknowledged is kept (``missed``); the writers stop at the first."""

    def __init__(self, writers: list[NatsStore], readers: list[NatsStore]) -> None:
        self.writers, self.readers = writers, readers
        self.missed: list[tuple[str, str, int]] = []
        self.rounds = 0
        self.stopped = anyio.Event()

    async def run(self, *, at_least: int) -> None:
        async with anyio.create_task_group() as tg:
            for k, writer in enumerate(self.writers):
                tg.start_soon(self._write, k, writer, at_least)

    async def _write(self, k: int, writer: NatsStore, at_least: int) -> None:
        for i in itertools.count():
            if self.missed or (self.stopped.is_set() and i >= at_least):
                return
            eid = f"reads-{k}-{i}"
            seq = await writer.append(eid, "run.started", b"x" * 200, fence=0, msg_id=eid)
            sent = await writer.send_inbox(0, eid, "signal", b'{"kind":"signal"}')
            for reader in self.readers:
                if [m.seq for m in await reader.read_journal(eid)] != [seq]:
                    self.missed.append(("journal", eid, seq))
                if [m.seq for m in await reader.read_inbox(0, eid, 0, limit=1)] != [sent]:
                    self.missed.append(("inbox", eid, sent))
            self.rounds += 1

    async def close(self) -> None:
        for store in (*self.writers, *self.readers):
            await store.close()


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
        ids = {w.find("worker.started")[0]["worker"]: w for w in (first, second)}

        async def balanced() -> bool:
            now = await owners(engine)
            return all(now[p] == owner_for(p, set(ids)) for p in now)

        # the second's share handed over before the runs come (they may all end on the
        # first otherwise: CI's replay pass saw w2 complete none)
        await wait_until(balanced, timeout=30, what="the two workers sharing the partitions")
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
        shares = await owners(engine)
        for wid, w in ids.items():
            assert w.alive, w.tail()
            if wid in shares.values():  # (rendezvous may give one worker all 8: 1 in 128)
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
        await probe.check_on(cluster, namespace)
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


async def test_runs_reloaded_through_followers_at_every_step(
    nats_cluster: LoopbackCluster, namespace: str, tmp_path: Path
) -> None:
    """Two workers, each connected to a follower of the journal stream only, evict every
    run after each step (``FUSEE_ALWAYS_REPLAY=1``): each step reloads the run's journal
    and inbox through a replica that may be a write behind the leader's ack. The test
    signals each run from the leader the moment its step ran, so the signal lands while
    the run reloads and parks. Beside them, writers on the leader's node read what they
    were just acknowledged through the followers (``FollowerReads``): the window the
    workers' reads fall in only now and then, opened a few thousand times. Every run
    ends with every signal, every step ran once, no read missed an acknowledged write."""
    cluster = nats_cluster
    engine = await fusee.connect(
        cluster.urls, namespace=namespace, replicas=3, partitions=PARTITIONS
    )
    try:
        stream = engine.store.layout.stream
        leader = await stream_leader(cluster, stream)
        # signals and starts go through the leader's node
        sender = await fusee.connect([leader.url], namespace=namespace)
        pool = Workers(cluster.url, namespace, tmp_path, PARTITIONS, HERE / "waits.py")
        followers = [n for n in cluster.nodes if n is not leader]
        reads = FollowerReads(
            [await NatsStore.connect([leader.url], namespace) for _ in range(4)],
            [await NatsStore.connect([n.url], namespace) for n in followers],
        )
        try:
            for node in followers:
                await pool.start(url=node.url, extra_env={"FUSEE_ALWAYS_REPLAY": "1"})
            log = tmp_path / "effects.log"
            rounds = 2
            runs = {f"f-{i}": {"log": str(log), "rounds": rounds} for i in range(30)}
            for rid, arg in runs.items():
                await sender.start("relay", rid, arg)
            sent: set[str] = set()

            async def signal_what_ran() -> bool:
                for name, _, _ in execution_lines(log):
                    if name not in sent:
                        sent.add(name)
                        rid, step = name.split(".")
                        await sender.run(rid).signal(f"go{step[1:]}", {"n": step})
                return len(sent) >= len(runs) * rounds

            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(reads.run, at_least=100))
                await wait_until(signal_what_ran, timeout=60, what="every step run and signalled")
                got = await _results(sender, runs, timeout=60)
                reads.stopped.set()
            print(f"\nreads through followers right after their acks: {reads.rounds * 4}")
            assert not reads.missed, f"reads through followers missed acked writes: {reads.missed}"
            want = [{"n": f"s{i}"} for i in range(1, rounds + 1)]
            assert got == dict.fromkeys(runs, want)
            ran_again = {k: n for k, n in executions(log).items() if n != 1}
            assert not ran_again, f"steps that ran more than once (no worker died): {ran_again}"
            for w in pool.procs:
                assert w.find("run.completed"), f"worker {w.name} completed no run"
        finally:
            pool.cleanup()
            await reads.close()
            await sender.close()
    finally:
        await engine.close()


def _at_least(runs: dict[str, Any], count: int) -> bool:
    return len(runs) >= count


SERVED_BY = {"common": {"a", "b"}, "only_a": {"a"}, "only_b": {"b"}, "only_c": {"c"}}

# what a worker logs when a run may have two executions: a partition moving, a peer
# judged gone, a fence, a guest let go, an outage, a stop
_MOVES = {
    "partition.acquired",
    "partition.released",
    "partition.lost",
    "worker.gone",
    "actor.fenced",
    "actor.guest_expired",
    "actor.interrupted",
    "nats.unreachable",
    "worker.stopped",
}


def _story(workers: list[WorkerProc], run_ids: set[str]) -> str:
    """The log lines of ``workers`` about ``run_ids`` and the moves that could run a
    step twice, in time order: a failure says what happened."""
    lines = []
    for w in workers:
        for e in w.events():
            if e.get("run_id") in run_ids or e.get("event") in _MOVES:
                keep = ("run_id", "attempt", "partition", "peer", "error", "owner")
                extra = " ".join(f"{k}={e[k]}" for k in keep if k in e)
                lines.append(
                    f"{e.get('timestamp', '')} {w.log_path.parent.name}/{w.name} "
                    f"{e.get('event')} {extra}"
                )
    return "\n".join(sorted(lines))


async def test_a_rolling_restart_of_three_workers_with_different_code(
    nats_cluster: LoopbackCluster, namespace: str, tmp_path: Path
) -> None:
    """Workers a, b, c (different registries: tests/workers/code_*.py) are restarted
    one at a time (SIGTERM, then a new one) while 200 runs are started, each restart
    with a run of its worker's own code mid-step (held on a file until the worker is
    stopping): every run completes on a worker that has its code, each journal holds
    its step once, and no step ran twice (the side-effect log)."""
    cluster = nats_cluster
    engine = await fusee.connect(cluster.urls, namespace=namespace, replicas=3, partitions=16)
    for code in "abc":  # each code's workers log in their own folder
        (tmp_path / code).mkdir()
    pool = {
        code: Workers(cluster.url, namespace, tmp_path / code, 16, HERE / f"code_{code}.py")
        for code in "abc"
    }
    log = tmp_path / "effects.log"
    byes: list[str] = []

    async def on_heartbeat(msg: Any) -> None:
        if json.loads(msg.data).get("bye"):
            byes.append(msg.subject)

    sub = await engine.store.nc.subscribe(engine.store.layout.heartbeat("*"), cb=on_heartbeat)
    try:
        procs = {code: await w.start() for code, w in pool.items()}
        workflows = list(SERVED_BY)
        runs: dict[str, tuple[str, fusee.Run]] = {}
        results: dict[str, Any] = {}

        async def start_all() -> None:
            for i in range(200):
                workflow = workflows[i % len(workflows)]
                rid = f"roll-{i}"
                arg = {"i": i, "log": str(log), "tag": rid}
                runs[rid] = (workflow, await engine.start(workflow, rid, arg))
                await anyio.sleep(0.02)  # spread over the restarts, not a deadline

        async def restart(code: str) -> None:
            """A run only ``code`` serves, held mid-step; its worker stopped off the
            event loop (the stop waits for the step), the step let go once the worker
            says goodbye; then a new worker of that code."""
            rid, hold = f"held-{code}", tmp_path / f"hold-{code}"
            arg = {"log": str(log), "tag": rid, "hold": str(hold)}
            runs[rid] = (f"only_{code}", await engine.start(f"only_{code}", rid, arg))
            await wait_until(
                lambda: any(line[0] == rid for line in execution_lines(log)),
                timeout=30,
                what=f"{rid} mid-step",
            )
            stopped, proc, before = anyio.Event(), procs[code], len(byes)

            async def stop(proc: WorkerProc = proc) -> None:
                code_ = await anyio.to_thread.run_sync(proc.stop)
                assert code_ == 0, proc.tail()
                stopped.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(stop)
                await wait_until(lambda: len(byes) > before, timeout=15, what=f"{code} stopping")
                hold.touch()
                await stopped.wait()
            procs[code] = await pool[code].start()

        async with anyio.create_task_group() as tg:
            tg.start_soon(start_all)
            for k, code in enumerate("abc"):
                at = 20 + 60 * k  # each restart while runs are being started
                await wait_until(
                    functools.partial(_at_least, runs, at), timeout=30, what=f"{at} runs started"
                )
                await restart(code)
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for rid, (_, run) in runs.items():

                    async def one(rid: str = rid, run: fusee.Run = run) -> None:
                        results[rid] = await run.result(timeout=110)

                    tg.start_soon(one)
        assert len(results) == 203
        for rid, (workflow, _) in runs.items():
            assert results[rid]["by"] in SERVED_BY[workflow], (rid, workflow, results[rid])
        for code in "abc":  # the held step finished on the worker that was stopping
            assert results[f"held-{code}"]["by"] == code
        for rid, (_, run) in runs.items():
            done = [r for _, r in await run.journal() if isinstance(r, StepCompleted)]
            assert len(done) == 1, (rid, done)
        # one line per execution, named by its run (each run has one step)
        counts = collections.Counter(name for name, _, _ in execution_lines(log))
        assert set(counts) == set(runs)
        ran_again = {k: n for k, n in counts.items() if n != 1}
        assert not ran_again, (
            f"steps that ran more than once: {ran_again} (name, key, attempt: "
            f"{[e for e in execution_lines(log) if e[0] in ran_again]}); the workers said:\n"
            + _story([w for ws in pool.values() for w in ws.procs], set(ran_again))
        )
    finally:
        await sub.unsubscribe()
        for w in pool.values():
            w.cleanup()
        await engine.close()


async def test_connect_waits_out_a_cluster_without_quorum(
    nats_cluster: LoopbackCluster, namespace: str
) -> None:
    """A namespace set up while the cluster has no meta leader (two nodes of three
    down; a cluster just started or under load answers the same way, CI saw it): the
    stream and bucket requests that go unanswered are asked again, and ``connect``
    returns once the cluster is whole, with every stream and bucket on R3."""
    cluster = nats_cluster
    first, *others = cluster.nodes
    for node in others:
        node.kill()
    stream = Layout(namespace).stream
    watcher = await nats.connect(first.url, connect_timeout=2)
    asked = anyio.Event()
    seen: collections.Counter[str] = collections.Counter()

    async def on_request(msg: Any) -> None:
        # asked, and asked again: the first went unanswered (no meta leader) or was
        # answered "unavailable" (a node still taking itself for the leader answers
        # STREAM.INFO and refuses STREAM.CREATE, for up to 20 s on a loaded machine)
        seen[msg.subject] += 1
        if seen[msg.subject] >= 2:
            asked.set()

    await watcher.subscribe(f"$JS.API.STREAM.*.{stream}", cb=on_request)
    try:
        made: list[fusee.Engine] = []

        async def connect() -> None:
            made.append(await fusee.connect([first.url], namespace=namespace, replicas=3))

        async with anyio.create_task_group() as tg:
            tg.start_soon(connect)
            with anyio.fail_after(30):
                await asked.wait()
            for node in others:
                node.launch()
            await anyio.to_thread.run_sync(cluster.wait_ready)
        engine = made[0]
        try:
            info = await engine.store.js.stream_info(stream)
            assert info.config.num_replicas == 3
            for bucket in (engine.store.runs, engine.store.work, engine.store.objects):
                assert (await bucket.status()).stream_info.config.num_replicas == 3
        finally:
            await engine.close()
    finally:
        await watcher.close()
