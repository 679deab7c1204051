"""One namespace's storage in memory, for the unit tests: the whole ``RunStore`` port.

It keeps the rules of JetStream the actors rely on: one stream sequence shared by every
journal and inbox (an object's cursor is an inbox sequence, a run's generation is named
by a journal sequence), an append that lands only while its fence is still the last
sequence of that run's journal (``Fenced`` otherwise, as the server's error 10071 is
translated by the adapter), a ``msg_id`` that dedupes a resent inbox message, and
compare-and-set on the index and state revisions. Durable timers are kept, not fired:
a test fires one with :meth:`MemoryStore.fire_timer`. Core NATS (wake hints, replies)
is recorded in :attr:`MemoryStore.published`, and handed to what subscribed to it.

It is also the ``HandleStore`` the handles (``Run``, ``ObjectKey``) use: messages carry
their ``Fusee-Kind`` header, a journal watch hands over end records as they are
appended, ``send_unless_ended`` refuses a journal with an end record, and a partition's
owner answers its ping when the test puts it in :attr:`MemoryStore.live_owners`.

Crashes for the replay tests: ``crash_before_append`` / ``crash_after_append`` raise
:class:`Crash` (a process dying, a ``BaseException``) on the n-th append, before it is
stored or after (stored, but the writer never heard back).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio.lowlevel

from fusee.actors.core import ActorCore
from fusee.actors.ports import CoreHandler, HandleStore, NobodyListens, RunStore, TokenStreams
from fusee.actors.registry import Registry
from fusee.actors.run_actor import RunActor
from fusee.adapters.jetstream.layout import END_KINDS, KIND, Layout
from fusee.errors import Fenced, JournalGap
from fusee.runtime.inbox import TimerFired, encode_message
from fusee.runtime.records import ValueRef, decode_record, kind_of

__all__ = ("Crash", "MemoryStore", "Stored", "Timer", "run_actor")


class Crash(BaseException):  # a process dying, not an error (no Error suffix)
    pass


@dataclass(frozen=True)
class Stored:
    """A stored message: its stream sequence, its bytes and its headers
    (``fusee.actors.ports.StoredMessage``)."""

    seq: int
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Timer:
    """A durable timer as scheduled (a JetStream message schedule)."""

    partition: int
    until: float
    start: int


@dataclass
class MemoryStore:
    """A ``RunStore`` in memory, with JetStream's fencing rule: append only if the
    fence is the last sequence of the run's journal (0: it has none yet)."""

    completion_secret: bytes = b"s" * 32
    callback_base_url: str = "http://127.0.0.1:8000"
    max_value: int = 1 << 20  # what one record may carry, as a server's 1 MiB allows
    tokens: TokenStreams | None = None  # no token streams (model_call)
    layout: Layout = field(default_factory=lambda: Layout("t"))
    live_owners: set[int] = field(default_factory=set)  # partitions whose owner answers
    crash_before_append: int | None = None  # crash on the n-th append
    crash_after_append: int | None = None
    appends: int = 0
    on_stored: Callable[[object], None] | None = None  # each appended record, decoded
    last_seq: int = 0  # the stream's: journals and inboxes share it
    journals: dict[str, list[Stored]] = field(default_factory=dict)
    inboxes: dict[tuple[int, str], list[Stored]] = field(default_factory=dict)
    values: dict[tuple[str, str], bytes] = field(default_factory=dict)
    index: dict[str, tuple[bytes, int, int]] = field(default_factory=dict)
    # ended runs' entries, apart from the others as the real store keeps them in the
    # journal stream: final, read first, revision 0 (no compare-and-set replaces them)
    ended: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    states: dict[tuple[str, str], tuple[bytes, int, int]] = field(default_factory=dict)
    active: dict[tuple[int, str], bytes] = field(default_factory=dict)  # keys' markers
    run_markers: dict[tuple[int, str], bytes] = field(default_factory=dict)  # in the stream
    timers: dict[tuple[str, int], Timer] = field(default_factory=dict)
    published: list[tuple[str, bytes]] = field(default_factory=list)
    subscribed: list[tuple[str, CoreHandler]] = field(default_factory=list)  # core NATS
    journal_watch: MemoryWatch = field(init=False)
    _inbox_ids: dict[str, int] = field(default_factory=dict, init=False)
    _revision: int = field(
        default=0, init=False
    )  # the KV buckets' (one counter: only order matters)

    def __post_init__(self) -> None:
        self.journal_watch = MemoryWatch(self)

    # -- for the tests ------------------------------------------------------------------

    def journal(self, eid: str) -> list[Stored]:
        """Run ``eid``'s journal as stored (the list itself: a test may read it as it grows)."""
        return self.journals.setdefault(eid, [])

    def seed(self, eid: str, *records: bytes | Stored) -> None:
        """Store records in ``eid``'s journal as if written before the test: encoded
        ones at the next sequence, ``Stored`` ones at their own (a recorded journal)."""
        for record in records:
            if isinstance(record, Stored):
                self.last_seq = max(self.last_seq, record.seq)
                self.journal(eid).append(record)
            else:
                self.journal(eid).append(self._next(record, kind_of(decode_record(record))))

    def fire_timer(self, eid: str, pos: int) -> int:
        """The timer of wait ``pos`` lands in the run's inbox, as when its time comes."""
        timer = self.timers.pop((eid, pos))
        body = encode_message(TimerFired(pos=pos, start=timer.start))
        return self._to_inbox(timer.partition, eid, body)

    def _next(self, data: bytes, kind: str = "") -> Stored:
        self.last_seq += 1
        return Stored(self.last_seq, data, {KIND: kind} if kind else {})

    def _to_inbox(self, partition: int, eid: str, body: bytes, kind: str = "") -> int:
        stored = self._next(body, kind)
        self.inboxes.setdefault((partition, eid), []).append(stored)
        return stored.seq

    def _rev(self) -> int:
        self._revision += 1
        return self._revision

    # -- the journal --------------------------------------------------------------------

    async def append(
        self,
        eid: str,
        kind: str,
        data: bytes,
        *,
        fence: int,
        msg_id: str,
        unlist: str | None = None,  # (no listing entries here)
        rollup: bool = False,  # (the earlier records are kept here; nothing reads them)
    ) -> int:
        await anyio.lowlevel.checkpoint()  # a real store suspends here; cancellation lands
        return self._append(eid, data, fence=fence, kind=kind)

    def _append(self, eid: str, data: bytes, *, fence: int, kind: str) -> int:
        self.appends += 1
        if self.crash_before_append == self.appends:
            raise Crash
        journal = self.journal(eid)
        last = journal[-1].seq if journal else 0
        if fence != last:
            raise Fenced(f"journal of {eid} moved past sequence {fence} (it is at {last})")
        stored = self._next(data, kind)
        journal.append(stored)
        self.journal_watch.appended(eid, stored)
        if self.on_stored is not None:
            self.on_stored(decode_record(data))
        if self.crash_after_append == self.appends:
            raise Crash
        return stored.seq

    async def read_journal(self, eid: str, after: int = 0) -> list[Stored]:
        return [m for m in self.journals.get(eid, []) if m.seq > after]

    async def first_in_journal(self, eid: str) -> Stored | None:
        journal = self.journals.get(eid)
        return journal[0] if journal else None

    async def last_in_journal(self, eid: str) -> Stored | None:
        journal = self.journals.get(eid)
        return journal[-1] if journal else None

    async def put_value(self, eid: str, data: bytes) -> ValueRef:
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        self.values[eid, digest] = data
        return ValueRef(run=eid, digest=digest, size=len(data), chunks=1)

    async def get_value(self, ref: ValueRef) -> bytes:
        data = self.values.get((ref.run, ref.digest))
        if data is None:
            raise JournalGap(f"run {ref.run!r}: the value {ref.digest} is missing")
        return data

    # -- the run index and the active markers -------------------------------------------

    def index_entry(self, eid: str) -> tuple[bytes, int, int] | None:
        """What :meth:`get_index_entry` returns, for a test's checks."""
        if (final := self.ended.get(eid)) is not None and final[0]:
            return final[0], final[1], 0
        return self.index.get(eid)

    async def get_index_entry(self, eid: str) -> tuple[bytes, int, int] | None:
        return self.index_entry(eid)

    async def get_final_entry(self, eid: str) -> tuple[bytes, int] | None:
        final = self.ended.get(eid)
        return final if final is not None and final[0] else None

    async def put_index(self, eid: str, value: bytes, *, journal_seq: int, last: int) -> int | None:
        current = self.index.get(eid)
        if (current[2] if current else 0) != last:
            return None
        revision = self._rev()
        self.index[eid] = (value, journal_seq, revision)
        return revision

    async def end_run(
        self, partition: int, eid: str, value: bytes, *, journal_seq: int, fresh: bool = False
    ) -> None:
        self._rev()  # (the stream's sequence moves)
        self.ended[eid] = (value, journal_seq)
        await self.clear_run_active(partition, eid)

    async def get_index(self, eid: str) -> bytes | None:
        entry = await self.get_index_entry(eid)
        return (entry[0] or None) if entry else None

    async def start_run(
        self, eid: str, kind: str, data: bytes, *, partition: int, marker: bytes, msg_id: str
    ) -> int:
        await anyio.lowlevel.checkpoint()
        seq = self._append(eid, data, fence=0, kind=kind)  # (a crash after it: the marker too)
        self._next(marker)  # the marker rides the same batch, after the record
        self.run_markers[partition, eid] = marker
        return seq

    async def mark_run_active(self, partition: int, eid: str, marker: bytes) -> None:
        self._next(marker)
        self.run_markers[partition, eid] = marker
        await self.wake(partition, eid)

    async def clear_run_active(
        self, partition: int, eid: str, *, listed: bytes | None = None, seen: int | None = None
    ) -> bool:
        if seen is not None and any(m.seq > seen for m in self.inboxes.get((partition, eid), [])):
            return False  # a message the leaving activation did not read: the marker stays
        self.run_markers.pop((partition, eid), None)
        self.active.pop((partition, eid), None)
        return True

    async def clear_unstarted(self, partition: int, eid: str) -> None:
        if not self.journals.get(eid):
            await self.clear_run_active(partition, eid)

    async def mark_active(self, partition: int, eid: str) -> None:
        self.active[partition, eid] = b"{}"
        await self.wake(partition, eid)

    async def clear_active(self, partition: int, eid: str) -> None:
        self.active.pop((partition, eid), None)

    async def mark_idle(self, partition: int, eid: str, ttl: float) -> None:
        self.active[partition, eid] = b'{"idle":true}'

    async def ensure_active(self, partition: int, eid: str) -> None:
        if self.active.get((partition, eid)) in (None, b'{"idle":true}'):
            await self.mark_active(partition, eid)
        else:
            await self.wake(partition, eid)

    async def active_note(self, partition: int, eid: str) -> dict[str, Any] | None:
        marker = self.active.get((partition, eid))
        if marker is None:
            return None
        value = json.loads(marker)
        return value if isinstance(value, dict) else None

    # -- inboxes and timers ---------------------------------------------------------------

    async def read_inbox(
        self, partition: int, eid: str, after: int = 0, *, limit: int = 0
    ) -> list[Stored]:
        found = [m for m in self.inboxes.get((partition, eid), []) if m.seq > after]
        return found[:limit] if limit else found

    async def send_inbox(
        self, partition: int, eid: str, kind: str, body: bytes, *, msg_id: str | None = None
    ) -> int:
        return (await self.send_inbox_once(partition, eid, kind, body, msg_id=msg_id))[0]

    async def send_inbox_once(
        self, partition: int, eid: str, kind: str, body: bytes, *, msg_id: str | None
    ) -> tuple[int, bool]:
        if msg_id is not None and msg_id in self._inbox_ids:
            return self._inbox_ids[msg_id], True  # a duplicate: the server stores nothing new
        seq = self._to_inbox(partition, eid, body, kind)
        if msg_id is not None:
            self._inbox_ids[msg_id] = seq
        return seq, False

    async def send_unless_ended(
        self, partition: int, eid: str, kind: str, body: bytes, *, msg_id: str | None = None
    ) -> int | None:
        if any(m.headers.get(KIND) in END_KINDS for m in self.journals.get(eid, [])):
            return None  # (the real store expects nothing on the run's .end subject)
        return await self.send_inbox(partition, eid, kind, body, msg_id=msg_id)

    async def schedule_timer(
        self, eid: str, partition: int, pos: int, until: float, *, start: int = 0
    ) -> None:
        self.timers[eid, pos] = Timer(partition, until, start)  # again: replaces it

    def reply_prefix(self) -> str:
        return f"_INBOX.{secrets.token_hex(8)}"

    async def wake(self, partition: int, eid: str) -> None:
        self.published.append((f"wake.{partition}", eid.encode()))

    async def publish_core(self, subject: str, data: bytes) -> None:
        self.published.append((subject, data))
        for pattern, handler in list(self.subscribed):
            if _matches(pattern, subject):
                await handler(subject, data, None)

    async def subscribe_core(
        self, subject: str, handler: CoreHandler, *, queue: str = ""
    ) -> Callable[[], Awaitable[None]]:
        entry = (subject, handler)
        self.subscribed.append(entry)

        async def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self.subscribed.remove(entry)

        return unsubscribe

    async def request_core(self, subject: str, data: bytes, timeout: float) -> bytes | None:
        """The first subscriber's answer (one member of a queue group gets a request)."""
        handlers = [h for pattern, h in self.subscribed if _matches(pattern, subject)]
        if not handlers:
            raise NobodyListens(subject)
        reply = f"_INBOX.{len(self.published)}"
        answers: list[bytes] = []
        answered = anyio.Event()

        async def on_answer(_subject: str, answer: bytes, _reply: str | None) -> None:
            answers.append(answer)
            answered.set()

        unsubscribe = await self.subscribe_core(reply, on_answer)
        try:
            with anyio.move_on_after(timeout):
                await handlers[0](subject, data, reply)
                await answered.wait()
        finally:
            await unsubscribe()
        return answers[0] if answers else None

    lease_until: float = math.inf  # (no regions here: no lease)

    def hold_lease(self) -> None:
        return None

    def release_lease(self) -> None:
        return None

    async def renew_lease(self, lease: float) -> bool:
        return True

    async def owner_alive(self, partition: int) -> bool:
        return partition in self.live_owners

    # -- keyed objects --------------------------------------------------------------------

    async def get_state(
        self, object_type: str, key: str, *, leader: bool = False
    ) -> tuple[bytes, int, int] | None:
        return self.states.get((object_type, key))

    async def put_state(
        self, object_type: str, key: str, data: bytes, *, journal_seq: int, cursor: int, last: int
    ) -> int | None:
        current = self.states.get((object_type, key))
        if (current[2] if current else 0) != last:
            return None
        revision = self._rev()
        self.states[object_type, key] = (data, journal_seq, revision)
        return revision


def _matches(pattern: str, subject: str) -> bool:
    """Whether core NATS delivers ``subject`` to a subscription on ``pattern``."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


class MemoryWatch:
    """The store's journal watch (``fusee.actors.ports.EndWatch``): each waiter is handed
    the records of its kinds appended to its journal after it began watching."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._waiters: dict[str, list[_MemoryWaiter]] = {}

    @contextlib.asynccontextmanager
    async def watching(self, eid: str, kinds: Iterable[str]) -> AsyncIterator[_MemoryWaiter]:
        waiter = _MemoryWaiter(frozenset(kinds))
        self._waiters.setdefault(eid, []).append(waiter)
        try:
            yield waiter
        finally:
            self._waiters[eid].remove(waiter)

    def appended(self, eid: str, stored: Stored) -> None:
        for waiter in self._waiters.get(eid, []):
            if stored.headers.get(KIND) in waiter.kinds:
                waiter.records.append(stored)
                waiter.news.set()

    async def next(self, waiter: _MemoryWaiter, timeout: float) -> tuple[list[Stored], bool]:
        with anyio.move_on_after(timeout):
            await waiter.news.wait()
        records, waiter.records = waiter.records, []
        waiter.news = anyio.Event()
        return records, False  # (nothing is missed in memory)


class _MemoryWaiter:
    def __init__(self, kinds: frozenset[str]) -> None:
        self.kinds = kinds
        self.records: list[Stored] = []
        self.news = anyio.Event()


_: RunStore = MemoryStore()  # mypy proves it implements the whole port
_handles: HandleStore = MemoryStore()  # and what the handles use


def run_actor(
    store: MemoryStore, registry: Registry, *, clock: Callable[[], float], **core: Any
) -> RunActor:
    """The real run actor of run ``r`` (partition 0, namespace ``t``) over ``store``;
    ``core``: more :class:`~fusee.actors.core.ActorCore` arguments."""
    return RunActor(
        registry=registry,
        core=ActorCore(
            store=store, namespace="t", eid="r", run_id="r", partition=0, clock=clock, **core
        ),
    )
