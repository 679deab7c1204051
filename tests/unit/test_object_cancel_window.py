"""A cancel read while the running invocation changes under the read: the object's
driver sorts it against the invocation running as the read returns, never the one it
saw when the read began (a read awaits the server when pushes are lost).

Each test holds an inbox read open (the store's ``read_inbox`` waits for the test),
ends the running invocation A meanwhile (and lets B begin, or holds A's reply), then
lets the read return with a cancel. No sleeps: the windows open on events, and
``wait_all_tasks_blocked`` says the read was handled.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import anyio
import msgspec

from fusee.actors.core import ActorCore
from fusee.actors.object_actor import ObjectActor
from fusee.actors.registry import Handler, ObjectSpec, Registry
from fusee.errors import Evicted
from fusee.runtime.ids import escape, partition_of
from fusee.runtime.inbox import NULL, Cancel, Invoke, encode_message
from fusee.runtime.object_life import CancelRunning, ObjectLife
from fusee.runtime.objects import object_id
from fusee.runtime.records import ObjectDone, decode_record
from tests.memory_store import MemoryStore

OID = object_id("counter", "k")
EID = escape(OID)
P = partition_of(OID, 1)


class HookStore(MemoryStore):
    """``read_inbox`` waits, once armed, until the test lets it return; the reply to
    ``r.a`` waits, when ``hold_reply``, until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered, self.proceed = anyio.Event(), anyio.Event()
        self.hold_reply = False
        self.replying, self.reply_go = anyio.Event(), anyio.Event()

    async def read_inbox(self, partition: int, eid: str, after: int = 0, *, limit: int = 0) -> Any:
        found = await super().read_inbox(partition, eid, after, limit=limit)
        if self.armed:
            self.armed = False
            self.entered.set()
            await self.proceed.wait()
        return found

    async def publish_core(self, subject: str, data: bytes) -> None:
        if self.hold_reply and subject == "r.a":
            self.replying.set()
            await self.reply_go.wait()
        await super().publish_core(subject, data)


def _counter(store: MemoryStore, work: Any, **core: Any) -> ObjectActor:
    """Key ``k`` of a ``counter`` object whose one handler is ``work``, on ``store``."""
    registry = Registry()
    registry.add_object(ObjectSpec("counter", {"work": Handler("work", work, input_type=str)}))
    actor_core = ActorCore(
        store=store,
        namespace="t",
        eid=EID,
        run_id=OID,
        partition=P,
        clock=time.time,
        park_after=0.0,
        partitions=1,
        **core,
    )
    return ObjectActor(object_type="counter", key="k", registry=registry, core=actor_core)


async def _scenario(target: str, *, during_reply: bool, untargeted: bool = False) -> dict[str, Any]:
    """A runs, B is queued; a cancel of ``target`` is read by a read that began while
    A ran and returns after A ended: once B runs (``during_reply``: while A's reply is
    being published, B not begun). ``untargeted``: the cancel names no invocation
    ("the running one": A, running when it was stored)."""
    store = HookStore()
    store.hold_reply = during_reply
    gates = {"a": anyio.Event(), "b": anyio.Event()}
    running = {"a": anyio.Event(), "b": anyio.Event()}

    async def work(ctx: Any, which: str) -> str:
        running[which].set()
        await gates[which].wait()
        return which

    actor = _counter(store, work)
    actor.core.pushes = False  # every read asks the server (as after push_lost)

    def invoke(which: str) -> bytes:
        body = msgspec.Raw(b'"%s"' % which.encode())
        return encode_message(Invoke(handler="work", input=body, reply=f"r.{which}"))

    seqs = {w: await store.send_inbox(P, EID, "invoke", invoke(w)) for w in ("a", "b")}
    async with anyio.create_task_group() as tg:
        tg.start_soon(actor.run)
        await running["a"].wait()  # A runs; B is queued
        aimed = Cancel(reason="user") if untargeted else Cancel(reason="user", target=seqs[target])
        cancel = encode_message(aimed)
        await store.send_inbox(P, EID, "cancel", cancel)
        store.armed = True  # the watcher's read begins while A runs ...
        assert actor.core.woken is not None
        actor.core.woken.set()
        await store.entered.wait()
        gates["a"].set()  # ... and during its await A ends
        if during_reply:
            await store.replying.wait()  # (its obj.done landed, its reply on its way)
        else:
            await running["b"].wait()  # (and B began)
        store.proceed.set()
        await anyio.wait_all_tasks_blocked()  # the read was handled
        store.reply_go.set()
        gates["b"].set()
    dones = {}
    for message in store.journal(EID):
        record = decode_record(message.data)
        if isinstance(record, ObjectDone):
            dones[record.inbox_seq] = record
    return {"a": dones[seqs["a"]], "b": dones[seqs["b"]], "b_ran": running["b"].is_set()}


def test_a_cancel_of_the_invocation_that_began_during_the_read_reaches_it() -> None:
    got = anyio.run(functools.partial(_scenario, "b", during_reply=False))
    assert got["b"].error_type == "fusee.Cancelled", f"B's cancel was lost: {got['b']}"
    assert got["b"].message == "user"
    assert got["a"].ok


def test_a_cancel_of_the_invocation_that_ended_during_the_read_spares_the_next() -> None:
    got = anyio.run(functools.partial(_scenario, "a", during_reply=False))
    assert got["a"].ok  # (it returned before the cancel was read: it stands)
    assert got["b"].ok, f"B was cancelled by A's cancel: {got['b']}"


def test_an_untargeted_cancel_stored_while_one_ran_spares_the_next() -> None:
    """The cancel names no invocation: it meant A, running when it was stored; read
    once B began, it must not stop B (the driver tells the machine which invocation
    was begun as the read began: ``ObjectLife.inbox(before=)``)."""
    got = anyio.run(functools.partial(_scenario, "a", during_reply=False, untargeted=True))
    assert got["a"].ok
    assert got["b"].ok, f"B was cancelled by A's untargeted cancel: {got['b']}"


def test_a_cancel_of_the_ended_one_read_during_its_reply_spares_the_next() -> None:
    got = anyio.run(functools.partial(_scenario, "a", during_reply=True))
    assert got["b"].ok, f"B was cancelled by A's cancel: {got['b']}"
    assert got["b_ran"], "B never ran"


class FailingPuts(MemoryStore):
    """Every projection write fails."""

    async def put_state(
        self, object_type: str, key: str, data: bytes, *, journal_seq: int, cursor: int, last: int
    ) -> int | None:
        raise OSError("the KV store is gone")


async def _evicted_with_a_failed_write() -> BaseException:
    store = FailingPuts()

    async def work(ctx: Any, which: str) -> str:
        return which

    # (evict_requested: after the invocation, Evicted escapes _serve)
    actor = _counter(store, work, evict_requested=lambda: True)
    await store.send_inbox(P, EID, "invoke", encode_message(Invoke(handler="work", input=NULL)))
    try:
        await actor.run()
    except BaseException as exc:  # noqa: BLE001 - what left is the test's subject
        return exc
    raise AssertionError("the activation left without an error")


def test_a_failed_write_leaving_with_another_error_keeps_both() -> None:
    error = anyio.run(_evicted_with_a_failed_write)
    assert isinstance(error, OSError), error  # the write's failure leaves ...
    assert isinstance(error.__cause__, Evicted), (
        f"the eviction escaping as the write's error was raised is lost: {error.__cause__!r}"
    )  # ... and names the exception it overtook


def test_the_next_invocation_reads_the_clock_only_when_it_builds_one() -> None:
    life = ObjectLife(OID, park_after=1.0)

    def clock() -> float:
        raise AssertionError("the clock read with nothing queued")

    assert life.next(None, clock, lambda handler: None) is None
    life.inbox([(1, Invoke(handler="work"))], begun=None, begun_at=0, before=None)
    inv = life.next(None, lambda: 5.0, lambda handler: None)
    assert inv is not None
    assert inv.started_at == 5.0


def test_the_machine_takes_an_untargeted_cancel_read_across_a_change_for_the_one_before() -> None:
    """``ObjectLife.inbox`` itself (not the driver) works out from ``before=`` whether
    the invocation changed during the read: an untargeted cancel stored while A ran,
    read once B began (B's first record not landed), does not cancel B."""
    life = ObjectLife(OID, park_after=1.0)
    life.inbox(
        [(1, Invoke(handler="work")), (2, Invoke(handler="work"))],
        begun=None,
        begun_at=0,
        before=None,
    )
    a = life.next(None, lambda: 5.0, lambda handler: False)
    assert a is not None
    life.start(a, handlers={"work": False}, journaled=0)
    life.ended(a, ObjectDone(inbox_seq=a.inbox_seq, handler="work", result=NULL), 1, 1)
    b = life.next(None, lambda: 6.0, lambda handler: False)
    assert b is not None
    assert b.inbox_seq == 2
    life.start(b, handlers={"work": False}, journaled=0)
    out = life.inbox([(3, Cancel(reason="user"))], begun=b, begun_at=0, before=a)
    assert not any(isinstance(c, CancelRunning) for c in out), f"B cancelled by A's: {out}"
    assert life.cancel_reason is None
    # read while B ran all along, the same cancel is B's
    out = life.inbox([(4, Cancel(reason="user"))], begun=b, begun_at=0, before=b)
    assert any(isinstance(c, CancelRunning) for c in out)
