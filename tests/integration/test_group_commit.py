"""Group commit: concurrent appends of many actors share atomic batches, and a stale
fence in a batch fences out only its own writer."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from fusee.adapters.jetstream.store import NatsStore
from fusee.errors import Fenced


@pytest.fixture
async def store(nats_server: Any, namespace: str) -> AsyncIterator[NatsStore]:
    s = await NatsStore.connect(nats_server.url, namespace)
    await s.ensure_layout()
    s.committer.direct_limit = 0  # every append queues: batches whenever two meet
    yield s
    await s.close()


async def test_concurrent_appends_share_batches_and_each_gets_its_sequence(
    store: NatsStore,
) -> None:
    results: dict[str, int] = {}

    async def append(i: int) -> None:
        eid = f"run-{i}"
        results[eid] = await store.append(eid, "test", b'{"n":%d}' % i, fence=0, msg_id=f"{eid}:1")

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(append, i)
    assert store.committer.batches >= 1
    assert len(set(results.values())) == 50
    for eid, seq in results.items():
        last = await store.last_in_journal(eid)
        assert last is not None
        assert last.seq == seq  # the sequence handed back is where the record is
        assert last.data == b'{"n":%s}' % eid.split("-")[1].encode()


async def test_a_stale_fence_in_a_batch_fences_only_its_writer(store: NatsStore) -> None:
    for i in range(10):
        await store.append(f"r{i}", "test", b"1", fence=0, msg_id=f"r{i}:1")
    fences: dict[str, int] = {}
    for i in range(10):
        last = await store.last_in_journal(f"r{i}")
        assert last is not None
        fences[f"r{i}"] = last.seq
    outcomes: dict[str, object] = {}

    async def append(eid: str, fence: int) -> None:
        try:
            outcomes[eid] = await store.append(eid, "test", b"2", fence=fence, msg_id=f"{eid}:2")
        except Fenced as exc:
            outcomes[eid] = exc

    async with anyio.create_task_group() as tg:
        for eid, fence in fences.items():
            tg.start_soon(append, eid, fence if eid != "r3" else fence - 1)
    assert isinstance(outcomes["r3"], Fenced)
    for eid in fences:
        journal = await store.read_journal(eid)
        if eid == "r3":
            assert [m.data for m in journal] == [b"1"]
        else:
            assert [m.data for m in journal] == [b"1", b"2"]
            assert outcomes[eid] == journal[-1].seq


async def test_an_appender_cancelled_while_its_record_is_queued_takes_no_one_with_it(
    nats_server_private: Any,
) -> None:
    """The first appender of a lot used to send everyone's records: cancelled (its run's
    cancel, timeout or drain), it failed all of them with a nats TimeoutError."""
    s = await NatsStore.connect(nats_server_private.url, "gc")
    try:
        await s.ensure_layout()
        s.committer.direct_limit = 0
        queued: list[int] = []
        outcomes: dict[int, object] = {}

        async def append(i: int) -> None:
            queued.append(i)  # then, with no await in between, the record is queued
            outcomes[i] = await s.append(f"c{i}", "test", b"1", fence=0, msg_id=f"c{i}:1")

        os.kill(nats_server_private.pid, signal.SIGSTOP)  # nothing is answered for now
        try:
            async with anyio.create_task_group() as tg:
                first = anyio.CancelScope()
                tg.start_soon(_in_scope, first, append, 0)
                for i in range(1, 20):
                    tg.start_soon(append, i)
                while len(queued) < 20:
                    await anyio.lowlevel.checkpoint()
                first.cancel()
                os.kill(nats_server_private.pid, signal.SIGCONT)
        finally:
            os.kill(nats_server_private.pid, signal.SIGCONT)
        for i in range(1, 20):
            last = await s.last_in_journal(f"c{i}")
            assert last is not None
            assert outcomes[i] == last.seq, outcomes[i]
    finally:
        await s.close()


async def _in_scope(scope: anyio.CancelScope, fn: Any, *args: Any) -> None:
    with scope:
        await fn(*args)


async def test_starts_and_ends_share_batches_with_their_riders(store: NatsStore) -> None:
    """A start is its record and its marker, an end's index entry the marker's removal:
    in a batch with other records each keeps its messages together, gets its record's
    sequence back, and the rider lands beside it."""
    results: dict[str, int] = {}

    async def start(i: int) -> None:
        eid = f"s-{i}"
        results[eid] = await store.start_run(
            eid, "run.started", b'{"n":%d}' % i, partition=i % 4, marker=b"{}", msg_id=f"{eid}:1"
        )

    async def plain(i: int) -> None:
        eid = f"p-{i}"
        results[eid] = await store.append(eid, "test", b'{"n":%d}' % i, fence=0, msg_id=f"{eid}:1")

    async with anyio.create_task_group() as tg:
        for i in range(40):
            tg.start_soon(start, i)
            tg.start_soon(plain, i)
    assert store.committer.batches >= 1
    for eid, seq in results.items():
        last = await store.last_in_journal(eid)
        assert last is not None
        assert last.seq == seq
    markers = await store.run_markers()
    assert sorted(markers) == sorted(f"s-{i}" for i in range(40))
    batched = store.committer.batches

    async def end(i: int) -> None:
        await store.end_run(i % 4, f"s-{i}", b'{"status":"completed"}', journal_seq=1)

    async with anyio.create_task_group() as tg:
        for i in range(40):
            tg.start_soon(end, i)
    assert store.committer.batches > batched
    assert await store.run_markers() == {}
    for i in range(40):
        entry = await store.get_index_entry(f"s-{i}")
        assert entry is not None
        assert entry[0] == b'{"status":"completed"}'
