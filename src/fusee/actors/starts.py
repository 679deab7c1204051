"""Starting a run, create-if-absent: ``Engine.start`` and ``ctx.child`` both append the
run's ``run.started`` under fence 0, then either set up the new run or attach to the
one that exists (see "Starting a run" in docs/design.md)."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

from fusee.actors.ports import RunStore
from fusee.errors import Fenced
from fusee.runtime.history import History
from fusee.runtime.ids import escape
from fusee.runtime.index import encode_info, info_from_history
from fusee.runtime.records import RunStarted, encode_record, kind_of

__all__ = ("start_or_attach", "start_marker")


def start_marker(run_id: str, first: bytes, *, now: float) -> bytes:
    """What a run's active marker holds: its index entry as its first record (``first``,
    encoded) makes it, ``pending`` (``runs list`` shows it until the index has one)."""
    started = History(run_id)
    started.feed(1, first)  # (where it landed is not needed: the entry does not say)
    return encode_info(info_from_history(started, now=now))


async def start_or_attach(
    store: RunStore,
    run_id: str,
    record: RunStarted,
    *,
    now: float,
    attach: Callable[[], Awaitable[None]],
    before_active: Callable[[History], Awaitable[None]] | None = None,
) -> bool:
    """Append ``record`` as run ``run_id``'s first (fence 0): True when this started
    the run, False when it existed and ``attach()`` accepted it.

    A new run's active marker (which holds its index entry as the start makes it: the
    run index has no entry for it until it parks, pauses or ends) rides the record's
    write. With ``before_active`` (which may append more records first: a regenerated
    run's copies) the marker is written alone after it, so no worker runs the run
    before. Then a wake hint to its partition's owner. ``attach`` checks the existing run against
    this start (raising ``RunExists``) and restores what a starter that died may have
    left undone.

    Raises:
        RunExists: from ``attach``.
    """
    eid = escape(run_id)
    encoded = encode_record(record)
    kind, msg_id = kind_of(record), f"{eid}:start:{secrets.token_hex(6)}"
    marker = start_marker(run_id, encoded, now=now)
    try:
        if before_active is None:
            seq = await store.start_run(
                eid, kind, encoded, partition=record.partition, marker=marker, msg_id=msg_id
            )
        else:
            seq = await store.append(eid, kind, encoded, fence=0, msg_id=msg_id)
    except Fenced:
        await attach()
        return False
    if before_active is None:
        await store.wake(record.partition, eid)
        return True
    history = History(run_id)
    history.feed(seq, encoded)
    await before_active(history)
    await store.mark_run_active(record.partition, eid, marker)  # (and the wake hint)
    return True
