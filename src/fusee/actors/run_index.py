"""Writing the run index: a projection of the journal that never goes back.

Each entry is tagged with the journal record it was made from (``Fusee-Journal-Seq``)
and written by compare-and-set, so a writer that read less of the journal (a frozen
owner that wakes up and parks a run that ended elsewhere) cannot overwrite what a
writer that read more wrote. An ended run's entry is final: it is written without
comparing, with the removal of the run's active marker, and read before any other.
"""

from __future__ import annotations

import msgspec

from fusee.actors.ports import RunStore
from fusee.errors import FuseeError
from fusee.runtime.ids import unescape
from fusee.runtime.index import (
    UNREAD,
    Current,
    IndexEntry,
    RunInfo,
    decode_info,
    encode_info,
    supersedes,
)

__all__ = ("project_index", "MAX_REFUSALS")

# Compare-and-sets refused in a row before giving up: each refusal means another writer
# wrote in between (a run has one owner at a time, so a few at most), never this many.
MAX_REFUSALS = 100


def _same(old: RunInfo, new: RunInfo) -> bool:
    """Whether the two entries say the same, whenever they were made."""
    return msgspec.structs.replace(old, updated_at=0.0) == msgspec.structs.replace(
        new, updated_at=0.0
    )


async def project_index(
    store: RunStore,
    eid: str,
    info: RunInfo,
    journal_seq: int,
    *,
    unmark: int | None = None,
    current: Current = UNREAD,
    seen: int | None = None,
) -> bool:
    """Write ``info`` (made from the journal up to ``journal_seq``) unless the index
    holds an entry made from more of it. True when written (or already there).

    An ended run's entry goes with the removal of its active marker, in one write.
    ``unmark``: the run's partition, when it leaves the active runs otherwise (it
    paused): its active marker is removed too (also when nothing is written).
    ``current``: what the index holds, when the caller knows (it just read it, or
    None: the run's end just landed, so nothing can be there to compare with); else
    ``UNREAD``: it is read first. Only the final entry is read for an ended run's (it
    is not compared with the bucket's: see below). ``seen``: with ``unmark``, the
    last inbox message the leaving activation read: its marker stays if a cancel or a
    resume came while it left (``RunStore.clear_run_active``).

    Raises:
        FuseeError: the entry's compare-and-set was refused ``MAX_REFUSALS`` times in
            a row (the store and its reads disagree: nothing else loops here)."""
    fresh = current is None  # the run's end just landed: its store may trust its listing
    for attempt in range(MAX_REFUSALS):
        if attempt or current is UNREAD:
            current = await _read(store, eid, ended=info.ended)
        last = 0
        if current is not None:
            raw, seq, last = current
            old: RunInfo | None = None
            if raw:
                try:
                    old = decode_info(raw)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    old = None  # unreadable (corrupt, another SDK's): replaced
            if raw and last == 0 and not info.ended:
                # an ended run's final entry (revision 0), readable or not: readers take
                # it before the bucket's, no compare-and-set replaces it, and nothing a
                # run does after its end makes it wrong (an unreadable one is replaced
                # by the next ended write, the end_run below)
                await _unmark(store, eid, unmark, seen=seen)
                return False
            if old is not None and not supersedes(info, journal_seq, old, seq):
                await _unmark(store, eid, unmark, seen=seen)
                return False
            if old is not None and seq == journal_seq and _same(old, info):
                # an ended run activated again (a reconcile listed its marker in the
                # second it lingers): the entry says this already, nothing is written
                await _unmark(store, eid, unmark, info, seen=seen)
                return True
        if info.ended:
            # made from the journal's end: no later record can make it wrong, so it is
            # written without comparing (a writer that read less compares and loses),
            # with the removal of the run's marker
            partition = info.partition if unmark is None else unmark
            await store.end_run(
                partition, eid, encode_info(info), journal_seq=journal_seq, fresh=fresh
            )
            return True
        written = await store.put_index(eid, encode_info(info), journal_seq=journal_seq, last=last)
        if written is not None:
            await _unmark(store, eid, unmark, info, seen=seen)
            return True
    raise FuseeError(
        f"the index entry of run {unescape(eid)!r} was not written: its compare-and-set was refused "
        f"{MAX_REFUSALS} times in a row"
    )


async def _read(store: RunStore, eid: str, *, ended: bool) -> IndexEntry | None:
    if not ended:
        return await store.get_index_entry(eid)
    # An ended run's entry replaces anything but a final entry that says the same (an
    # ended run activated again): the bucket's, compared with by no ended write, is
    # not read.
    final = await store.get_final_entry(eid)
    return None if final is None else (final[0], final[1], 0)


async def _unmark(
    store: RunStore,
    eid: str,
    partition: int | None,
    info: RunInfo | None = None,
    *,
    seen: int | None = None,
) -> None:
    """Remove the run's marker; a paused run's entry just written (``info``) is listed
    under its status and workflow in the same write (see ``Layout.listing``)."""
    if partition is None:
        return
    if info is not None and info.status == "paused":
        await store.clear_run_active(partition, eid, listed=encode_info(info), seen=seen)
    else:
        await store.clear_run_active(partition, eid, seen=seen)
