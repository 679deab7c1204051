"""The journal stream's atomic batches against the server's limits: a batch refused
for the batches in flight (ADR-50: 50 per stream, 10176) stored nothing and is tried
again; a connection keeps few in flight; the stream takes rollups without schedules."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec
import nats
import nats.js.errors
import pytest

from fusee.adapters.jetstream import commit
from fusee.adapters.jetstream.commit import BATCH_COMMIT, BATCH_ID, BATCH_SEQ
from fusee.adapters.jetstream.store import NatsStore, journal_stream_config
from fusee.errors import ConnectionLost, Fenced
from tests.workers.procs import wait_until

SERVER_BATCHES_PER_STREAM = 50  # ADR-50's default limit, nats-server 2.15


@pytest.fixture
async def store(nats_server: Any, namespace: str) -> AsyncIterator[NatsStore]:
    s = await NatsStore.connect(nats_server.url, namespace)
    await s.ensure_layout()
    yield s
    await s.close()


async def _start(store: NatsStore, i: int, data: bytes = b"{}", attempt: str = "a") -> int:
    eid = f"run-{i}"
    return await store.start_run(
        eid, "run.started", data, partition=0, marker=b'{"m":1}', msg_id=f"{eid}:{attempt}"
    )


async def test_a_start_refused_for_batches_held_open_is_retried(
    nats_server: Any, namespace: str, store: NatsStore
) -> None:
    # a client that died mid-batch holds the stream's every batch slot (until the
    # server abandons them, 10 s later): here a raw client holds them open
    raw = await nats.connect(nats_server.url)
    try:
        for i in range(SERVER_BATCHES_PER_STREAM):
            headers = {BATCH_ID: f"held{i}", BATCH_SEQ: "1"}
            await raw.publish(f"{namespace}.run.held{i}.x", b"1", headers=headers)
        await raw.flush()
        # the server registers the held batches after raw's flush: until a batch from
        # another connection is refused (10176, nothing stored), a start could get a
        # slot (1 in 12 runs here, and in CI)
        prober = await nats.connect(nats_server.url)
        probes = 0

        async def slots_held() -> bool:
            # a two-message batch, as a start is (one that commits in its first
            # message is never in flight, so never refused)
            nonlocal probes
            probes += 1
            subject = f"{namespace}.run.probe{probes}"
            batch: list[commit.Message] = [(f"{subject}.x", b"p", {}), (f"{subject}.y", b"p", {})]
            try:
                await commit._publish_batch(prober, batch, 5.0)
            except nats.js.errors.APIError as exc:
                return exc.err_code == 10176
            return False

        try:
            await wait_until(slots_held, timeout=10, what="every batch slot held")
        finally:
            await prober.close()
        # refused for as long as it is patient: fusee's error, nothing stored
        with store.retrying_for(0.3), pytest.raises(ConnectionLost, match="10176"):
            await _start(store, 0)
        assert await store.last_in_journal("run-0") is None
        async with anyio.create_task_group() as tg:
            tg.start_soon(_start, store, 1)  # refused, tried again until slots free up
            for i in range(SERVER_BATCHES_PER_STREAM):
                headers = {BATCH_ID: f"held{i}", BATCH_SEQ: "2", BATCH_COMMIT: "1"}
                reply = await raw.request(f"{namespace}.run.held{i}.x", b"2", 5.0, headers=headers)
                assert msgspec.json.decode(reply.data).get("error") is None
        seq = await _start(store, 0)  # the same start again, now stored
    finally:
        await raw.close()
    last = await store.last_in_journal("run-0")
    assert last is not None
    assert last.seq == seq
    assert await store.last_in_journal("run-1") is not None


async def test_a_failed_group_batch_falls_back_a_few_batches_at_a_time(
    store: NatsStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one connection, more starts in one group batch than the stream takes batches in
    # flight; one of them is for a run that exists, so the group batch is refused
    # (10071) and its every start is sent alone: not all at once
    await _start(store, 0, attempt="earlier")
    store.committer.direct_limit = 0  # every start queues: one lot
    sending, most = 0, 0
    send = commit._publish_batch

    async def counted(*args: Any) -> int:
        nonlocal sending, most
        sending += 1
        most = max(most, sending)
        try:
            return await send(*args)
        finally:
            sending -= 1

    monkeypatch.setattr(commit, "_publish_batch", counted)
    data = b'{"x":"' + b"a" * 20_000 + b'"}'
    seqs: dict[int, int] = {}
    refused: list[BaseException] = []

    async def start(i: int) -> None:
        try:
            seqs[i] = await _start(store, i, data)
        except Fenced as exc:
            refused.append(exc)

    async with anyio.create_task_group() as tg:
        for i in range(300):
            tg.start_soon(start, i)
    assert len(refused) == 1  # run-0's
    assert len(set(seqs.values())) == 299
    assert most <= commit.BATCHES_IN_FLIGHT


async def test_the_journal_stream_takes_rollups_without_schedules(
    nats_server: Any, namespace: str, store: NatsStore
) -> None:
    # nats-server 2.15 turns rollups on for a stream with schedules: the layout must
    # not depend on it (a stream without them refuses a rollup with 10111)
    config = journal_stream_config(store.layout, 1)
    config.name = f"{namespace}_probe"
    config.subjects = [f"{namespace}probe.>"]
    config.allow_msg_schedules = False
    js = store.nc.jetstream()
    await js.add_stream(config)
    try:
        ack = await js.publish(f"{namespace}probe.a", b"1", headers={"Nats-Rollup": "sub"})
        assert ack.seq == 1
    finally:
        await js.delete_stream(config.name)
