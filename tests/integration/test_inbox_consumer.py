"""The worker's inbox consumer (``NatsStore.subscribe_inbox``) after nats-py resets it.

nats-py's ordered consumer recreates itself from the stream sequence after the last one
it delivered (``_sseq + 1``) when its heartbeats stop (a server restart, a consumer
deleted). A consumer that had delivered nothing resumed from sequence 1, and handed the
worker every inbox message ever stored again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest
from nats.aio.msg import Msg

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


async def _created(store: NatsStore) -> tuple[anyio.Event, Callable[[], Awaitable[None]]]:
    """An event set when the server announces a consumer created on the stream (its
    ``CONSUMER.CREATED`` advisory), and how to stop listening."""
    created = anyio.Event()

    async def on_advisory(msg: Msg) -> None:
        created.set()

    sub = await store.nc.subscribe(
        f"$JS.EVENT.ADVISORY.CONSUMER.CREATED.{store.layout.stream}.*", cb=on_advisory
    )
    await store.nc.flush()  # (the subscription is the server's before anything is deleted)
    return created, sub.unsubscribe


async def test_a_reset_consumer_that_delivered_nothing_hands_nothing_old_again(
    store: NatsStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = encode_message(Cancel(reason="old"))
    for i in range(20):  # inbox messages stored before the worker subscribed
        last_old = await store.send_inbox(i % 4, f"old-{i}", "cancel", body)
    handed: list[str] = []
    new_one = anyio.Event()
    last_old_read = anyio.Event()
    subscribe = store.js.subscribe

    async def subscribe_seeing(
        subject: str, *, cb: Callable[[Msg], Awaitable[None]], **kw: Any
    ) -> Any:
        async def seeing(msg: Msg) -> None:
            if msg.metadata.sequence.stream == last_old:
                last_old_read.set()
            await cb(msg)

        return await subscribe(subject, cb=seeing, **kw)

    # (what the callback gets, nats-py has read and counted: the consumer's info can
    # say it was delivered before that, its delivery and the API's answer are written
    # by different goroutines of the server)
    monkeypatch.setattr(store.js, "subscribe", subscribe_seeing)

    async def on_inbox(partition: int, eid: str, msg: Any) -> None:
        handed.append(eid)
        if eid == "new":
            new_one.set()

    before = await _consumers(store)
    unsubscribe = await store.subscribe_inbox(on_inbox, heartbeat=0.2)
    try:
        (made,) = (await _consumers(store)) - before
        with anyio.fail_after(10):  # its first delivery, the last inbox message stored
            await last_old_read.wait()  # (dropped by the worker: it is old; never with
            # DeliverPolicy.NEW, which sends nothing before a new message)
        remade_event, stop_listening = await _created(store)
        try:
            await store.js.delete_consumer(store.layout.stream, made)  # its heartbeats stop
            with anyio.fail_after(20):  # nats-py makes another once it missed two
                await remade_event.wait()
        finally:
            await stop_listening()
        (remade,) = (await _consumers(store)) - before - {made}
        config = (await store.js.consumer_info(store.layout.stream, remade)).config
        assert config.opt_start_seq == last_old + 1  # not 1: nothing old on the wire either
        await store.send_inbox(0, "new", "cancel", body)
        with anyio.fail_after(10):
            await new_one.wait()  # in stream order: whatever it hands again came first
    finally:
        await unsubscribe()
    assert handed == ["new"]
