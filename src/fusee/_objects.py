"""Keyed objects from the caller's side: ``chats.key("user-7").call("say", text)``.

An exclusive call is a message in the object's inbox (durable once the publish is
acknowledged). The caller then waits for the reply the object's actor publishes on core
NATS once the invocation is journaled and its state projected; if no reply comes within
a second (the worker died, the reply was lost), it looks in the object's journal for the
invocation's ``obj.done`` and keeps looking until it is there.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio
import msgspec

from fusee._client import Client, current_client
from fusee._run import Run
from fusee.actors.object_state import current_state, read_object
from fusee.actors.ports import NobodyListens, StoredMessage
from fusee.actors.registry import (
    DEFAULT_HANDLER_TIMEOUT,
    REGISTRY,
    Handler,
    ObjectSpec,
    make_handler,
)
from fusee.errors import (
    FuseeError,
    HandlerCancelled,
    HandlerFailed,
    InvalidArgument,
    NothingToCancel,
    Timeout,
)
from fusee.runtime.codec import canonical, decode_value
from fusee.runtime.durations import parse_duration
from fusee.runtime.ids import escape, partition_of, validate_id, validate_name
from fusee.runtime.inbox import (
    Cancel,
    Invoke,
    Unknown,
    decode_message,
    encode_message,
    signal_message,
)
from fusee.runtime.objects import EDIT, edit_changes, object_id, untargeted_cancel
from fusee.runtime.records import ObjectDone, decode_record
from fusee.runtime.tokens import invocation_stream

__all__ = ("ObjectType", "object", "ObjectKey", "ObjectInfo", "QueuedInvocation")

DurationLike = str | float | int

# An object that answered this long ago still has its active marker: its actor lets it
# go only after a second with nothing to do (``ActorCore.park_after``).
STILL_ACTIVE = 0.5


@dataclass(frozen=True)
class ObjectType(ObjectSpec):
    """A keyed object type: its name, its handlers, and the default timeout of its
    exclusive handlers. ``key(k)`` is the handle callers use."""

    def key(self, key: str, *, engine: Client | None = None) -> ObjectKey:
        """The object under ``key``: ``call``, ``send``, ``state``... (see ``ObjectKey``).
        Without ``engine``, each call uses the engine of the enclosing
        ``async with await fusee.connect() as engine:`` block (a ``FuseeError`` says
        so when there is none).

        Example:
            ``await chats.key("user-7").call("say", "Where is my order?")``
        """
        return ObjectKey(self, key, engine)


def object(  # noqa: A001 - fusee.object reads as the concept's name
    name: str,
    handlers: dict[str, Any],
    *,
    timeout: str | float = DEFAULT_HANDLER_TIMEOUT,
) -> ObjectType:
    """Define (and register) the keyed object type ``name``: one actor per key, its
    state in KV, exclusive handlers one at a time per key in arrival order, shared ones
    at once. ``timeout`` bounds each exclusive invocation (default 15 minutes).

    Example:
        ``chats = fusee.object("chat", {"say": say, "history": fusee.shared(history)})``
    """
    object_id(name, "k")  # the type's name rules
    if not isinstance(handlers, dict) or not handlers:
        raise InvalidArgument(
            f"object {name!r}: handlers must be a non-empty dict of name: function"
        )
    made: dict[str, Handler] = {}
    for hname, fn in handlers.items():
        hname = validate_name(hname, f"handler name of object {name!r}")
        if hname.startswith("fusee."):
            raise InvalidArgument(
                f"object {name!r}: handler names starting with 'fusee.' are reserved"
            )
        made[hname] = make_handler(hname, fn, shared=False)  # a Handler keeps its own kind
    seconds = parse_duration(timeout, f"the timeout of object {name!r}")
    if seconds <= 0:
        raise InvalidArgument(f"object {name!r}: timeout must be positive, got {timeout!r}")
    obj = ObjectType(name, made, seconds)
    REGISTRY.add_object(obj)
    return obj


@dataclass
class QueuedInvocation:
    """An invocation in an object's queue (``ObjectKey.show``)."""

    seq: int  # its inbox sequence: the ID ``cancel`` takes
    handler: str
    queued_at: float | None = None
    running_since: float | None = None
    cancelling: bool = False


@dataclass
class ObjectInfo:
    """What ``fusee objects show`` prints: the state and the queue."""

    object_type: str
    key: str
    state: dict[str, Any]
    running: QueuedInvocation | None = None
    waiting: list[QueuedInvocation] = field(default_factory=list)
    last: dict[str, Any] | None = None  # the last invocation that ended
    # why no worker runs it now, from the note a worker left in its active marker: its
    # actor crashed (``crashes``, ``error``, ``at``, ``retry_in``, ``worker``), or no
    # live worker serves its type (``unserved``: the reason)
    crashed: dict[str, Any] | None = None
    unserved: str | None = None


class ObjectKey:
    """One object: ``call`` and ``send`` invoke its handlers; ``state``, ``show``,
    ``edit``, ``clear`` and ``cancel`` are for operators and scripts."""

    def __init__(self, obj: ObjectType | str, key: str, engine: Client | None = None) -> None:
        self.type = obj if isinstance(obj, ObjectType) else None
        self.object_type = (
            obj.name if isinstance(obj, ObjectType) else validate_name(obj, "object type")
        )
        self.actor_id = object_id(self.object_type, key)
        self.key = validate_id(key, f"key of object {self.object_type!r}")
        self.eid = escape(self.actor_id)
        self._engine = engine

    def __repr__(self) -> str:
        return f"ObjectKey({self.object_type!r}, {self.key!r})"

    @property
    def engine(self) -> Client:
        """The engine given (``key(k, engine=...)``, ``engine.object``), else the one of
        the enclosing ``async with await fusee.connect() as engine:`` block, looked up
        at each use.

        Raises:
            FuseeError: none was given and no such block encloses the call.
        """
        if self._engine is not None:
            return self._engine
        return current_client(repr(self))

    @property
    def _partition(self) -> int:
        return partition_of(self.actor_id, self.engine.partitions)

    # -- invocations ------------------------------------------------------------------

    async def call(
        self,
        handler: str,
        arg: Any = None,
        *,
        idempotency_key: str | None = None,
        timeout: DurationLike | None = None,
        type: Any = None,  # noqa: A002 - reads well at the call site
    ) -> Any:
        """Invoke ``handler`` with ``arg`` and return its result (or raise its error).

        An exclusive handler waits its turn behind the invocations queued before it;
        a shared one runs at once on any worker. ``idempotency_key`` makes a retried
        call (within 2 minutes) get the first call's result instead of running again.

        Raises:
            HandlerFailed: the handler raised (``error_type`` and ``message`` are its own).
            HandlerCancelled: the invocation was cancelled.
            Timeout: ``timeout`` passed first (the invocation stays queued or running).
            InvalidArgument: the type has no handler of that name.

        Example:
            ``reply = await chats.key("user-7").call("say", "Where is my order?")``
        """
        limit = parse_duration(timeout, "timeout") if timeout is not None else None
        if self._is_shared(handler):
            return await self._call_shared(handler, arg, limit, type)
        deadline = time.monotonic() + limit if limit is not None else float("inf")
        data = canonical(arg, f"the input of {self!r}.{handler}", limit=self.engine.store.max_value)
        with anyio.move_on_after(limit if limit is not None else math.inf) as storing:
            seq, subject, duplicate = await self._enqueue_raw(
                handler, data, idempotency_key, reply=True
            )
        if storing.cancelled_caught:
            raise Timeout(
                f"{self!r}.call({handler!r}): NATS did not store the invocation within "
                f"{timeout} (it may or may not be queued)"
            )
        try:
            body = await self._outcome(seq, subject, duplicate, deadline)
        finally:
            if subject:
                self.engine.replies.drop(subject)
        if body is None:
            raise Timeout(f"{self!r}.call({handler!r}) got no result within {timeout}")
        self._saw(body)
        return self._result(handler, body, type)

    async def send(
        self, handler: str, arg: Any = None, *, idempotency_key: str | None = None
    ) -> int:
        """Queue an invocation of the exclusive ``handler`` and return once it is stored
        (durable: it runs even if this process and every worker die now). Returns its
        sequence, the ID ``result`` and ``cancel`` take.

        Example:
            ``await chats.key("user-7").send("say", "And the refund?")``
        """
        if self._is_shared(handler):
            raise InvalidArgument(
                f"{self!r}.send({handler!r}): {handler!r} is a shared handler; call it"
            )
        seq, _, _ = await self._enqueue(handler, arg, idempotency_key, reply=False)
        return seq

    async def result(
        self,
        seq: int,
        *,
        timeout: DurationLike | None = None,
        type: Any = None,  # noqa: A002 - reads well at the call site
    ) -> Any:
        """Wait for the invocation ``seq`` (what ``send`` returned) and return its result."""
        limit = parse_duration(timeout, "timeout") if timeout is not None else None
        deadline = time.monotonic() + limit if limit is not None else float("inf")
        body = await self._outcome(seq, "", True, deadline)
        if body is None:
            raise Timeout(f"{self!r}: invocation {seq} did not end within {timeout}")
        self._saw(body)
        return self._result(str(body.get("handler", "")), body, type)

    def _is_shared(self, handler: str) -> bool:
        handler = validate_name(handler, "handler name")
        if self.type is None:
            return False  # by name only (CLI, HTTP): the worker decides
        found = self.type.handlers.get(handler)
        if found is None:
            raise InvalidArgument(
                f"object {self.object_type!r} has no handler {handler!r} "
                f"(it has: {', '.join(sorted(self.type.handlers))})"
            )
        return found.shared

    async def _enqueue(
        self, handler: str, arg: Any, idempotency_key: str | None, *, reply: bool
    ) -> tuple[int, str, bool]:
        data = canonical(arg, f"the input of {self!r}.{handler}", limit=self.engine.store.max_value)
        return await self._enqueue_raw(handler, data, idempotency_key, reply=reply)

    async def _enqueue_raw(
        self, handler: str, data: bytes, idempotency_key: str | None, *, reply: bool
    ) -> tuple[int, str, bool]:
        engine = self.engine
        msg_id = None
        if idempotency_key is not None:
            msg_id = f"{self.eid}:invoke:{validate_id(idempotency_key, 'idempotency key')}"
        subject = ""
        if reply:
            replies = engine.replies
            await replies.open()
            subject = replies.new()
        body = encode_message(Invoke(handler=handler, input=msgspec.Raw(data), reply=subject))
        store, p = engine.store, self._partition
        try:
            if msg_id is not None:
                seq, duplicate = await store.send_inbox_once(
                    p, self.eid, "invoke", body, msg_id=msg_id
                )
            else:
                seq = await store.send_inbox(p, self.eid, "invoke", body)
                duplicate = False
        except BaseException:
            if subject:
                engine.replies.drop(subject)
            raise
        if not reply:
            await store.ensure_active(p, self.eid)  # a caller that waits does it meanwhile
        return seq, subject, duplicate

    async def _outcome(
        self, seq: int, subject: str, duplicate: bool, deadline: float
    ) -> dict[str, Any] | None:
        """The reply for invocation ``seq``: from core NATS, else from the journal."""
        # The object may have gone idle (no active marker): give it one, while the
        # reply is awaited. The worker's inbox consumer has seen the message already;
        # the marker covers a worker that was down, and a new owner. Not needed when
        # this engine was answered by the object moments ago: an actor keeps its marker
        # until it has been idle for a second, and reads its inbox again after letting
        # it go. (The fallback after a second without a reply ensures it anyway.)
        answered = self.engine.answered.get(self.eid)
        if answered is not None and time.monotonic() - answered < STILL_ACTIVE:
            return await self._await_outcome(seq, subject, duplicate, deadline)
        failed: list[FuseeError] = []

        async def mark(scope: anyio.CancelScope) -> None:
            try:
                await self.engine.store.ensure_active(self._partition, self.eid)
            except FuseeError as exc:  # the store is full, NATS is away: the caller's error
                failed.append(exc)
                scope.cancel()

        body = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(mark, tg.cancel_scope)
            body = await self._await_outcome(seq, subject, duplicate, deadline)
        if failed:
            raise failed[0]
        return body

    async def _await_outcome(
        self, seq: int, subject: str, duplicate: bool, deadline: float
    ) -> dict[str, Any] | None:
        if not subject or duplicate:
            return await self._watch_done(seq, deadline)
        replies = self.engine.replies
        searched = seq  # the journal is read from here on, a page at a time
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            data = await replies.wait(subject, min(1.0, left))
            if data is not None:
                body: dict[str, Any] = msgspec.json.decode(data)
                return body
            found, searched = await self._find_done(seq, searched)
            if found is not None:
                return found
            await self.engine.store.ensure_active(self._partition, self.eid)

    async def _watch_done(self, seq: int, deadline: float) -> dict[str, Any] | None:
        """No reply to wait for (``result(seq)``, a duplicate call): the engine's journal
        watch hands over the object's ``obj.done`` records as they are stored (no
        consumer of this caller's own, no polling, no step record sent); the journal is
        read first, and again only when the watch may have missed one."""
        store = self.engine.store
        watch = store.journal_watch
        searched = seq  # the journal is read from here on, a page at a time
        async with watch.watching(self.eid, ("obj.done",)) as waiter:
            reread = True
            while True:
                if reread:
                    found, searched = await self._find_done(seq, searched)
                    if found is not None:
                        return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                records, reread = await watch.next(waiter, left)
                for msg in records:
                    if (found := _done_body(seq, msg)) is not None:
                        return found
                if reread:  # the watch was blind a while: the object may have gone idle
                    await store.ensure_active(self._partition, self.eid)

    async def _find_done(self, seq: int, after: int) -> tuple[dict[str, Any] | None, int]:
        for msg in await self.engine.store.read_journal(self.eid, after):
            after = msg.seq
            if (found := _done_body(seq, msg)) is not None:
                return found, after
        return None, after

    def _saw(self, body: dict[str, Any]) -> None:
        """Remember when the object answered this engine: it still has its active
        marker for a while (``STILL_ACTIVE``), so the next call need not ensure it."""
        if isinstance(body.get("at"), int):
            self.engine.answered.note(self.eid, time.monotonic())

    def _result(self, handler: str, body: dict[str, Any], type: Any) -> Any:  # noqa: A002
        if "error_type" in body:
            error_type, message = str(body["error_type"]), str(body.get("message", ""))
            where = f"{self.object_type}/{self.key}"
            if error_type == "fusee.Cancelled":
                raise HandlerCancelled(where, handler, message)
            raise HandlerFailed(where, handler, error_type, message)
        result = body.get("result")
        if type is None:
            return result
        return decode_value(msgspec.json.encode(result), type)

    async def _call_shared(self, handler: str, arg: Any, limit: float | None, type: Any) -> Any:  # noqa: A002
        data = msgspec.json.encode(
            {
                "type": self.object_type,
                "key": self.key,
                "handler": handler,
                "input": msgspec.Raw(
                    canonical(
                        arg, f"the input of {self!r}.{handler}", limit=self.engine.store.max_value
                    )
                ),
            }
        )
        store = self.engine.store
        subject = store.layout.shared_calls(self.object_type)
        deadline = time.monotonic() + (limit if limit is not None else 30.0)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"{self!r}.call({handler!r}): no worker answered in time")
            try:
                answer = await store.request_core(subject, data, min(left, 5.0))
            except NobodyListens:
                if limit is None:
                    raise InvalidArgument(
                        f"{self!r}.call({handler!r}): no worker serves object type "
                        f"{self.object_type!r} (start one: fusee worker <module>)"
                    ) from None
                await anyio.sleep(0.2)
                continue
            if answer is not None:
                return self._result(handler, msgspec.json.decode(answer), type)

    # -- token streams ----------------------------------------------------------------

    async def stream(self, seq: int, name: str, offset: int = 0) -> AsyncGenerator[str, None]:
        """The text of ``model_call(ctx, name)`` in invocation ``seq`` (what ``send``
        returned), from token index ``offset``, while it runs and after: as
        ``Run.stream`` for a run.

        Example:
            ``async for token in chat.stream(seq, "reply"): print(token, end="")``
        """
        async with contextlib.aclosing(
            Run(self.engine, self.actor_id).stream(invocation_stream(seq, name), offset)
        ) as tokens:
            async for token in tokens:
                yield token

    # -- state and queue --------------------------------------------------------------

    async def state(self) -> dict[str, Any]:
        """The state as of the last finished exclusive invocation: every change a
        caller (of any engine) was answered for is in it. (``nats kv get`` shows the
        projection, which may lag the journal by the invocations in flight.)"""
        state = await current_state(self.engine.store, self.object_type, self.key)
        return {k: msgspec.json.decode(state[k]) for k in sorted(state)}

    async def edit(
        self,
        *,
        set: dict[str, Any] | None = None,  # noqa: A002 - the operation's name
        delete: list[str] | None = None,
        state: dict[str, Any] | None = None,
        clear: bool = False,
        timeout: DurationLike | None = None,
    ) -> dict[str, Any]:
        """Change the state from outside, as an exclusive invocation: it waits its turn
        behind what is queued, and no handler that began before it overwrites it.
        ``state`` replaces the whole state; ``set``/``delete``/``clear`` change keys.
        Returns the state after the edit.

        Raises:
            InvalidArgument: the edit is malformed (nothing is queued then).
            NotEncodable: a value is not JSON-encodable (nothing is queued then).
        """
        edit: dict[str, Any] = {}
        if state is not None:
            edit["state"] = state
        if set:
            edit["set"] = set
        if delete:
            edit["delete"] = delete
        if clear:
            edit["clear"] = True
        if not edit:
            raise InvalidArgument("an edit needs state=, set=, delete= or clear=True")
        edit_changes(edit, f"edit of {self!r}")  # checked here: a bad edit is never queued
        limit = parse_duration(timeout, "timeout") if timeout is not None else None
        data = canonical(edit, f"the edit of {self!r}", limit=self.engine.store.max_value)
        deadline = time.monotonic() + limit if limit is not None else float("inf")
        with anyio.move_on_after(limit if limit is not None else math.inf) as storing:
            seq, subject, _ = await self._enqueue_raw(EDIT, data, None, reply=True)
        if storing.cancelled_caught:
            raise Timeout(f"the edit of {self!r} was not stored within {timeout}")
        try:
            body = await self._outcome(seq, subject, False, deadline)
        finally:
            self.engine.replies.drop(subject)
        if body is None:
            raise Timeout(f"the edit of {self!r} did not run within {timeout}")
        self._saw(body)
        self._result(EDIT, body, None)
        return await self.state()

    async def clear(self, *, timeout: DurationLike | None = None) -> None:
        """Remove every key of the state (an exclusive invocation, in its turn)."""
        await self.edit(clear=True, timeout=timeout)

    async def cancel(self, seq: int | None = None, reason: str = "cancelled") -> int | None:
        """Cancel invocation ``seq`` (from ``show`` or ``send``), or with no ``seq`` the
        running one (else the next to run): a running handler's step sees ``s.signal``
        and is cancelled, a queued one never runs; it ends ``fusee.Cancelled``, its
        state changes dropped. Durable once it returns. Returns the sequence of the
        invocation it cancels (None: nothing was queued).

        Raises:
            NothingToCancel: ``seq`` is neither running nor queued (it ended, or never was).
            InvalidArgument: ``seq`` or ``reason`` is not what it must be.
        """
        if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 1):
            raise InvalidArgument(f"seq={seq!r}: an invocation's sequence, from objects show")
        if not isinstance(reason, str):
            raise InvalidArgument(f"reason={reason!r}: must be a str")
        info = await self.show()
        queued = [*([info.running] if info.running else []), *info.waiting]
        if seq is None:
            # named, so a cancel read again later cannot hit an invocation begun after it
            head = next((q for q in queued if not q.cancelling), None)
            if head is None:
                return None
            seq = head.seq
        elif all(q.seq != seq for q in queued):
            raise NothingToCancel(
                f"{self!r} has no invocation {seq} running or queued: it ended, or there "
                f"never was one (objects show lists them)"
            )
        body = encode_message(Cancel(reason=reason, target=seq))
        store, p = self.engine.store, self._partition
        await store.send_inbox(p, self.eid, "cancel", body)
        await store.ensure_active(p, self.eid)
        return seq

    async def signal(self, name: str, payload: Any = None) -> None:
        """Send the running (or next) invocation's ``ctx.wait_for(name)`` a signal."""
        name = validate_name(name, "signal name")
        body = signal_message(
            name,
            payload,
            what=f"the payload of signal {name!r} to {self!r}",
            limit=self.engine.store.max_value,
        )
        store, p = self.engine.store, self._partition
        await store.send_inbox(p, self.eid, "signal", body)
        await store.ensure_active(p, self.eid)

    async def show(self) -> ObjectInfo:
        """The state, the invocation running (and since when) and those waiting, in order."""
        store = self.engine.store
        snap = await read_object(store, self.object_type, self.key)
        history, done = snap.history, snap.last
        last: dict[str, Any] | None = None
        if done is not None:
            last = {"seq": done.inbox_seq, "handler": done.handler, "ok": done.ok}
            if not done.ok:
                last["error"] = f"{done.error_type}: {done.message}"
        state = {k: msgspec.json.decode(snap.state[k]) for k in sorted(snap.state)}
        info = ObjectInfo(self.object_type, self.key, state, last=last)
        marker = await store.active_note(self._partition, self.eid)
        if marker is not None and "crashes" in marker:
            info.crashed = marker
        if marker is not None and isinstance(marker.get("unserved"), str):
            info.unserved = marker["unserved"]
        running = history.invocation if history.done is None else None
        cancelled: set[int] = set()
        for msg in await store.read_inbox(self._partition, self.eid, snap.cursor):
            body = decode_message(msg.data)  # (what is unreadable, the actor logs)
            if isinstance(body, Cancel):
                target = body.target
                if target is None:  # a cancel of "the running one"
                    target = untargeted_cancel(msg.seq, running, history.invocation_at)
                if target is not None:
                    cancelled.add(target)
            elif isinstance(body, Invoke) or (isinstance(body, Unknown) and body.kind == "invoke"):
                stamp = _stamp(msg.headers.get("Nats-Time-Stamp"))
                handler = body.handler if isinstance(body, Invoke) else "(malformed)"
                entry = QueuedInvocation(msg.seq, handler, queued_at=stamp)
                if running is not None and msg.seq == running.inbox_seq:
                    entry.running_since = running.started_at
                    info.running = entry
                else:
                    info.waiting.append(entry)
        for entry in [*([info.running] if info.running else []), *info.waiting]:
            if entry.seq in cancelled:
                entry.cancelling = True
        return info


def _stamp(value: str | None) -> float | None:
    if not value:
        return None
    try:
        text = value.rstrip("Z")
        if "." in text:
            head, frac = text.split(".", 1)
            text = f"{head}.{frac[:6]}"
        return datetime.fromisoformat(text + "+00:00").timestamp()
    except ValueError:
        return None


def _done_body(seq: int, msg: StoredMessage) -> dict[str, Any] | None:
    """The answer of invocation ``seq`` if ``msg`` is its ``obj.done`` (else None)."""
    if msg.headers.get("Fusee-Kind") != "obj.done":
        return None
    record = decode_record(msg.data)
    if not (isinstance(record, ObjectDone) and record.inbox_seq == seq):
        return None
    body: dict[str, Any] = {"seq": seq, "handler": record.handler, "at": msg.seq}
    if record.ok:
        body["result"] = msgspec.json.decode(bytes(record.result))  # type: ignore[arg-type]
    else:
        body["error_type"], body["message"] = record.error_type, record.message
    return body
