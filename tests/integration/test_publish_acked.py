"""``publish_acked``, the JetStream publish of every step commit: it answers and raises
as nats-py's ``JetStreamContext.publish`` does, which the fence, the read-back of a lost
reply and the group commit rely on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client

from fusee.adapters.jetstream.direct import publish_acked, publish_acked_once


@pytest.fixture
async def nc(nats_server: Any, namespace: str) -> AsyncIterator[Client]:
    conn = await nats.connect(nats_server.url)
    await conn.jetstream().add_stream(
        name=namespace.upper(), subjects=[f"{namespace}.>"], duplicate_window=60.0
    )
    yield conn
    await conn.jetstream().delete_stream(namespace.upper())
    await conn.close()


async def test_it_returns_the_stored_sequence_and_a_duplicate_the_original(
    nc: Client, namespace: str
) -> None:
    js = nc.jetstream()
    subject = f"{namespace}.r.j"
    seq = await publish_acked(nc, subject, b"a", {"Nats-Msg-Id": "m1"}, 5.0)
    assert (await js.get_msg(namespace.upper(), seq)).data == b"a"
    again = await publish_acked(nc, subject, b"a", {"Nats-Msg-Id": "m1"}, 5.0)
    assert again == seq  # the duplicate's ack names the original
    assert (await js.stream_info(namespace.upper())).state.messages == 1


async def test_the_once_form_says_what_jetstream_publish_says_of_a_duplicate(
    nc: Client, namespace: str
) -> None:
    # (ObjectKey.call with an idempotency key: send_inbox_once took nats-py's publish for
    # its PubAck.duplicate, at a loop trip more than publish_acked)
    js = nc.jetstream()
    subject = f"{namespace}.r.in"
    first = await publish_acked_once(nc, subject, b"a", {"Nats-Msg-Id": "once"}, 5.0)
    ours = await publish_acked_once(nc, subject, b"a", {"Nats-Msg-Id": "once"}, 5.0)
    theirs = await js.publish(subject, b"a", headers={"Nats-Msg-Id": "once"})
    assert first == (first[0], False)
    assert ours == (theirs.seq, bool(theirs.duplicate)) == (first[0], True)
    fresh = await publish_acked_once(nc, subject, b"b", {"Nats-Msg-Id": "other"}, 5.0)
    assert fresh == (first[0] + 1, False)


async def test_a_stale_fence_raises_what_jetstream_publish_raises(
    nc: Client, namespace: str
) -> None:
    subject, tree = f"{namespace}.r.j", f"{namespace}.r.>"
    first = await publish_acked(
        nc, subject, b"1", {"Nats-Expected-Last-Subject-Sequence": "0"}, 5.0
    )
    fenced = {
        "Nats-Expected-Last-Subject-Sequence": "0",  # stale: the subtree is at `first` now
        "Nats-Expected-Last-Subject-Sequence-Subject": tree,
    }
    with pytest.raises(nats.js.errors.BadRequestError) as ours:
        await publish_acked(nc, subject, b"2", fenced, 5.0)
    with pytest.raises(nats.js.errors.BadRequestError) as theirs:
        await nc.jetstream().publish(subject, b"2", headers=fenced)
    assert ours.value.err_code == theirs.value.err_code == 10071
    assert ours.value.description == theirs.value.description
    fenced["Nats-Expected-Last-Subject-Sequence"] = str(first)
    assert await publish_acked(nc, subject, b"2", fenced, 5.0) > first


async def test_no_stream_and_no_answer_raise_as_jetstream_publish_does(
    nc: Client, namespace: str
) -> None:
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        await publish_acked(nc, "nobody.stores.this", b"x", {}, 5.0)
    # a core subscriber that never answers: no 503 comes, the ack never does
    silent = await nc.subscribe("silent.subject")
    with pytest.raises(nats.errors.TimeoutError):
        await publish_acked(nc, "silent.subject", b"x", {}, 0.2)
    await silent.unsubscribe()


async def test_concurrent_publishes_each_get_their_own_ack(nc: Client, namespace: str) -> None:
    js = nc.jetstream()
    got: dict[int, int] = {}

    async def one(i: int) -> None:
        got[i] = await publish_acked(nc, f"{namespace}.r{i}.j", b"%d" % i, {}, 5.0)

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(one, i)
    assert len(set(got.values())) == 50
    for i, seq in got.items():
        assert (await js.get_msg(namespace.upper(), seq)).data == b"%d" % i
