"""A keyed object's life cycle, sans I/O: which invocation runs next, what an
invocation decided without its handler ends with, when a caller is answered, when the
state is projected, and when an idle key leaves.

The object's driver (``actors/object_actor.py``) runs the handlers' code and performs
the commands this machine answers with, in order, feeding back what it read or what
landed:

- :meth:`ObjectLife.loaded`: the object as read (its projection and the journal past
  it); the catch-up of a projection left behind (:class:`Reply` of each invocation it
  missed, then one :class:`PutState` written now: once it has caught up, no activation
  sends those replies);
- :meth:`ObjectLife.inbox`: what a read of the inbox brought, in inbox order, sorted
  against the invocation begun as the read returned (not as it began: one may end and
  the next begin while a read awaits the server): invocations queue up, a cancel marks
  its target (:class:`CancelRunning` when that is the running invocation; its reason
  is kept with its target's inbox sequence, so it never ends another), the rest is
  :class:`Keep` (the running invocation's waits); :class:`QueueChanged` when something
  was queued (or a cancel read);
- :meth:`ObjectLife.next`: the invocation to run, the one the journal shows begun, else
  the oldest queued above the cursor; :meth:`ObjectLife.start`: what it is
  (:class:`Decided`: it ends without its handler; :class:`RunEdit`;
  :class:`RunHandler`); :meth:`ObjectLife.unrunnable`: the key cannot run it here;
- :meth:`ObjectLife.ended`: its ``obj.done`` landed (the only way to an end: never a
  reply before it): the state folds, the caller gets its :class:`Reply`, and the
  projection is written in the background (:class:`PutState`) every
  :data:`REPROJECT_AFTER` records (or when there is none yet);
- :meth:`ObjectLife.leaving`: the activation leaves memory, the projection catches up
  with the last invocation that ended;
- :meth:`ObjectLife.idle_begin` / :meth:`ObjectLife.idle_next`: nothing queued; sleep,
  or leave (``Park``) once :class:`~fusee.runtime.waits.Idle` says so, never with work
  queued.

``tests/unit/test_object_life.py`` drives this with every order and combination of its
events; ``tests/unit/test_life_machine.py`` runs the whole driver over a store that dies.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias

from fusee.runtime.inbox import NULL, Cancel, InboxMessage, Invoke, Unknown
from fusee.runtime.life_events import Log
from fusee.runtime.objects import (
    EDIT,
    State,
    encode_state,
    fold,
    parse_object_id,
    untargeted_cancel,
)
from fusee.runtime.records import Invocation, ObjectDone
from fusee.runtime.waits import Idle, Park, Sleep

__all__ = (
    "REPROJECT_AFTER",
    "error_fields",
    "ObjectLife",
    "Loaded",
    "Reply",
    "PutState",
    "RaiseWriteError",
    "Keep",
    "CancelRunning",
    "QueueChanged",
    "Decided",
    "RunEdit",
    "RunHandler",
    "Command",
)

# The projection is rewritten after this many journal records even when the state did
# not change, so an activation never reads more than about this many records.
REPROJECT_AFTER = 64

# -- what the driver feeds ---------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """The object as read: ``state`` and ``cursor`` after its last ``obj.done``;
    ``revision``: the projection's KV revision (0: none); ``projected_at``: the record
    it was made at (0: none); ``unprojected``: the invocations that ended after it,
    with the journal sequence of their ``obj.done``; ``size``: the records read."""

    state: State
    cursor: int
    revision: int
    projected_at: int
    unprojected: tuple[tuple[Invocation, ObjectDone, int], ...]
    size: int


# -- commands ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """Answer the caller of ``invocation`` (none: nothing) with ``done``, landed at
    journal sequence ``at``."""

    invocation: Invocation
    done: ObjectDone
    at: int


@dataclass(frozen=True)
class PutState:
    """Write the projection ``data`` tagged with journal record ``seq`` and ``cursor``
    (compare-and-set on the revision the driver knows; answer
    :meth:`ObjectLife.projected`). ``background``: after the put before it, off the
    caller's path (else now, awaited)."""

    data: bytes
    seq: int
    cursor: int
    background: bool


@dataclass(frozen=True)
class RaiseWriteError:
    """A background projection write that failed: its error leaves the actor now."""


@dataclass(frozen=True)
class Keep:
    """A message for the running invocation's waits (a signal, a timer, a child's end)."""

    seq: int
    message: InboxMessage


@dataclass(frozen=True)
class CancelRunning:
    """Stop the running invocation's code (a cancel of it was read)."""


@dataclass(frozen=True)
class QueueChanged:
    """An invocation or a cancel was read: an idle wait ends."""


@dataclass(frozen=True)
class Decided:
    """The invocation ends without its handler: ``fields`` of its ``obj.done``."""

    fields: dict[str, Any]


@dataclass(frozen=True)
class RunEdit:
    """The built-in edit handler (``objects edit / set / clear``)."""


@dataclass(frozen=True)
class RunHandler:
    """Run the handler's code (``shared``: on a read-only view of the state)."""

    shared: bool


Command: TypeAlias = (
    Log
    | Reply
    | PutState
    | RaiseWriteError
    | Keep
    | CancelRunning
    | QueueChanged
    | Decided
    | RunEdit
    | RunHandler
)


def error_fields(error_type: str, message: str) -> dict[str, Any]:
    """An ``obj.done``'s error fields (what ``Decided`` and a handler's end carry)."""
    return {"error_type": error_type, "message": message}


class ObjectLife:
    """One object key's driver decisions, across its activations (each begins with
    :meth:`loaded`). ``object_id``: its actor ID, for messages; ``park_after``: how
    long it stays in memory with nothing queued."""

    def __init__(
        self, object_id: str, *, park_after: float, reproject_after: int = REPROJECT_AFTER
    ) -> None:
        self.object_id = object_id
        named = parse_object_id(object_id)
        self.object_type = named[0] if named is not None else object_id
        self.park_after = park_after
        self.reproject_after = reproject_after
        self.state: State = {}
        self.cursor = 0  # inbox sequence of the last invocation that ended
        # invocations read, not begun, in arrival order
        self.queue: collections.deque[tuple[int, Invoke | Unknown]] = collections.deque()
        self.cancels: dict[int, str] = {}  # a queued invocation's sequence: why it is off
        self.malformed: dict[int, str] = {}  # an invoke that does not fit: why
        self.running: Invocation | None = None
        # a cancel of the running (or begun) invocation: why, and the inbox sequence of
        # its target (start() applies it to that invocation only)
        self.cancel_reason: str | None = None
        self.cancel_of = 0
        self.revision = 0  # the projection's KV revision (compare-and-set), 0: none
        self.version = 0  # how many reads queued something (or a cancel)
        self._projected_size = 0  # the journal's size when the projection was written
        self._projected_at = 0  # the journal record it was made at
        self._boundary = 0  # the obj.done of the last invocation that ended
        self._idle: Idle | None = None
        self._idle_version = 0

    # -- activation -------------------------------------------------------------------

    def loaded(self, snap: Loaded) -> list[Command]:
        """An activation read the object; the catch-up of a projection behind."""
        self.state, self.cursor = snap.state, snap.cursor
        self.revision = snap.revision
        self._projected_size = 1 if snap.projected_at else 0
        self._projected_at = snap.projected_at
        # The projection is tagged with the obj.done of the last invocation it holds,
        # never with a record inside an invocation: an activation reads the journal
        # from its tag on and must see where a begun invocation began.
        self._boundary = snap.unprojected[-1][2] if snap.unprojected else snap.projected_at
        self.queue.clear()
        self.cancels = {}
        self.cancel_reason, self.cancel_of = None, 0
        if not snap.unprojected:
            return []
        out: list[Command] = [
            Log("info", "object.projection_caught_up", {"invocations": len(snap.unprojected)})
        ]
        # the replies first: once the projection has caught up, no activation sends them
        out += [Reply(inv, done, at) for inv, done, at in snap.unprojected]
        self._projected_size, self._projected_at = snap.size, self._boundary
        out.append(PutState(encode_state(self.state), self._boundary, self.cursor, False))
        return out

    def projected(self, revision: int) -> None:
        """A :class:`PutState` landed at KV ``revision``."""
        self.revision = revision

    # -- the inbox --------------------------------------------------------------------

    def inbox(
        self,
        messages: Iterable[tuple[int, InboxMessage | Unknown]],
        *,
        begun: Invocation | None,
        begun_at: int,
        before: Invocation | None,
    ) -> list[Command]:
        """What a read of the inbox brought. ``begun``: the invocation the journal
        shows begun and not ended as the read returned (the one a cancel must reach);
        ``begun_at``: the journal record it began at; ``before``: the one begun as the
        read began (another than ``begun``: an invocation ended or began during the
        read, so an untargeted cancel means the new one only when its first record
        landed before the cancel was stored)."""
        settled = begun is before
        out: list[Command] = []
        queued = False
        for seq, msg in messages:
            if isinstance(msg, Invoke) or (isinstance(msg, Unknown) and msg.kind == "invoke"):
                self.queue.append((seq, msg))
                queued = True
            elif isinstance(msg, Cancel):
                reason = msg.reason or "cancelled"
                target = msg.target
                if target is None:  # "the running one": the one running when it was stored
                    target = untargeted_cancel(
                        seq, begun, begun_at, running_here=settled and self.running is begun
                    )
                if begun is not None and target == begun.inbox_seq:
                    if self.cancel_reason is None or self.cancel_of != target:
                        self.cancel_reason, self.cancel_of = reason, target
                        out.append(
                            Log(
                                "info",
                                "invocation.cancelling",
                                {"inbox_seq": begun.inbox_seq, "reason": reason},
                            )
                        )
                        out.append(CancelRunning())
                elif target is not None and target > self.cursor:
                    self.cancels[target] = reason
                    queued = True
            elif not isinstance(msg, Unknown):
                out.append(Keep(seq, msg))
        if queued:
            self.version += 1
            out.append(QueueChanged())
        return out

    # -- one invocation ---------------------------------------------------------------

    def next(
        self,
        begun: Invocation | None,
        clock: Callable[[], float],
        timeout: Callable[[str], float | None],
    ) -> Invocation | None:
        """The invocation to run: ``begun`` (the journal shows it begun before a crash
        or an eviction: it resumes), else the oldest queued above the cursor (None:
        nothing). ``clock``: now (read only for an invocation built); ``timeout``: a
        handler's timeout."""
        if begun is not None:
            return begun
        while self.queue:
            seq, msg = self.queue.popleft()
            if seq <= self.cursor:
                continue
            if isinstance(msg, Unknown):  # an invoke that does not fit: it fails alone
                self.malformed[seq] = msg.why
                return Invocation(
                    handler="", input=NULL, inbox_seq=seq, started_at=clock(), reply=msg.reply
                )
            return Invocation(
                handler=msg.handler,
                input=msg.input,
                inbox_seq=seq,
                started_at=clock(),
                timeout=timeout(msg.handler),
                reply=msg.reply,
            )
        return None

    def unrunnable(self, registered: bool, inv: Invocation, names: Iterable[str]) -> Log | None:
        """None when this worker can run ``inv`` (its type is registered, or it is an
        edit; ``names``: the types it has); else the line the activation logs as it
        leaves, unrunnable."""
        if registered or inv.handler == EDIT:
            return None
        object_type = self.object_type
        reason = (
            f"no object type named {object_type!r} is registered at this worker "
            f"(it has: {', '.join(names) or 'none'})"
        )
        return Log("error", "object.unrunnable", {"reason": reason})

    def start(
        self, inv: Invocation, *, handlers: dict[str, bool] | None, journaled: int
    ) -> Decided | RunEdit | RunHandler:
        """``inv`` begins: what it is. ``handlers``: the type's handlers (shared or
        not; None: the type is not registered here); ``journaled``: the records its
        generation holds already (a resumed invocation's)."""
        self.running = inv
        if self.cancel_of != inv.inbox_seq:
            # defensive: a cancel of another is never this one's (``ended`` clears the
            # reason, and ``inbox`` sets it only for the one begun; no test reaches it)
            self.cancel_reason = None
        if inv.inbox_seq in self.cancels:
            self.cancel_reason = self.cancels.pop(inv.inbox_seq)
            self.cancel_of = inv.inbox_seq
        malformed = self.malformed.pop(inv.inbox_seq, None)  # (also when cancelled first)
        if self.cancel_reason is not None and journaled == 0:
            return Decided(error_fields("fusee.Cancelled", self.cancel_reason))  # while queued
        if malformed is not None:
            return Decided(
                error_fields(
                    "fusee.InvalidInput",
                    f"the invocation at inbox sequence {inv.inbox_seq} of object "
                    f"{self.object_id!r} is malformed: {malformed}",
                )
            )
        if inv.handler == EDIT:
            return RunEdit()
        assert handlers is not None
        if inv.handler not in handlers:
            object_type = self.object_type
            return Decided(
                error_fields(
                    "fusee.UnknownHandler",
                    f"object {object_type!r} has no handler {inv.handler!r} "
                    f"(it has: {', '.join(sorted(handlers))})",
                )
            )
        return RunHandler(shared=handlers[inv.handler])

    def ended(self, inv: Invocation, done: ObjectDone, at: int, size: int) -> list[Command]:
        """``done`` landed at journal sequence ``at`` (the journal now holds ``size``
        records): the state folds, the caller is answered, the projection follows."""
        self.state = fold(self.state, done)
        self.cursor = inv.inbox_seq
        out: list[Command] = []
        if done.ok:
            fields: dict[str, Any] = {"handler": inv.handler, "inbox_seq": inv.inbox_seq}
            out.append(Log("info", "invocation.completed", fields))
        else:
            fields = {
                "handler": inv.handler,
                "inbox_seq": inv.inbox_seq,
                "error": f"{done.error_type}: {done.message}",
            }
            out.append(Log("info", "invocation.failed", fields))
        out.append(Reply(inv, done, at))
        # Written in the background once REPROJECT_AFTER records behind the journal (or
        # there is none yet), never on the call's path: every reader of the state folds
        # the journal past a projection that is behind, so it sees every invocation a
        # caller was answered for.
        out.append(RaiseWriteError())
        self._boundary = at
        if not self.revision or size - self._projected_size >= self.reproject_after:
            out.append(self._put(size))
        # defensive (no test reaches it): a cancel of this one still queued is dropped,
        # it is over
        self.cancels.pop(inv.inbox_seq, None)
        self.running = None
        self.cancel_reason, self.cancel_of = None, 0
        return out

    def leaving(self, size: int) -> list[Command]:
        """Leaving memory (idle, parked, evicted): the projection catches up with the
        last invocation that ended, so a key at rest shows its state and the next
        activation reads a short journal."""
        return [self._put(size)] if self._boundary != self._projected_at else []

    def _put(self, size: int) -> PutState:
        self._projected_size, self._projected_at = size, self._boundary
        return PutState(encode_state(self.state), self._boundary, self.cursor, True)

    # -- idle -------------------------------------------------------------------------

    def idle_begin(self, now: float) -> None:
        """Nothing to run: the idle wait begins."""
        self._idle = Idle(park_after=self.park_after, now=now)
        self._idle_version = self.version

    def idle_next(self, *, seen: int, now: float) -> Sleep | Park | None:
        """Sleep (until something is queued, or ``Sleep.until``), leave (``Park``:
        nothing was queued for ``park_after`` seconds), or None: something was queued
        (or a cancel read) since the wait began, serve it."""
        assert self._idle is not None
        if self.version != self._idle_version:
            return None
        return self._idle.next(version=self.version, seen=seen, now=now)
