"""Calls handed to an object's actor in memory: journaled with their result in one
write, stored in the inbox only when the caller hears nothing back, never run twice."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest

import fusee
from fusee.actors.worker import WorkerConfig
from fusee.runtime.records import ObjectDone, decode_record
from tests.workers.procs import wait_until

pytestmark = pytest.mark.timeout(60)

GATE: dict[str, anyio.Event] = {}
RUNS: dict[str, int] = {}


async def _incr(ctx: fusee.ObjectContext) -> int:
    count: int = ctx.state.get("count", 0) + 1
    ctx.state.set("count", count)
    return count


async def _held(ctx: fusee.ObjectContext, name: str) -> int:
    RUNS[name] = RUNS.get(name, 0) + 1
    await GATE[name].wait()  # until the test lets it end
    return await _incr(ctx)


direct = fusee.object("direct_counter", {"incr": _incr, "held": _held})


def _in_memory() -> WorkerConfig:
    # a key stays in memory between calls (FUSEE_ALWAYS_REPLAY=1 evicts it after each
    # one, and a call then finds no actor to hand it to: it goes to the inbox)
    return WorkerConfig(always_replay=False)


async def _stored(engine: fusee.Engine) -> int:
    return int((await engine.store.js.stream_info(engine.namespace.upper())).state.last_seq)


async def test_a_call_to_a_key_in_memory_costs_one_stored_write(engine: fusee.Engine) -> None:
    key = engine.object(direct, "one-write")
    async with engine.worker(config=_in_memory()):
        assert await key.call("incr") == 1  # stored in the inbox: the key was not in memory
        before = await _stored(engine)
        for n in range(2, 12):
            assert await key.call("incr") == n
        after = await _stored(engine)
        assert await key.state() == {"count": 11}
    records = [decode_record(m.data) for m in await engine.store.read_journal(key.eid)]
    dones = [r for r in records if isinstance(r, ObjectDone)]
    # ten calls, ten messages: their obj.done records, nothing in the inbox
    assert after - before == 10
    assert [d.is_direct for d in dones] == [False] + [True] * 10
    first = dones[0].inbox_seq
    assert all(d.cursor == first for d in dones[1:])  # the inbox cursor stays


async def test_a_send_is_not_overtaken_by_the_next_call(engine: fusee.Engine) -> None:
    key = engine.object(direct, "send-then-call")
    async with engine.worker():
        assert await key.call("incr") == 1
        assert await key.call("incr") == 2  # direct
        await key.send("incr")
        assert await key.call("incr") == 4  # after the send, from the inbox


async def test_an_unanswered_direct_call_is_stored_and_runs_once(engine: fusee.Engine) -> None:
    name = f"held-{engine.namespace}"
    GATE[name] = anyio.Event()
    key = engine.object(direct, "unanswered")
    got: list[Any] = []
    async with engine.worker(config=_in_memory()):
        assert await key.call("incr") == 1
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                got.append(await key.call("held", name))

            tg.start_soon(call)

            async def retried() -> bool:
                # the caller heard nothing within a second: it stored the call in the
                # inbox, naming the journal sequence its direct attempt comes after
                for msg in await engine.store.read_inbox(key._partition, key.eid):
                    if "after" in msgspec.json.decode(msg.data):
                        return True
                return False

            await wait_until(retried, timeout=10, what="the call to be stored in the inbox")
            GATE[name].set()
        assert got == [2]

        async def repeated() -> list[ObjectDone]:
            records = [decode_record(m.data) for m in await engine.store.read_journal(key.eid)]
            return [
                r for r in records if isinstance(r, ObjectDone) and r.repeats is not msgspec.UNSET
            ]

        again = await wait_until(repeated, timeout=10, what="the stored call to be answered")
        assert await key.state() == {"count": 2}
    assert RUNS[name] == 1  # the handler ran once
    assert len(again) == 1
    assert msgspec.json.decode(bytes(again[0].result)) == 2
    assert again[0].state_set is msgspec.UNSET  # the repeat changes nothing
