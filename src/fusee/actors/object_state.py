"""An object's state and journal as stored, read the same way by its actor (activation),
by ``ObjectKey.show`` and by the readers of its state (``state()``, shared handlers).

The KV projection holds the whole state, tagged with the journal record it was made at
(``Fusee-Journal-Seq``). Reading an object is: the projection, then the journal from
that record on, with the ``obj.done`` records after it folded in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fusee.actors.ports import ObjectReads, scheduler_of
from fusee.errors import InvalidArgument, JournalGap
from fusee.logs import get_logger
from fusee.runtime.history import History
from fusee.runtime.ids import escape
from fusee.runtime.objects import State, decode_state, fold, object_id
from fusee.runtime.records import Invocation, ObjectDone, decode_record

__all__ = ("ObjectSnapshot", "read_object", "current_state")

log = get_logger()


@dataclass
class ObjectSnapshot:
    """An object as read from NATS.

    Attributes:
        history: its journal from the projection's record on (the running invocation,
            if one has begun, is ``history.invocation`` with ``history.done`` None).
        state: the state after the last ``obj.done``.
        cursor: the inbox sequence of the last invocation that ended.
        fence: the sequence of its last journal record (0: none).
        revision: the KV revision of the projection (0: none).
        projected_at: the journal record the projection was made at (0: none, or
            untagged), the first record of ``history``.
        unprojected: invocations that ended after the projection was made, with the
            journal sequence of their ``obj.done`` (a writer died between the two).
        last: the last ``obj.done`` read.
    """

    history: History
    state: State = field(default_factory=dict)
    cursor: int = 0
    fence: int = 0
    revision: int = 0
    projected_at: int = 0
    unprojected: list[tuple[Invocation, ObjectDone, int]] = field(default_factory=list)
    last: ObjectDone | None = None


async def read_object(store: ObjectReads, object_type: str, key: str) -> ObjectSnapshot:
    """Read the object's projection and the journal from its record on.

    Raises:
        JournalGap: the projection names a record the journal does not hold, or the
            journal's chain is broken.
    """
    actor_id = object_id(object_type, key)
    snap = ObjectSnapshot(History(actor_id))
    # from the leader: its revision is what the next write compares with, and a
    # replica a write behind would make that write look like another owner's (Fenced)
    projection = await store.get_state(object_type, key, leader=True)
    anchor = 0
    if projection is not None:
        data, anchor, snap.revision = projection
        try:
            # without its journal tag it was written by hand: rebuilt from the journal
            snap.state = decode_state(data) if anchor else {}
        except Exception:  # noqa: BLE001 - unreadable: rebuilt from the journal too
            log.warning("object.projection_unreadable", revision=snap.revision)
            anchor = 0
    snap.projected_at = anchor
    records = await store.read_journal(escape(actor_id), max(0, anchor - 1))
    if anchor and (not records or records[0].seq != anchor):
        raise JournalGap(
            f"object {actor_id!r}: its state in KV was made at journal sequence {anchor}, "
            f"which is not in its journal (the journal was purged or the state was written "
            f"by hand)"
        )
    history = snap.history
    for i, msg in enumerate(records):
        record = history.feed(
            msg.seq, msg.data, anchor=bool(anchor) and i == 0, scheduler=scheduler_of(msg)
        )
        snap.fence = msg.seq
        if isinstance(record, ObjectDone):
            snap.cursor, snap.last = record.inbox_seq, record
            if msg.seq > anchor:
                snap.state = fold(snap.state, record)
                if history.invocation is not None:
                    snap.unprojected.append((history.invocation, record, msg.seq))
    return snap


async def current_state(store: ObjectReads, object_type: str, key: str) -> State:
    """The object's state after every ``obj.done`` in its journal: the KV projection,
    with the ``obj.done`` records after its tag folded in. The projection is written
    after the reply (in the background), so it may be behind what some caller was
    already answered for, by any engine; the journal never is. Two reads, the second
    empty when the projection is current."""
    projected = await store.get_state(object_type, key)
    state: State = {}
    seq = 0
    if projected is not None and projected[1]:  # untagged (by hand): from the journal
        try:
            state, seq = decode_state(projected[0]), projected[1]
        except InvalidArgument:  # unreadable: rebuilt from the journal
            state, seq = {}, 0
    for msg in await store.read_journal(escape(object_id(object_type, key)), seq):
        record = decode_record(msg.data)
        if isinstance(record, ObjectDone):
            state = fold(state, record)
    return state
