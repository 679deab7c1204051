"""What the actors need from storage, as Protocols: the JetStream adapter implements them.

The actors never import nats or the adapter: they are handed an object that fits these
(``fusee.adapters.jetstream.store.NatsStore``), and mypy checks that it does where the
engine builds a worker. The handles (``Run``, ``ObjectKey``, the callers' ``Replies``)
see the store through :class:`HandleStore`, exactly what they use, so they import
neither; the in-memory store of the unit tests fits it and ``RunStore`` too.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeAlias

from fusee.errors import FuseeError
from fusee.runtime.records import ValueRef
from fusee.runtime.tokens import StoredState, TokenEvent

__all__ = (
    "Stored",
    "StoredMessage",
    "SCHEDULER",
    "scheduled_by",
    "scheduler_of",
    "NobodyListens",
    "ObjectReads",
    "TokenReader",
    "TokenStreams",
    "EndWatch",
    "HandleLayout",
    "HandleStore",
    "RunStore",
    "TokenSink",
    "TokenWriterPort",
    "SubjectLayout",
    "CoreHandler",
    "ClusterStore",
)


class Stored(Protocol):
    """One journal record as stored: its stream sequence and its bytes."""

    @property
    def seq(self) -> int: ...
    @property
    def data(self) -> bytes: ...


class StoredMessage(Stored, Protocol):
    """A stored message with its headers (``Fusee-Kind``, ``Nats-Time-Stamp``...)."""

    @property
    def headers(self) -> Mapping[str, str]: ...


# the header the server puts on a message a schedule wrote (and refuses from a client:
# err_code 10212); fusee's schedules target inboxes, so on a journal it means forged
SCHEDULER = "Nats-Scheduler"


def scheduler_of(message: Stored) -> str | None:
    """The subject of the message schedule that wrote ``message`` (None: not one; a
    store that keeps no headers, as the tests' in-memory one, has none)."""
    headers: Mapping[str, str] | None = getattr(message, "headers", None)
    return headers.get(SCHEDULER) if headers else None


def scheduled_by(messages: Iterable[Stored]) -> dict[int, str]:
    """The sequences of ``messages`` a message schedule wrote, with its subject (for
    ``load_journal(scheduled=)``)."""
    return {m.seq: by for m in messages if (by := scheduler_of(m)) is not None}


class NobodyListens(FuseeError):
    """A core NATS request found no subscriber."""


class TokenWriterPort(Protocol):
    """The writer of one token stream (``fusee.adapters.jetstream.tokens.TokenWriter``)."""

    @property
    def state(self) -> StoredState: ...

    async def write(self, text: str) -> None: ...

    async def restart(self) -> None: ...

    async def end(self, final: bytes = b"") -> None: ...

    async def flush(self) -> None: ...

    async def close(self) -> None: ...


class TokenSink(Protocol):
    """Where ``model_call`` writes its token streams
    (``fusee.adapters.jetstream.tokens.TokenStore``)."""

    async def open(self, eid: str, name: str) -> TokenWriterPort: ...


class TokenReader(Protocol):
    """Where ``Run.stream_events`` reads a run's token streams
    (``fusee.adapters.jetstream.tokens.TokenStore``)."""

    def read(self, eid: str, name: str, offset: int = 0) -> AsyncGenerator[TokenEvent, None]:
        """Every event of stream ``name`` of run ``eid`` from token index ``offset``, in
        order, stored ones first, until the stream is over."""
        ...

    async def names(self, eid: str) -> dict[str, int]:
        """The streams of run ``eid`` that hold anything, each with its message count."""
        ...


class TokenStreams(TokenSink, TokenReader, Protocol):
    """A namespace's token streams, written and read."""


class ObjectReads(Protocol):
    """What reading an object takes (``fusee.actors.object_state``): its KV projection
    and its journal."""

    async def get_state(
        self, object_type: str, key: str, *, leader: bool = False
    ) -> tuple[bytes, int, int] | None:
        """``(state JSON, journal sequence it was made at, KV revision)``, or None;
        ``leader``: as the bucket's leader has it (a replica may be a write behind)."""
        ...

    async def read_journal(self, eid: str, after: int = 0) -> Sequence[Stored]:
        """Every record of the journal with a sequence above ``after``, in order."""
        ...


class RunStore(Protocol):
    """A run's journal, the run index and the active markers, for one namespace."""

    # completions: the namespace's secret for tokens, and the base of callback URLs
    completion_secret: bytes
    callback_base_url: str

    @property
    def tokens(self) -> TokenSink | None:
        """The namespace's token streams (``model_call``); None: this store has none."""
        ...

    @property
    def max_value(self) -> int:
        """The largest value, in bytes of JSON, that one record may carry (a step's
        result, an input, a payload, an object's state): the server's message limit
        less room for the record around it. Checked before anything is written."""
        ...

    async def append(
        self,
        eid: str,
        kind: str,
        data: bytes,
        *,
        fence: int,
        msg_id: str,
        unlist: str | None = None,
        rollup: bool = False,
    ) -> int:
        """Append under the fence; raises ``Fenced`` when another writer moved it.
        ``unlist``: the run's workflow; its paused listing entry is removed in the
        same write (``run.resumed``).
        ``rollup``: the record replaces the earlier ones on its subject (a limit's
        snapshot: each holds the whole state)."""
        ...

    async def read_journal(self, eid: str, after: int = 0) -> Sequence[Stored]:
        """Every record of the run's journal with a sequence above ``after``, in order."""
        ...

    async def put_value(self, eid: str, data: bytes) -> ValueRef:
        """Store a value too large for one record (at most ``MAX_LARGE_VALUE`` bytes)
        out of line, for run ``eid``; the reference a record holds."""
        ...

    async def get_value(self, ref: ValueRef) -> bytes:
        """The bytes of a value stored out of line.

        Raises:
            JournalGap: it is missing, or not the bytes the reference names.
        """
        ...

    async def get_index_entry(self, eid: str) -> tuple[bytes, int, int] | None:
        """``(value, journal sequence, revision)``: revision 0 for an ended run's final
        entry (written by ``end_run``, which no compare-and-set replaces), else the
        revision ``put_index`` compares with."""
        ...

    async def get_final_entry(self, eid: str) -> tuple[bytes, int] | None:
        """An ended run's final entry alone (written by ``end_run``): ``(value, journal
        sequence)``, or None (the bucket is not read)."""
        ...

    async def put_index(
        self, eid: str, value: bytes, *, journal_seq: int, last: int
    ) -> int | None: ...

    async def get_index(self, eid: str) -> bytes | None: ...

    async def end_run(
        self, partition: int, eid: str, value: bytes, *, journal_seq: int, fresh: bool = False
    ) -> None:
        """An ended run's index entry (not compared: made from the journal's end) and
        the removal of its active marker, in one write. ``fresh``: the run's end just
        landed (this activation wrote it), so the store may trust its last listing of
        the partition for a marker elsewhere; else (an ended run activated again) it
        reads for one."""
        ...

    async def start_run(
        self, eid: str, kind: str, data: bytes, *, partition: int, marker: bytes, msg_id: str
    ) -> int:
        """Append a run's first record (fence 0) and its active marker, holding
        ``marker``, in one write: both or neither. Raises ``Fenced`` when the run exists."""
        ...

    async def mark_run_active(self, partition: int, eid: str, marker: bytes) -> None:
        """Write a run's active marker alone (a start whose marker could not ride its
        first record, or was left out by a starter that died), then hint its owner."""
        ...

    async def clear_run_active(
        self, partition: int, eid: str, *, listed: bytes | None = None, seen: int | None = None
    ) -> bool:
        """Remove an ended or paused run's active marker; ``listed``: a paused run's
        index entry, listed under its status and workflow in the same write.
        ``seen``: a paused run leaving, which read its inbox up to this sequence: the
        marker stays (False) if a message came above it, or a marker was written
        while the removal was made (a cancel's or a resume's, which outlives the
        activation that did not read it)."""
        ...

    async def clear_unstarted(self, partition: int, eid: str) -> None:
        """Remove the active marker of a run that has no journal, unless its journal
        exists by the time the removal is stored (a start that landed meanwhile)."""
        ...

    async def mark_active(self, partition: int, eid: str) -> None:
        """An object key's active marker (in the work bucket), then a hint to its owner."""
        ...

    async def clear_active(self, partition: int, eid: str) -> None: ...

    async def mark_idle(self, partition: int, eid: str, ttl: float) -> None:
        """Replace the actor's active marker with one the server removes after ``ttl``."""
        ...

    async def read_inbox(
        self, partition: int, eid: str, after: int = 0, *, limit: int = 0
    ) -> Sequence[Stored]:
        """The messages others sent the run (``<ns>.in.<p>.<eid>``) above ``after``
        (the first ``limit`` of them, when not 0)."""
        ...

    async def schedule_timer(
        self, eid: str, partition: int, pos: int, until: float, *, start: int = 0
    ) -> None:
        """A durable timer that lands in the run's inbox at ``until``."""
        ...

    # children (ctx.child): start a run, read its ends, write to another run's inbox
    async def first_in_journal(self, eid: str) -> Stored | None: ...

    async def last_in_journal(self, eid: str) -> Stored | None: ...

    async def send_inbox(
        self, partition: int, eid: str, kind: str, body: bytes, *, msg_id: str | None = None
    ) -> int:
        """Store a message in run ``eid``'s inbox; ``msg_id`` dedupes a resend."""
        ...

    async def wake(self, partition: int, eid: str) -> None:
        """Hint the partition's owner that the run has news (core NATS, may be lost)."""
        ...

    async def publish_core(self, subject: str, data: bytes) -> None:
        """Fire and forget on core NATS (a lost message is fine: nothing durable rides it)."""
        ...

    async def request_core(self, subject: str, data: bytes, timeout: float) -> bytes | None:
        """Request/reply on core NATS (a limit's fast path): the reply, or None when none
        came in time.

        Raises:
            NobodyListens: no subscriber at all.
            ConnectionLost: the connection is closed or reconnecting.
        """
        ...

    # keyed objects: the state projection in the objects bucket
    async def get_state(
        self, object_type: str, key: str, *, leader: bool = False
    ) -> tuple[bytes, int, int] | None:
        """``(state JSON, journal sequence it was made at, KV revision)``, or None;
        ``leader``: as the bucket's leader has it (a replica may be a write behind)."""
        ...

    async def put_state(
        self, object_type: str, key: str, data: bytes, *, journal_seq: int, cursor: int, last: int
    ) -> int | None:
        """Write the projection if its KV revision is still ``last`` (0: absent); the
        new revision, or None when another writer moved it."""
        ...


class SubjectLayout(Protocol):
    """The core NATS subjects workers talk on (one namespace's, see the NATS layout doc)."""

    @property
    def regional(self) -> bool:
        """Whether the namespace has a home region (its workers hold a region lease)."""
        ...

    @property
    def epoch(self) -> int:
        """The namespace's epoch this process writes in (a failover ends it): workers
        of other epochs are not peers, though their core NATS messages cross regions."""
        ...

    def ping(self, worker: str) -> str:
        """Where ``worker`` answers pings (request/reply)."""
        ...

    def take(self, worker: str) -> str:
        """Where ``worker`` is handed runs and keys whose partition owner lacks their code."""
        ...

    def heartbeat(self, worker: str) -> str:
        """Where ``worker`` announces itself; ``"*"`` gives the subject of every worker."""
        ...

    def wake(self, partition: int) -> str:
        """Where a partition's owner is told of new work; the partition is the last token."""
        ...

    def shared_calls(self, object_type: str) -> str:
        """Where workers answer shared handler calls of ``object_type`` (a queue group)."""
        ...


CoreHandler: TypeAlias = Callable[[str, bytes, str | None], Awaitable[None]]
"""A core NATS message handler: ``handler(subject, data, reply)``."""


class ClusterStore(RunStore, Protocol):
    """A :class:`RunStore` plus what a worker needs to share partitions with others:
    core NATS messaging (heartbeats, pings, wake-ups), partition owners compare-and-set
    in the work bucket, and the list of active runs."""

    lease_until: float
    """The ``time.monotonic()`` instant this process's region lease ends (``math.inf``:
    no lease); appends wait for a renewal after it (see :meth:`renew_lease`)."""

    def hold_lease(self) -> None:
        """A worker starts: appends wait for its first renewal (arms the lease)."""
        ...

    def release_lease(self) -> None:
        """A worker stopped: with none left, appends need no lease again."""
        ...

    async def renew_lease(self, lease: float) -> bool:
        """Renew the self-fencing lease of a regional namespace's worker for ``lease``
        seconds by a write only the JetStream meta quorum accepts; whether it was."""
        ...

    @property
    def layout(self) -> SubjectLayout: ...

    async def subscribe_core(
        self, subject: str, handler: CoreHandler, *, queue: str = ""
    ) -> Callable[[], Awaitable[None]]:
        """Subscribe ``handler`` to ``subject`` (wildcards allowed; in queue group
        ``queue`` when given: one member gets each message); returns the unsubscribe."""
        ...

    async def ping(self, subject: str, timeout: float) -> bytes | None:
        """Request/reply: the reply, or None when nobody listens or answers in time."""
        ...

    async def get_owner(self, partition: int) -> tuple[str, int] | None:
        """The partition's owner and the revision of its record, or None when it has none."""
        ...

    async def claim_owner(self, partition: int, worker: str, last: int | None) -> int | None:
        """Take ``partition`` if its record is still at revision ``last`` (None: no owner);
        the new revision, or None when another worker moved first."""
        ...

    async def release_owner(self, partition: int, revision: int) -> None:
        """Delete the owner record if it is still at ``revision``."""
        ...

    async def list_active(self, partitions: set[int]) -> list[tuple[int, str]]:
        """``(partition, eid)`` of the active runs in ``partitions``."""
        ...

    async def clear_note(self, partition: int, eid: str, field: str) -> None: ...

    async def active_note(self, partition: int, eid: str) -> dict[str, Any] | None: ...

    async def note_active(self, partition: int, eid: str, note: bytes) -> None:
        """Write ``note`` (why no worker runs the actor now, a JSON object; ``{}``: no
        note) as its active marker."""
        ...

    async def purge_inbox(self, partition: int, eid: str, below: int) -> None:
        """Remove the messages of ``eid``'s inbox with a sequence under ``below`` (its
        active marker and timers, on subjects of their own, stay)."""
        ...

    async def subscribe_inbox(
        self, handler: Callable[[int, str, Stored | None], Awaitable[None]]
    ) -> Callable[[], Awaitable[None]]:
        """``handler(partition, eid, msg)`` for every message stored in any run's inbox
        from now on, in stream order (``msg`` None for a timer's schedule, which is on a
        subject of its own)."""
        ...


class EndWatch(Protocol):
    """The connection's watch on its journals' end records
    (``fusee.adapters.jetstream.watch.JournalWatch``): ``watching`` yields a waiter to
    hand back to ``next``."""

    def watching(self, eid: str, kinds: Iterable[str]) -> AbstractAsyncContextManager[Any]:
        """Be told of records of ``kinds`` stored in ``eid``'s journal from now on."""
        ...

    async def next(self, waiter: Any, timeout: float) -> tuple[Sequence[StoredMessage], bool]:
        """Up to ``timeout`` seconds: ``(end records of the waiter's kinds, in order;
        whether some may have been missed: read the journal again)``."""
        ...


class HandleLayout(Protocol):
    """The core NATS subjects the handles talk on."""

    def shared_calls(self, object_type: str) -> str:
        """Where workers answer shared handler calls of ``object_type`` (a queue group)."""
        ...


class HandleStore(ObjectReads, Protocol):
    """What the handles use of the store (``Run``, ``ObjectKey``, ``Replies``), and
    nothing more: a connection's store (``NatsStore``) fits it, and so does the unit
    tests' in-memory one."""

    @property
    def layout(self) -> HandleLayout: ...

    @property
    def max_value(self) -> int:
        """The largest value, in bytes of JSON, one record may carry (``RunStore``)."""
        ...

    @property
    def tokens(self) -> TokenReader | None:
        """The namespace's token streams; None: this store has none."""
        ...

    @property
    def journal_watch(self) -> EndWatch: ...

    async def read_journal(self, eid: str, after: int = 0) -> Sequence[StoredMessage]: ...

    async def last_in_journal(self, eid: str) -> StoredMessage | None: ...

    async def get_index(self, eid: str) -> bytes | None: ...

    async def get_index_entry(self, eid: str) -> tuple[bytes, int, int] | None:
        """``(value, journal sequence, revision)`` (see ``RunStore``)."""
        ...

    async def owner_alive(self, partition: int) -> bool:
        """Whether ``partition`` has an owner that answers its ping."""
        ...

    async def send_inbox(
        self, partition: int, eid: str, kind: str, body: bytes, *, msg_id: str | None = None
    ) -> int:
        """Store a message in ``eid``'s inbox; ``msg_id`` dedupes a resend."""
        ...

    async def send_inbox_once(
        self, partition: int, eid: str, kind: str, body: bytes, *, msg_id: str
    ) -> tuple[int, bool]:
        """``send_inbox``, and whether the store took it for a duplicate of an earlier
        message with ``msg_id`` (the sequence is then the earlier one's)."""
        ...

    async def send_unless_ended(
        self, partition: int, eid: str, kind: str, body: bytes, *, msg_id: str | None = None
    ) -> int | None:
        """``send_inbox`` unless run ``eid`` has ended (checked in the same write): None
        and nothing stored when it had. A journal of an earlier version has its end
        record on ``.j``, which ``NatsStore``'s check does not see: the message is
        stored."""
        ...

    async def read_inbox(
        self, partition: int, eid: str, after: int = 0, *, limit: int = 0
    ) -> Sequence[StoredMessage]: ...

    def reply_prefix(self) -> str:
        """A new prefix of reply subjects under this connection's own inbox (a role's
        subscribe permission names only its own replies)."""
        ...

    async def wake(self, partition: int, eid: str) -> None:
        """Hint the partition's owner that the actor has news (may be lost)."""
        ...

    async def ensure_active(self, partition: int, eid: str) -> None:
        """Make sure the actor has an active marker (not an idle one), then hint its owner."""
        ...

    async def mark_run_active(self, partition: int, eid: str, marker: bytes) -> None:
        """Write a run's active marker (its index entry as its start makes it), then
        hint its owner: a paused run that is resumed is active again."""
        ...

    async def active_note(self, partition: int, eid: str) -> dict[str, Any] | None:
        """The JSON object the actor's active marker holds, or None without a marker."""
        ...

    async def subscribe_core(
        self, subject: str, handler: CoreHandler, *, queue: str = ""
    ) -> Callable[[], Awaitable[None]]:
        """Subscribe ``handler`` to ``subject`` (see ``ClusterStore``); returns the
        unsubscribe."""
        ...

    async def request_core(self, subject: str, data: bytes, timeout: float) -> bytes | None:
        """Request/reply on core NATS: the reply, or None when none came in time.

        Raises:
            NobodyListens: no subscriber at all.
        """
        ...
