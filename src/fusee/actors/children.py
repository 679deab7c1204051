"""Child runs (``ctx.child``): starting one, telling its parent how it ended, and
cancelling the children a parent leaves behind. See "Child runs" in docs/design.md."""

from __future__ import annotations

import secrets
from typing import Any

import msgspec

from fusee._logging import get_logger
from fusee.actors.ports import RunStore
from fusee.actors.run_index import project_index
from fusee.errors import Fenced, RunExists
from fusee.runtime.history import History
from fusee.runtime.ids import escape, partition_of
from fusee.runtime.inbox import Cancel, ChildEnded, encode_message
from fusee.runtime.index import info_from_history
from fusee.runtime.records import (
    TERMINAL,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    decode_record,
    encode_record,
    kind_of,
)

__all__ = ("start_child", "notify_parent", "cancel_children", "live_children")

log = get_logger()


async def start_child(
    store: RunStore,
    partitions: int,
    *,
    parent: str,
    workflow: str,
    child_id: str,
    data: bytes,
    timeout: float | None,
    now: float,
) -> None:
    """Start run ``child_id`` as a child of ``parent``, create-if-absent like
    ``Engine.start``: starting it again (a replay, a resumed parent) attaches.

    Raises:
        RunExists: a run with this ID exists with another workflow or input, or is not
            a child of ``parent``.
    """
    eid = escape(child_id)
    partition = partition_of(child_id, partitions)
    record = RunStarted(
        workflow=workflow,
        input=msgspec.Raw(data),
        started_at=now,
        timeout=timeout,
        partition=partition,
        parent=parent,
    )
    encoded = encode_record(record)
    try:
        seq = await store.append(
            eid, kind_of(record), encoded, fence=0, msg_id=f"{eid}:start:{secrets.token_hex(6)}"
        )
    except Fenced:
        await _check_existing(store, eid, child_id, record)
        return
    history = History(child_id)
    history.feed(seq, encoded)
    await project_index(store, eid, info_from_history(history, now=now), seq)
    await store.mark_active(partition, eid)
    await store.wake(partition, eid)
    log.info("child.started", child=child_id, workflow=workflow)


async def _check_existing(store: RunStore, eid: str, child_id: str, wanted: RunStarted) -> None:
    first = await store.first_in_journal(eid)
    if first is None:  # pragma: no cover - the fence said there was one
        raise RunExists(f"run {child_id!r} exists but its journal cannot be read")
    started = decode_record(first.data)
    assert isinstance(started, RunStarted)
    if started.workflow != wanted.workflow:
        raise RunExists(
            f"run {child_id!r} exists with workflow {started.workflow!r}, not {wanted.workflow!r}"
        )
    if bytes(started.input) != bytes(wanted.input):
        raise RunExists(f"run {child_id!r} exists with another input")
    if started.parent != wanted.parent:
        owner = started.parent if isinstance(started.parent, str) else None
        raise RunExists(
            f"run {child_id!r} exists, but as "
            f"{'a child of ' + repr(owner) if owner else 'a top-level run'}, "
            f"not as a child of {wanted.parent!r}"
        )
    # A start whose marker write was lost (the parent died in between): restore it.
    last = await store.last_in_journal(eid)
    if last is not None and not isinstance(decode_record(last.data), TERMINAL):
        await store.mark_active(started.partition, eid)


def child_message(run_id: str, end: Any) -> bytes:
    """What an ended child sends its parent's inbox."""
    msg = ChildEnded(id=run_id)
    if isinstance(end, RunCompleted):
        msg = ChildEnded(id=run_id, status="completed", result=end.result)
    elif isinstance(end, RunFailed):
        msg = ChildEnded(id=run_id, status="failed", error_type=end.error_type, message=end.message)
    elif isinstance(end, RunCancelled):
        msg = ChildEnded(id=run_id, status="cancelled", reason=end.reason)
    return encode_message(msg)


async def notify_parent(store: RunStore, partitions: int | None, history: History) -> None:
    """An ended child tells its parent (again, when activated again: idempotent)."""
    started, end = history.started, history.end
    if started is None or end is None or not isinstance(started.parent, str):
        return
    if partitions is None:  # pragma: no cover - an actor built without its worker
        log.warning("child.unrouted", parent=started.parent)
        return
    parent = started.parent
    peid, pp = escape(parent), partition_of(parent, partitions)
    body = child_message(history.run_id, end)
    await store.send_inbox(pp, peid, "child", body, msg_id=f"{peid}:child:{escape(history.run_id)}")
    await store.wake(pp, peid)


def live_children(history: History) -> list[str]:
    """The IDs of the children the run started and has not seen end."""
    return [
        w.name
        for pos, w in sorted(history.waits.items())
        if w.wait == "child" and pos not in history.waited
    ]


async def cancel_children(
    store: RunStore, partitions: int | None, history: History, reason: str
) -> None:
    """Cancel the children the ended run still waited for (those not ended yet)."""
    for child in live_children(history):
        await cancel_child(store, partitions, history.run_id, child, reason)


async def cancel_child(
    store: RunStore, partitions: int | None, parent: str, child: str, reason: str
) -> None:
    """Cancel the child run ``child`` of ``parent`` unless it has ended or is not ours."""
    if partitions is None:
        return
    eid = escape(child)
    last = await store.last_in_journal(eid)
    if last is None or isinstance(decode_record(last.data), TERMINAL):
        return
    first = await store.first_in_journal(eid)
    started = decode_record(first.data) if first is not None else None
    if not isinstance(started, RunStarted) or started.parent != parent:
        return  # not ours: ctx.child raised RunExists for it
    p = partition_of(child, partitions)
    body = encode_message(Cancel(reason=reason))
    await store.send_inbox(p, eid, "cancel", body, msg_id=f"{eid}:cancel:parent")
    await store.wake(p, eid)
    log.info("child.cancelled", child=child, reason=reason)
