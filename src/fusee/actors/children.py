"""Child runs (``ctx.child``): starting one, telling its parent how it ended, and
cancelling the children a parent leaves behind. See "Child runs" in docs/design.md."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec

from fusee.actors.host import ActorHost
from fusee.actors.ports import RunStore
from fusee.actors.starts import start_marker, start_or_attach
from fusee.actors.waits import start_wait
from fusee.errors import FuseeError, RunExists
from fusee.errors import RunCancelled as ChildCancelled
from fusee.errors import RunFailed as ChildFailed
from fusee.logs import get_logger
from fusee.runtime.codec import decode_value
from fusee.runtime.history import History, Replayer
from fusee.runtime.ids import escape, partition_of
from fusee.runtime.inbox import Cancel, ChildEnded, encode_message
from fusee.runtime.records import (
    TERMINAL,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    WaitDone,
    decode_record,
)
from fusee.runtime.run_life import live_children

__all__ = (
    "run_child",
    "start_child",
    "notify_parent",
    "cancel_children",
    "cancel_child",
    "live_children",
)

log = get_logger()


async def run_child(
    host: ActorHost,
    replayer: Replayer,
    name: str,
    child_id: str,
    data: bytes,
    seconds: float | None,
    location: str,
    type_: Any,
) -> Any:
    """``ctx.child`` once its arguments are checked: the child's result, journaled or
    awaited (started first, or attached to)."""
    decision = replayer.begin_wait(child_id, "child", location)
    if isinstance(decision, WaitDone):
        done = decision
    else:
        pos, started = decision
        if started is None:
            # A parent with a timeout sets a timer just past it: parked, it must wake
            # to end (cancelled by its timeout, which cancels the child too).
            top = host.history.started
            assert top is not None
            until = top.started_at + top.timeout + 0.05 if top.timeout is not None else None
            started = await start_wait(host, pos, child_id, "child", until)
        if host.partitions is None:
            raise FuseeError("ctx.child needs a worker that knows the namespace's partitions")
        # After wait.started: a parent that dies in between starts it again, which
        # attaches (create-if-absent), as does every later activation of this wait.
        now = host.clock()
        parent = host.history.started
        assert parent is not None
        if parent.timeout is not None:
            left = max(0.05, parent.started_at + parent.timeout - now)
            seconds = left if seconds is None else min(seconds, left)
        # not begun in a cancelled scope (a cancelled run replayed to its
        # compensations), and not cut short once begun: start and marker go together
        await anyio.lowlevel.checkpoint_if_cancelled()
        await host.flush()  # (its wait.started carried them, unless replayed)
        with anyio.CancelScope(shield=True):
            await start_child(
                host.store,
                host.partitions,
                parent=host.run_id,
                workflow=name,
                child_id=child_id,
                data=data,
                timeout=seconds,
                now=now,
                noticed=_noticed(host, child_id),
            )
        done = await host.wait_out(started)
    if done.timed_out:  # the parent's timeout passed (its scope is cancelled too)
        raise ChildCancelled(child_id, "timeout: the parent's timeout passed")
    end = msgspec.json.decode(bytes(done.value))
    status = end.get("status")
    if status == "completed":
        return decode_value(msgspec.json.encode(end.get("result")), type_)
    if status == "cancelled":
        raise ChildCancelled(child_id, str(end.get("reason") or "cancelled"))
    raise ChildFailed(child_id, str(end.get("error_type")), str(end.get("message")))


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
    noticed: bool = False,
) -> None:
    """Start run ``child_id`` as a child of ``parent``, create-if-absent like
    ``Engine.start``: starting it again (a replay, a resumed parent) attaches.
    ``noticed``: the parent has read the child's notice of its end.

    Raises:
        RunExists: a run with this ID exists with another workflow or input, or is not
            a child of ``parent``.
    """
    record = RunStarted(
        workflow=workflow,
        input=msgspec.Raw(data),
        started_at=now,
        timeout=timeout,
        partition=partition_of(child_id, partitions),
        parent=parent,
    )

    async def attach() -> None:
        await _check_existing(store, escape(child_id), child_id, record, noticed=noticed)

    if await start_or_attach(store, child_id, record, now=now, attach=attach):
        log.info("child.started", child=child_id, workflow=workflow)


def _noticed(host: ActorHost, child_id: str) -> bool:
    """Whether the parent has read child ``child_id``'s notice of its end."""
    return any(isinstance(m, ChildEnded) and m.id == child_id for _, m in host.view.messages)


async def _check_existing(
    store: RunStore, eid: str, child_id: str, wanted: RunStarted, *, noticed: bool
) -> None:
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
    # A start whose marker is gone (a worker removed it as the run paused; before
    # issue 11, a parent that died between the child's start and its marker): written
    # again unless the run ended. Also for a child that ended without its parent
    # hearing of it: such a child may have run without a marker (a message to its
    # inbox activated it), and what follows its end (the notice to the parent, its
    # index entry) is redone only by an activation, which the marker brings (once: the
    # ended run's marker is then cleared).
    last = await store.last_in_journal(eid)
    if last is not None and not (isinstance(decode_record(last.data), TERMINAL) and noticed):
        marker = start_marker(child_id, first.data, now=started.started_at)
        await store.mark_run_active(started.partition, eid, marker)


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
    # Its marker first: a child whose start lost its marker (an older fusee's start,
    # whose parent died between the two) is found by no reconcile, and the cancel's
    # push dies with a worker that dies before it acts on it (a new one's inbox
    # consumer delivers only new messages).
    assert first is not None
    marker = start_marker(child, first.data, now=started.started_at)
    await store.mark_run_active(started.partition, eid, marker)
    body = encode_message(Cancel(reason=reason))
    await store.send_inbox(p, eid, "cancel", body, msg_id=f"{eid}:cancel:parent")
    await store.wake(p, eid)
    log.info("child.cancelled", child=child, reason=reason)
