"""fusee on R3 streams and buckets of a 3-node cluster: nothing assumes R1.

What differs on R3 (research/nats.md Q1, reliability.md §0.5): a retry with the same
``Nats-Msg-Id`` and fence is answered as a duplicate, not 10071; a concurrent publish
with the same Msg-Id may be answered 10158 ("in process"); Direct Gets are served by
any replica, the local one first. Each is checked here on a real cluster.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import fusee
from fusee.adapters.jetstream.direct import publish_acked
from fusee.adapters.jetstream.store import NatsStore
from fusee.errors import Fenced, InvalidArgument
from tests.cluster import LoopbackCluster, stream_leader
from tests.helpers import cli_cmd, cli_env
from tests.workers.procs import (
    CHAIN,
    WorkerProc,
    chain_input,
    chain_result,
    completed_keys,
    executions,
)


@pytest.fixture
async def engine(nats_cluster: LoopbackCluster, namespace: str) -> AsyncIterator[fusee.Engine]:
    eng = await fusee.connect(nats_cluster.urls, namespace=namespace, replicas=3, partitions=4)
    try:
        yield eng
    finally:
        await eng.close()


async def test_connect_takes_a_list_or_a_comma_separated_string(
    nats_cluster: LoopbackCluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await fusee.connect(nats_cluster.urls, namespace=namespace, replicas=3) as eng:
        assert eng.url == nats_cluster.url
        for name in (eng.store.layout.stream, eng.store.layout.values_stream):
            info = await eng.store.js.stream_info(name)
            assert info.config.num_replicas == 3, name
        for bucket in (eng.store.runs, eng.store.work, eng.store.objects):
            assert (await bucket.status()).stream_info.config.num_replicas == 3
    monkeypatch.setenv("FUSEE_NATS_URL", nats_cluster.url)
    async with await fusee.connect(namespace=namespace) as eng:
        assert eng.url == nats_cluster.url
    for bad in ("nats://127.0.0.1:1,,nats://127.0.0.1:2", ["nats://127.0.0.1:1", ""], [4222]):
        with pytest.raises(InvalidArgument, match="url="):
            await fusee.connect(bad, namespace=namespace)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="replicas=0"):
        await fusee.connect(nats_cluster.urls, namespace=namespace, replicas=0)
    monkeypatch.setenv("FUSEE_REPLICAS", "three")
    with pytest.raises(InvalidArgument, match="FUSEE_REPLICAS='three'"):
        await fusee.connect(nats_cluster.urls, namespace=namespace)


async def test_a_retried_append_lands_once(engine: fusee.Engine) -> None:
    """A lost reply retried with the same Msg-Id and fence: R3 answers it as a
    duplicate (alone) or 10201 (a batch): both return the first one's sequence."""
    store = engine.store
    seq = await store.append("r-dup", "run.started", b"{}", fence=0, msg_id="r-dup:0")
    assert await store.append("r-dup", "run.started", b"{}", fence=0, msg_id="r-dup:0") == seq
    started = await store.start_run(
        "r-batch", "run.started", b"{}", partition=0, marker=b"{}", msg_id="r-batch:0"
    )
    again = await store.start_run(
        "r-batch", "run.started", b"{}", partition=0, marker=b"{}", msg_id="r-batch:0"
    )
    assert again == started
    assert [m.seq for m in await store.read_journal("r-dup")] == [seq]
    assert [m.seq for m in await store.read_journal("r-batch")] == [started]
    # another writer's record at the same fence is refused, not taken for ours
    with pytest.raises(Fenced):
        await store.append("r-dup", "step.completed", b"{}", fence=0, msg_id="r-dup:other")


async def test_concurrent_sends_of_one_record_land_once(engine: fusee.Engine) -> None:
    """Two sends of one record at once (a retry racing its first try): R3 may answer
    the second 10158 "duplicate message id is in process"; neither raises, both name
    the stored record, and it is stored once."""
    store = engine.store
    got: dict[str, list[int]] = {}

    async def send(eid: str) -> None:
        seq = await store.append(eid, "run.started", b"{}", fence=0, msg_id=f"{eid}:0")
        got.setdefault(eid, []).append(seq)

    async with anyio.create_task_group() as tg:
        for i in range(100):
            tg.start_soon(send, f"c-{i}")
            tg.start_soon(send, f"c-{i}")
    for eid, seqs in got.items():
        stored = await store.read_journal(eid)
        assert [m.seq for m in stored] == seqs[:1] == seqs[1:], (eid, seqs, stored)


async def test_reads_after_an_append_see_it_on_every_node(
    nats_cluster: LoopbackCluster, engine: fusee.Engine, namespace: str
) -> None:
    """Read-your-write: a record acknowledged to one client is in the journal any other
    client reads next, whichever node it is connected to. A follower's Direct Get may
    be behind the leader's ack (the third replica of R3 is not waited for): seen in
    178 of 3,200 reads here before journal reads checked the leader's tail. Also from a
    follower that was stopped while records were written and has just come back."""
    leader = await stream_leader(nats_cluster, engine.store.layout.stream)
    followers = [n for n in nats_cluster.nodes if n is not leader]
    writers = [await NatsStore.connect([leader.url], namespace) for _ in range(4)]
    readers = [await NatsStore.connect([n.url], namespace) for n in followers]
    behind: list[tuple[str, str, int, object]] = []

    async def check(eid: str, seq: int) -> None:
        for reader in readers:
            last = await reader.last_in_journal(eid)
            if last is None or last.seq != seq:
                behind.append(("last_in_journal", eid, seq, last))
            journal = [m.seq for m in await reader.read_journal(eid)]
            if journal[-1:] != [seq]:
                behind.append(("read_journal", eid, seq, journal))
            first = await reader.first_in_journal(eid)
            if first is None:
                behind.append(("first_in_journal", eid, seq, first))

    async def write(k: int, writer: NatsStore) -> None:
        for i in range(100):
            eid = f"ryw-{k}-{i}"
            seq = await writer.append(eid, "run.started", b"x" * 200, fence=0, msg_id=eid)
            await check(eid, seq)

    try:
        async with anyio.create_task_group() as tg:
            for k, writer in enumerate(writers):
                tg.start_soon(write, k, writer)
        assert not behind, f"{len(behind)} stale reads, e.g. {behind[:3]}"
        stopped = followers[0]
        assert stopped.proc is not None
        stopped.proc.send_signal(signal.SIGSTOP)
        try:
            acked = {}
            for i in range(50):
                eid = f"ryw-stopped-{i}"
                acked[eid] = await writers[0].append(eid, "run.started", b"{}", fence=0, msg_id=eid)
        finally:
            stopped.proc.send_signal(signal.SIGCONT)
        for eid, seq in acked.items():
            await check(eid, seq)
        assert not behind, f"{len(behind)} stale reads, e.g. {behind[:3]}"
    finally:
        for s in (*writers, *readers):
            await s.close()


async def test_fusee_worker_takes_a_comma_separated_nats(
    nats_cluster: LoopbackCluster, engine: fusee.Engine, namespace: str, tmp_path: Path
) -> None:
    """``fusee worker FILE --nats a,b,c`` (the CLI as a user runs it) serves the cluster."""
    log_path = tmp_path / "worker.log"
    cmd = cli_cmd("worker", str(CHAIN), "--nats", nats_cluster.url, "--namespace", namespace)
    with log_path.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=cli_env())
    worker = WorkerProc("cli", proc, log_path)
    try:
        await worker.wait_for("worker.started", timeout=20)
        log = tmp_path / "effects.log"
        arg = chain_input(log, steps=3, delay=0.0, tag="r3")
        run = await engine.start("chain", "r3-run", arg)
        assert await run.result(timeout=20) == chain_result(arg)
        assert len(completed_keys(await run.journal())) == 3
        assert set(executions(log).values()) == {1}
        assert worker.stop() == 0
    finally:
        worker.kill()


async def test_publish_acked_raises_nothing_on_a_duplicate(engine: fusee.Engine) -> None:
    store = engine.store
    subject = store.layout.record("p-1", "run.started")
    headers = {"Nats-Msg-Id": "p-1"}
    first = await publish_acked(store.nc, subject, b"{}", headers, 2.0)
    assert await publish_acked(store.nc, subject, b"{}", headers, 2.0) == first
