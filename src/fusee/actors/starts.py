"""Starting a run, create-if-absent: ``Engine.start`` and ``ctx.child`` both append the
run's ``run.started`` under fence 0, then either set up the new run or attach to the
one that exists (see "Starting a run" in docs/design.md)."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

from fusee.actors.ports import RunStore
from fusee.actors.run_index import project_index
from fusee.errors import Fenced
from fusee.runtime.history import History
from fusee.runtime.ids import escape
from fusee.runtime.index import info_from_history
from fusee.runtime.records import RunStarted, encode_record, kind_of

__all__ = ("start_or_attach",)


async def start_or_attach(
    store: RunStore,
    run_id: str,
    record: RunStarted,
    *,
    now: float,
    attach: Callable[[], Awaitable[None]],
    before_active: Callable[[History], Awaitable[None]] | None = None,
    wake: bool = False,
) -> bool:
    """Append ``record`` as run ``run_id``'s first (fence 0): True when this started
    the run, False when it existed and ``attach()`` accepted it.

    A new run gets its index entry, then its active marker (after ``before_active``,
    which may append more records first), then a wake hint when ``wake``. ``attach``
    checks the existing run against this start (raising ``RunExists``) and restores
    what a starter that died may have left undone.

    Raises:
        RunExists: from ``attach``.
    """
    eid = escape(run_id)
    encoded = encode_record(record)
    try:
        seq = await store.append(
            eid, kind_of(record), encoded, fence=0, msg_id=f"{eid}:start:{secrets.token_hex(6)}"
        )
    except Fenced:
        await attach()
        return False
    history = History(run_id)
    history.feed(seq, encoded)
    if before_active is not None:
        await before_active(history)
    await project_index(store, eid, info_from_history(history, now=now), seq)
    await store.mark_active(record.partition, eid)
    if wake:
        await store.wake(record.partition, eid)
    return True
