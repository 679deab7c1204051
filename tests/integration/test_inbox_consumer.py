"""The worker's inbox consumer (``NatsStore.subscribe_inbox``) after nats-py resets it.

nats-py's ordered consumer recreates itself from the stream sequence after the last one
it delivered (``_sseq + 1``) when its heartbeats stop (a server restart, a consumer
deleted). A consumer that had delivered nothing resumed from sequence 1, and handed the
worker every inbox message ever stored again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from fusee.adapters.jetstream.store import NatsStore
from fusee.runtime.inbox import Cancel, encode_message


@pytest.fixture
async def store(nats_server: Any, namespace: str) -> AsyncIterator[NatsStore]:
    s = await NatsStore.connect(nats_server.url, namespace)
    await s.ensure_layout()
    try:
        yield s
    finally:
        await s.close()


async def _consumers(store: NatsStore) -> set[str]:
    return {c.name for c in await store.js.consumers_info(store.layout.stream)}


async def _other_consumer(store: NatsStore, gone: str) -> None:
    """Until nats-py made a consumer in place of ``gone`` (it missed two heartbeats)."""
    with anyio.fail_after(20):
        while (await _consumers(store)) - {gone} == set():
            await anyio.sleep(0.05)


async def test_a_reset_consumer_that_delivered_nothing_hands_nothing_old_again(
    store: NatsStore,
) -> None:
    body = encode_message(Cancel(reason="old"))
    for i in range(20):  # inbox messages stored before the worker subscribed
        last_old = await store.send_inbox(i % 4, f"old-{i}", "cancel", body)
    handed: list[str] = []
    new_one = anyio.Event()

    async def on_inbox(partition: int, eid: str, msg: Any) -> None:
        handed.append(eid)
        if eid == "new":
            new_one.set()

    before = await _consumers(store)
    unsubscribe = await store.subscribe_inbox(on_inbox, heartbeat=0.2)
    try:
        (made,) = (await _consumers(store)) - before
        # its first delivery, the last inbox message stored (dropped: it is old); the
        # server's answer comes after it on the connection, so nats-py has read it
        with anyio.fail_after(10):
            while (
                await store.js.consumer_info(store.layout.stream, made)
            ).delivered.stream_seq < last_old:
                await anyio.sleep(0.01)
        await store.js.delete_consumer(store.layout.stream, made)  # its heartbeats stop
        await _other_consumer(store, made)
        (remade,) = (await _consumers(store)) - before - {made}
        config = (await store.js.consumer_info(store.layout.stream, remade)).config
        assert config.opt_start_seq == last_old + 1  # not 1: nothing old on the wire either
        await store.send_inbox(0, "new", "cancel", body)
        with anyio.fail_after(10):
            await new_one.wait()  # in stream order: whatever it hands again came first
    finally:
        await unsubscribe()
    assert handed == ["new"]
