"""fusee on R3 streams and buckets of a 3-node cluster: nothing assumes R1.

What differs on R3 (research/nats.md Q1, reliability.md §0.5): a retry with the same
``Nats-Msg-Id`` and fence is answered as a duplicate, not 10071; a concurrent publish
with the same Msg-Id may be answered 10158 ("in process"); Direct Gets are served by
any replica, the local one first. Each is checked here on a real cluster.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from fusee.actors.object_state import read_object
from fusee.adapters.jetstream.direct import publish_acked
from fusee.adapters.jetstream.store import NatsStore
from fusee.errors import Fenced, InvalidArgument, JournalGap
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

ROUNDS = 400


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


async def _split(
    cluster: LoopbackCluster, namespace: str, stream: str
) -> tuple[list[NatsStore], list[NatsStore]]:
    """Four clients on ``stream``'s leader, one on each follower."""
    leader = await stream_leader(cluster, stream)
    writers = [await NatsStore.connect([leader.url], namespace) for _ in range(4)]
    readers = [
        await NatsStore.connect([n.url], namespace) for n in cluster.nodes if n is not leader
    ]
    return writers, readers


async def _write_and_read(
    writers: list[NatsStore],
    readers: list[NatsStore],
    one: Callable[..., Awaitable[None]],
    failed: list[Any],
) -> None:
    """``one(writer, readers, name)`` on each writer at once, until a check failed (the
    list ``one`` fills) or for ``ROUNDS`` rounds. Without the leader check a miss came
    within 150 rounds in every run here (1-16 of 1,200 reads through followers)."""

    async def write(k: int, writer: NatsStore) -> None:
        for i in range(ROUNDS):
            if failed:
                return
            await one(writer, readers, f"{k}-{i}")

    try:
        async with anyio.create_task_group() as tg:
            for k, writer in enumerate(writers):
                tg.start_soon(write, k, writer)
    finally:
        for s in (*writers, *readers):
            await s.close()


@pytest.mark.slow  # 400 rounds of reads through both followers (3-15 s)
async def test_an_inbox_message_just_acknowledged_is_read_on_every_node(
    nats_cluster: LoopbackCluster, engine: fusee.Engine, namespace: str
) -> None:
    """What a worker does before it parks a run (``read_inbox(..., limit=1)``) and as
    it loads one: a signal acknowledged to its sender is in the next read of the inbox,
    whichever node answers it. A miss parked the run with the signal unread for good."""
    writers, readers = await _split(nats_cluster, namespace, engine.store.layout.stream)
    missed: list[tuple[str, int, str]] = []

    async def one(writer: NatsStore, readers: list[NatsStore], name: str) -> None:
        eid = f"inbox-{name}"
        await writer.append(eid, "run.started", b"x" * 200, fence=0, msg_id=eid)
        seq = await writer.send_inbox(0, eid, "signal", b'{"kind":"signal"}')
        for reader in readers:
            if [m.seq for m in await reader.read_inbox(0, eid, 0, limit=1)] != [seq]:
                missed.append((eid, seq, "limit=1"))
            if [m.seq for m in await reader.read_inbox(0, eid)] != [seq]:
                missed.append((eid, seq, "all"))

    await _write_and_read(writers, readers, one, missed)
    assert not missed, f"{len(missed)} inbox reads missed an acknowledged message: {missed[:3]}"


@pytest.mark.slow  # 400 rounds of reads through both followers (3-15 s)
async def test_a_value_just_stored_is_read_on_every_node(
    nats_cluster: LoopbackCluster, engine: fusee.Engine, namespace: str
) -> None:
    """A step result stored out of line (``put_value``) and the record naming it, then
    read on a replay through any node: a follower without the value yet raised
    JournalGap (the run paused as unreplayable), though both were acknowledged."""
    writers, readers = await _split(nats_cluster, namespace, engine.store.layout.values_stream)
    gaps: list[str] = []

    async def one(writer: NatsStore, readers: list[NatsStore], name: str) -> None:
        eid = f"val-{name}"
        data = f"{name}-".encode() * 50
        ref = await writer.put_value(eid, data)
        await writer.append(eid, "run.started", b"x" * 200, fence=0, msg_id=eid)
        for reader in readers:
            try:
                assert await reader.get_value(ref) == data
            except JournalGap as exc:
                gaps.append(str(exc))

    await _write_and_read(writers, readers, one, gaps)
    assert not gaps, f"{len(gaps)} value reads raised JournalGap: {gaps[:1]}"


@pytest.mark.slow  # 400 rounds of reads through both followers (3-15 s)
async def test_a_state_write_whose_reply_was_lost_is_read_back_as_ours(
    nats_cluster: LoopbackCluster, engine: fusee.Engine, namespace: str
) -> None:
    """``put_state`` refused (the revision moved) reads the projection back: when the
    write that moved it is its own earlier try (same journal record), it is ours, not
    another writer's. Here the first try goes through the bucket's leader and the retry
    through a follower, which may not hold the first yet: that answered None (an object
    fenced by its own write)."""
    bucket = f"KV_{engine.store.layout.objects_bucket}"
    writers, readers = await _split(nats_cluster, namespace, bucket)
    fenced: list[str] = []

    async def one(writer: NatsStore, readers: list[NatsStore], name: str) -> None:
        key = f"k-{name}"
        first = await writer.put_state("T", key, b"{}", journal_seq=7, cursor=0, last=0)
        assert first is not None
        for reader in readers:
            again = await reader.put_state("T", key, b"{}", journal_seq=7, cursor=0, last=0)
            if again != first:
                fenced.append(key)

    await _write_and_read(writers, readers, one, fenced)
    assert not fenced, f"{len(fenced)} retried state writes called fenced: {fenced[:3]}"


@pytest.mark.slow  # 400 rounds of reads through both followers (3-15 s)
async def test_an_object_activated_on_any_node_reads_the_current_revision(
    nats_cluster: LoopbackCluster, engine: fusee.Engine, namespace: str
) -> None:
    """An object's activation reads its projection's revision, which its next state
    write compares with: read from a follower a write behind, that write was refused
    and the object fenced by the previous owner's own write."""
    bucket = f"KV_{engine.store.layout.objects_bucket}"
    writers, readers = await _split(nats_cluster, namespace, bucket)
    behind: list[tuple[str, int, int]] = []

    async def one(writer: NatsStore, readers: list[NatsStore], name: str) -> None:
        key = f"o-{name}"
        revision = await writer.put_state("T", key, b"{}", journal_seq=0, cursor=0, last=0)
        assert revision is not None
        for reader in readers:
            snap = await read_object(reader, "T", key)
            if snap.revision != revision:
                behind.append((key, revision, snap.revision))

    await _write_and_read(writers, readers, one, behind)
    assert not behind, f"{len(behind)} activations read an old revision: {behind[:3]}"


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


async def test_publish_acked_raises_nothing_on_a_duplicate(
    nats_cluster: LoopbackCluster, engine: fusee.Engine
) -> None:
    store = engine.store
    # a raw publish, not fusee's retried append: the stream made a moment ago may not
    # have elected its leader yet (503, no responders: seen in CI)
    await stream_leader(nats_cluster, store.layout.stream)
    subject = store.layout.record("p-1", "run.started")
    headers = {"Nats-Msg-Id": "p-1"}
    first = await publish_acked(store.nc, subject, b"{}", headers, 2.0)
    assert await publish_acked(store.nc, subject, b"{}", headers, 2.0) == first


@fusee.workflow("r3_tokens")
async def _r3_tokens(ctx: fusee.Context, n: int) -> str:
    from fusee.ai import model_call

    async def chunks(resume: str) -> Any:
        for i in range(n):
            yield f"t{i} "

    return str(await model_call(ctx, "model-0", chunks))


async def test_a_model_calls_token_stream_is_written_whole_on_r3(engine: fusee.Engine) -> None:
    """Every chunk of a token stream checks the stream's claim subject; an R3 leader
    refuses a check of a subject another proposal in flight checks (10164), so a writer
    that left 1,024 publishes unacknowledged failed its step at the second chunk (R1
    has no such window). The text streams whole, once, in order."""
    text = "".join(f"t{i} " for i in range(200))
    async with engine.worker():
        run = await engine.start(_r3_tokens, "r3-tokens", 200)
        assert await run.result(timeout=60) == text
        streamed = [t async for t in engine.run("r3-tokens").stream("model-0")]
    assert "".join(streamed) == text
    assert len(streamed) == 200
