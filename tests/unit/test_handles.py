"""The handles (``Run``, ``ObjectKey``) over the in-memory store: they need of a store
only ``fusee.actors.ports.HandleStore`` (mypy checks that ``MemoryStore`` and the
connection's ``NatsStore`` are one), so they run without NATS."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import pytest

import fusee
from fusee._client import Answered, Client, Replies
from fusee._objects import ObjectKey
from fusee._run import Run
from fusee.errors import FuseeError
from fusee.runtime.inbox import Invoke, Signal, decode_message
from fusee.runtime.records import ObjectDone, RunCompleted, RunStarted, encode_record
from tests.memory_store import MemoryStore


@dataclass
class _Client:
    """A ``Client`` over the in-memory store: what the handles see of an engine."""

    store: MemoryStore = field(default_factory=MemoryStore)
    namespace: str = "t"
    partitions: int = 1
    answered: Answered = field(default_factory=Answered)
    replies: Replies = field(init=False)

    def __post_init__(self) -> None:
        self.replies = Replies(self.store)


def _counter_type() -> fusee.ObjectType:
    async def add(ctx: Any, n: int) -> int:
        raise AssertionError("not run here")

    async def peek(ctx: Any) -> int:
        raise AssertionError("not run here")

    return fusee.object("counter", {"add": add, "peek": fusee.shared(peek)})


async def test_a_run_handle_signals_waits_and_reads_over_the_memory_store() -> None:
    client: Client = _Client()
    store = client.store
    assert isinstance(store, MemoryStore)
    start = RunStarted(workflow="w", input=msgspec.Raw(b"null"), started_at=1.0)
    store.seed("r", encode_record(start))
    run = Run(client, "r")
    assert await run.signal("go", 7)
    (message,) = await store.read_inbox(0, "r")
    assert decode_message(message.data) == Signal(name="go", payload=msgspec.Raw(b"7"))
    assert ("wake.0", b"r") in store.published
    assert (await run.describe()).status in ("waiting", "running", "pending")

    async def end() -> None:
        await anyio.wait_all_tasks_blocked()  # result() waits on the journal watch
        last = store.journal("r")[-1].seq
        done = encode_record(RunCompleted(result=msgspec.Raw(b"42")))
        await store.append("r", "run.completed", done, fence=last, msg_id="end")

    async with anyio.create_task_group() as tg:
        tg.start_soon(end)
        assert await run.result(timeout=5) == 42
    assert not await run.signal("late")  # ended: nothing stored
    assert len(await store.read_inbox(0, "r")) == 1
    assert [type(r) for _, r in await run.journal()] == [RunStarted, RunCompleted]
    with pytest.raises(FuseeError, match="no token streams"):
        async for _ in run.stream("model-0"):
            pass


async def test_an_object_key_calls_sends_and_shows_over_the_memory_store() -> None:
    client = _Client()
    store = client.store
    key = ObjectKey(_counter_type(), "k", engine=client)

    async def worker_answers() -> None:
        await anyio.wait_all_tasks_blocked()  # the call waits for its reply
        [msg] = next(iter(store.inboxes.values()))
        invoke = decode_message(msg.data)
        assert isinstance(invoke, Invoke)
        body = {"seq": msg.seq, "handler": invoke.handler, "result": 3, "at": 1}
        await store.publish_core(invoke.reply, msgspec.json.encode(body))

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker_answers)
        assert await key.call("add", 3, timeout=5) == 3
    assert store.active[0, key.eid] == b"{}"  # the call made sure it has a marker

    seq = await key.send("add", 2)
    info = await key.show()
    assert [w.seq for w in info.waiting] == [1, seq]

    async def done() -> None:
        await anyio.wait_all_tasks_blocked()
        record = ObjectDone(inbox_seq=seq, handler="add", result=msgspec.Raw(b"5"))
        journal = store.journal(key.eid)
        fence = journal[-1].seq if journal else 0
        await store.append(key.eid, "obj.done", encode_record(record), fence=fence, msg_id="d")

    async with anyio.create_task_group() as tg:
        tg.start_soon(done)
        assert await key.result(seq, timeout=5) == 5

    with pytest.raises(fusee.InvalidArgument, match="no worker serves"):
        await key.call("peek")  # a shared handler, and nobody subscribed

    async def peek(subject: str, data: bytes, reply: str | None) -> None:
        assert reply is not None
        await store.publish_core(reply, msgspec.json.encode({"result": 11}))

    await store.subscribe_core(store.layout.shared_calls("counter"), peek)
    assert await key.call("peek", timeout=5) == 11
