"""A keyed object as a single-writer actor: one key's exclusive invocations, one at a
time, in the order they arrived in its inbox, each journaled like a run's generation.

The object's journal is a sequence of invocations. An invocation's first record carries
it (``invoked``); its steps, waits and children are journaled as a run's are; its
``obj.done`` record holds its result or error and the state changes it made. The last
``obj.done`` names the inbox sequence of its invocation: the cursor. Everything in the
inbox after the cursor is still to do, in order, so arrival order survives any crash.

The state is the fold of the ``obj.done`` changes. The KV bucket ``<ns>_objects`` holds
that fold as a projection, written after the record that made it (never ahead of the
journal) and tagged with that record's sequence (``Fusee-Journal-Seq``). Activation
reads the projection, then the journal from that record on, and folds what came after
it: a projection left behind by a crash is caught up, and a change is never applied
twice, because the projection is the whole state, not a delta.
"""

from __future__ import annotations

import collections
import functools
import inspect
from typing import Any

import anyio
import anyio.abc
import msgspec
import structlog

from fusee.actors.children import cancel_children, live_children
from fusee.actors.context import ObjectContext, run_compensations
from fusee.actors.core import ActorCore
from fusee.actors.object_state import read_object
from fusee.actors.outcomes import Outcome, failure_of
from fusee.actors.registry import Handler, Registry
from fusee.actors.registry import ObjectSpec as ObjectType  # what a worker knows of a type
from fusee.errors import (
    ContinueAsNew,
    DeterminismError,
    Evicted,
    Fenced,
    JournalGap,
    NotEncodable,
    Parked,
    Unreplayable,
    error_type_name,
)
from fusee.logs import get_logger
from fusee.runtime.codec import check_size, decode_value, encode_value
from fusee.runtime.durations import format_duration
from fusee.runtime.history import Replayer
from fusee.runtime.inbox import NULL, Cancel, Invoke, Unknown
from fusee.runtime.objects import (
    EDIT,
    ReadOnlyState,
    State,
    StateView,
    edit_changes,
    encode_state,
    fold,
    untargeted_cancel,
)
from fusee.runtime.records import Invocation, ObjectDone, ObjectStarted
from fusee.runtime.waits import Idle, Park

__all__ = ("ObjectActor", "REPROJECT_AFTER")

log = get_logger()

# The projection is rewritten after this many journal records even when the state did
# not change, so an activation never reads more than about this many records.
REPROJECT_AFTER = 64


class ObjectActor:
    def __init__(
        self,
        *,
        object_type: str,
        key: str,
        registry: Registry,
        core: ActorCore,
    ) -> None:
        """An object's driver over ``core``; ``registry``: the object types it may run."""
        self.core = core
        self.core.on_step = self.before_step
        self.registry = registry
        self.cancel_reason: str | None = None
        self.object_type = object_type
        self.key = key
        self.state: State = {}
        self.cursor = 0  # inbox sequence of the last invocation that ended
        # invocations read, not begun, in arrival order
        self.queue: collections.deque[tuple[int, Invoke | Unknown]] = collections.deque()
        self.cancels: dict[int, str] = {}  # a queued invocation's sequence: why it is off
        self.malformed: dict[int, str] = {}  # an invoke that does not fit: why
        self.projection_rev = 0  # its KV revision (compare-and-set), 0: none
        self.running: Invocation | None = None
        self._projected_size = 0  # history.size when the projection was written
        self._projected_at = 0  # the journal record it was made at
        self._boundary = 0  # the obj.done of the last invocation that ended
        # invocations that ended after the projection was made (read at activation)
        self._unprojected: list[tuple[Invocation, ObjectDone, int]] = []
        self._background: anyio.abc.TaskGroup | None = None
        self._projecting: anyio.Event | None = None  # set once the put in flight is done
        self._projection_error: BaseException | None = None
        self._queue_changed = anyio.Event()  # set when an invocation or a cancel is read
        self._queued = 0  # how many reads queued something (or a cancel)

    async def before_step(self) -> None:
        """An invocation is journaled before its first step runs, so it shows as
        running (and its start time survives a crash)."""
        if self.core.history.pending_invocation is not None:
            await self.core.commit(ObjectStarted())

    # -- activation -------------------------------------------------------------------

    async def _load(self) -> None:
        snap = await read_object(self.core.store, self.object_type, self.key)
        self.core.history, self.core.fence = snap.history, snap.fence
        self.state, self.cursor = snap.state, snap.cursor
        self.projection_rev, self._unprojected = snap.revision, snap.unprojected
        self._projected_size = 1 if snap.projected_at else 0  # history.size at the projection
        self._projected_at = snap.projected_at
        # The projection is tagged with the obj.done of the last invocation it holds,
        # never with a record inside an invocation: an activation reads the journal
        # from its tag on and must see where a begun invocation began.
        self._boundary = snap.unprojected[-1][2] if snap.unprojected else snap.projected_at

    async def run(self) -> Outcome:
        """Activate, run what is queued, and say how it left: ``idle`` (nothing queued
        for ``park_after`` seconds), ``parked`` (an invocation waits), ``unrunnable``."""
        self.core.start()
        with structlog.contextvars.bound_contextvars(object=self.object_type, key=self.key):
            while True:
                try:
                    await self._load()
                except JournalGap as gap:
                    log.error("object.paused", reason=str(gap))
                    return "paused"
                self.core.read_again(self.cursor)  # from the cursor, from the server
                self.cancels = {}
                self.queue.clear()
                self.cancel_reason = None
                try:
                    await self._catch_up()
                    return await self._serve()
                except Parked:
                    log.info(
                        "object.parked", inbox_seq=self.running.inbox_seq if self.running else 0
                    )
                    return "parked"
                except Evicted:
                    if not self.core.always_replay:
                        raise
                    continue  # replay from the journal, as a new worker would

    async def _catch_up(self) -> None:
        """The callers of the invocations a projection behind the journal missed (its
        writer died between the two) get their replies again, then it is written."""
        if not self._unprojected:
            return
        log.info("object.projection_caught_up", invocations=len(self._unprojected))
        # the replies first: once the projection has caught up, no activation sends them
        for inv, done, at in self._unprojected:
            await self._reply(inv, done, at)
        await self._project_state(force=True)
        self._unprojected = []

    # -- the queue --------------------------------------------------------------------

    async def _serve(self) -> Outcome:
        # Two helpers live as long as this activation: the inbox watcher (the only
        # reader of the inbox once the first read is done: it queues invocations, hands
        # the running one its signals and cancels) and the projection writes (see
        # _project_later: the reply goes out once obj.done landed). Leaving (idle,
        # parked, evicted) waits for the writes.
        escaped: BaseException | None = None
        outcome: Outcome = "idle"
        async with anyio.create_task_group() as background:
            self._background = background
            try:
                await self._read_inbox()
                background.start_soon(
                    functools.partial(self.core.watch_inbox, self._read_inbox, once=False)
                )
                outcome = await self._serve_queue()
                self._project_behind()
            except (Parked, Evicted) as exc:
                escaped = exc
                self._project_behind()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, ungrouped
                escaped = exc  # (Fenced, a failed commit: the worker tells them apart)
            finally:
                self._background = None
                background.cancel_scope.cancel()  # the watcher; the writes are shielded
        self._raise_projection_error()
        if escaped is not None:
            raise escaped
        return outcome

    async def _serve_queue(self) -> Outcome:
        while True:
            obj = self.registry.get_object(self.object_type)
            invocation = self._next(obj)
            if invocation is None:
                if self.core.evict_requested():
                    raise Evicted
                if await self._idle():
                    return "idle"
                continue
            if obj is None and invocation.handler != EDIT:
                reason = (
                    f"no object type named {self.object_type!r} is registered at this worker "
                    f"(it has: {', '.join(self.registry.object_names()) or 'none'})"
                )
                log.error("object.unrunnable", reason=reason)
                return "unrunnable"
            await self._invoke(obj, invocation)
            await self.core.maybe_evict()

    async def _idle(self) -> bool:
        """Nothing queued: True once :class:`~fusee.runtime.waits.Idle` says to leave;
        False as soon as something was queued (or a cancel read)."""
        idle = Idle(park_after=self.core.park_after, now=self.core.clock())
        while True:
            changed = self._queue_changed  # set by the next read that queues something
            cmd = idle.next(version=self._queued, seen=self.core.view.seen, now=self.core.clock())
            if isinstance(cmd, Park):
                self.core.left_at = cmd.left_at
                return True
            if self._queued == cmd.version:  # (else: read meanwhile)
                with anyio.move_on_after(max(0.0, cmd.until - self.core.clock())):
                    await changed.wait()
            if self._queued != cmd.version:
                return False

    def _next(self, obj: ObjectType | None) -> Invocation | None:
        """The invocation to run: the one the journal shows begun, else the oldest queued."""
        history = self.core.history
        if history.invocation is not None and history.done is None:
            return history.invocation  # begun before a crash or an eviction: resume it
        while self.queue:
            seq, msg = self.queue.popleft()
            if seq <= self.cursor:
                continue
            if isinstance(msg, Unknown):  # an invoke that does not fit: it fails alone
                self.malformed[seq] = msg.why
                return Invocation(
                    handler="",
                    input=NULL,
                    inbox_seq=seq,
                    started_at=self.core.clock(),
                    reply=msg.reply,
                )
            timeout = obj.timeout if obj is not None else None
            if obj is not None and msg.handler in obj.handlers:
                timeout = obj.handler_timeout(obj.handlers[msg.handler])
            return Invocation(
                handler=msg.handler,
                input=msg.input,
                inbox_seq=seq,
                started_at=self.core.clock(),
                timeout=timeout,
                reply=msg.reply,
            )
        return None

    async def _read_inbox(self) -> bool:
        """Sort what arrived: invocations queue up, a cancel marks its target (True when
        that is the running invocation), the rest is for the running invocation's waits."""
        running = self.core.history.invocation if self.core.history.done is None else None
        cancel_running = False
        queued = False
        for seq, msg in await self.core.inbox_messages():
            if isinstance(msg, Invoke) or (isinstance(msg, Unknown) and msg.kind == "invoke"):
                self.queue.append((seq, msg))
                queued = True
            elif isinstance(msg, Cancel):
                reason = msg.reason or "cancelled"
                target = msg.target
                if target is None:  # "the running one": the one running when it was stored
                    target = untargeted_cancel(
                        seq,
                        running,
                        self.core.history.invocation_at,
                        running_here=self.running is running,
                    )
                if running is not None and target == running.inbox_seq:
                    if self.cancel_reason is None:
                        self.cancel_reason = reason
                        log.info(
                            "invocation.cancelling", inbox_seq=running.inbox_seq, reason=reason
                        )
                        cancel_running = True
                elif target is not None and target > self.cursor:
                    self.cancels[target] = reason
                    queued = True
            elif not isinstance(msg, Unknown):
                self.core.keep(seq, msg)
        if queued:
            self._queued += 1
            self._queue_changed.set()
            self._queue_changed = anyio.Event()
        return cancel_running

    # -- one invocation ---------------------------------------------------------------

    async def _invoke(self, obj: ObjectType | None, inv: Invocation) -> None:
        history = self.core.history
        if history.invocation is not inv:
            history.begin(inv, self.core.partition)
        self.running = inv
        self.core.view.floor = inv.inbox_seq
        if inv.inbox_seq in self.cancels:
            self.cancel_reason = self.cancels.pop(inv.inbox_seq)
        began = self.core.clock()
        handler = obj.handlers.get(inv.handler) if obj is not None else None
        view = (
            ReadOnlyState(self.state, self.object_type)
            if handler and handler.shared
            else StateView(self.state, self.object_type)
        )
        replayer = Replayer(history)
        ctx = ObjectContext(
            self.core, replayer, object_type=self.object_type, key=self.key, state=view
        )
        log.debug("invocation.started", handler=inv.handler, inbox_seq=inv.inbox_seq)
        fields: dict[str, Any]
        malformed = self.malformed.pop(inv.inbox_seq, None)  # (also when cancelled first)
        if self.cancel_reason is not None and history.generation_size == 0:
            fields = _error("fusee.Cancelled", self.cancel_reason)  # cancelled while queued
        elif malformed is not None:
            fields = _error(
                "fusee.InvalidInput",
                f"the invocation at inbox sequence {inv.inbox_seq} of object "
                f"{self.core.run_id!r} is malformed: {malformed}",
            )
        elif inv.handler == EDIT:
            fields = self._edit(inv)
        elif handler is None:
            assert obj is not None
            fields = _error(
                "fusee.UnknownHandler",
                f"object {self.object_type!r} has no handler {inv.handler!r} "
                f"(it has: {', '.join(sorted(obj.handlers))})",
            )
        else:
            fields = await self._run(handler, ctx, replayer, view, inv)
        fields = self._state_fits(inv, fields)
        while True:
            if "error_type" in fields:
                # outside the handler's scope, like a run's
                failed = await run_compensations(ctx)
                if failed:
                    log.warning("invocation.compensations_failed", steps=[f.step for f in failed])
            done = ObjectDone(
                inbox_seq=inv.inbox_seq,
                handler=inv.handler,
                duration_ms=round((self.core.clock() - began) * 1000, 3),
                **fields,
            )
            try:
                await self.core.commit(done)
                break
            except NotEncodable as exc:
                if "error_type" in fields:
                    raise  # not even the error fits (the input rides on it: never so)
                # its result and changes (and the input riding on the record) are too
                # large together: the invocation fails alone, and the key moves on
                fields = _error(
                    "fusee.NotEncodable",
                    f"handler {inv.handler!r} of object {self.core.run_id!r}: its result and "
                    f"state changes cannot be stored together: {exc}",
                )
        if live_children(history):  # what the ended invocation still waited for
            await cancel_children(
                self.core.store,
                self.core.partitions,
                history,
                f"invocation {inv.inbox_seq} ({inv.handler}) of object {self.core.run_id!r} ended",
            )
        self.state = fold(self.state, done)
        self.cursor = inv.inbox_seq
        if done.ok:
            log.info("invocation.completed", handler=inv.handler, inbox_seq=inv.inbox_seq)
        else:
            log.info(
                "invocation.failed",
                handler=inv.handler,
                inbox_seq=inv.inbox_seq,
                error=f"{done.error_type}: {done.message}",
            )
        await self._reply(inv, done, self.core.fence)
        self._project_later()
        # the next invocation starts clean
        self.running = None
        self.cancel_reason = None
        self.core.workflow_scope = None
        self.core.running_steps.clear()
        self.core.view.drop_through(self.cursor)

    def _state_fits(self, inv: Invocation, fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` when the state they leave fits one stored value (the projection
        is one KV message); else the invocation's failure, its changes dropped."""
        if not fields.keys() & {"state_set", "state_deleted", "state_cleared"}:
            return fields
        after = fold(self.state, ObjectDone(inbox_seq=inv.inbox_seq, handler=inv.handler, **fields))
        try:
            check_size(
                encode_state(after),
                f"the state of object {self.core.run_id!r} after handler {inv.handler!r}",
                self.core.store.max_value,
            )
        except NotEncodable as exc:
            return _error("fusee.NotEncodable", f"{exc} Its changes were dropped.")
        return fields

    def _edit(self, inv: Invocation) -> dict[str, Any]:
        """``objects edit / set / clear``: an exclusive invocation like any other, so it
        waits its turn and no handler that began before it overwrites it."""
        try:
            changes = edit_changes(msgspec.json.decode(bytes(inv.input)), "objects edit")
            return {"result": msgspec.Raw(b"null"), **changes}
        except Exception as exc:  # noqa: BLE001 - a bad edit fails alone, state untouched
            return _error(error_type_name(exc), str(exc))

    async def _run(
        self,
        handler: Handler,
        ctx: ObjectContext,
        replayer: Replayer,
        view: ReadOnlyState,
        inv: Invocation,
    ) -> dict[str, Any]:
        """Run the handler under its timeout (the watcher cancels it on a cancel); the
        fields of its ``obj.done``."""
        deadline = float("inf")
        if inv.timeout is not None:
            left = inv.started_at + inv.timeout - self.core.clock()
            deadline = anyio.current_time() + max(0.0, left)
        where = f"handler {inv.handler!r} of object {self.core.run_id!r}"
        with anyio.CancelScope(deadline=deadline) as scope:
            self.core.workflow_scope = scope
            if self.cancel_reason is not None:
                scope.cancel()
            try:
                if handler.takes_input:
                    result = handler.fn(ctx, decode_value(bytes(inv.input), handler.input_type))
                else:
                    result = handler.fn(ctx)
                if inspect.isawaitable(result):
                    result = await result
                if replayer.broken is not None:
                    raise replayer.broken
                replayer.check_finished(f"the return of {where}")
                fields: dict[str, Any] = {
                    "result": msgspec.Raw(
                        encode_value(
                            result, f"the result of {where}", limit=self.core.store.max_value
                        )
                    )
                }
                if isinstance(view, StateView):
                    fields.update(view.changes())
                return fields
            except ContinueAsNew:
                return _error(
                    "fusee.InvalidArgument",
                    f"{where}: ctx.continue_as_new is for runs; an object keeps going as is",
                )
            except (Exception, Unreplayable) as exc:  # noqa: BLE001 - the handler's own error, journaled
                failure = failure_of(exc, replayer, f"the input of {where} does not fit")
                if isinstance(exc, Unreplayable):
                    log.error("invocation.unreplayable", error=failure.message)
                elif isinstance(exc, DeterminismError):
                    # The key must not stay held by code that no longer matches its
                    # journal: the invocation fails (state unchanged) and the next one runs.
                    log.error("invocation.nondeterministic", error=failure.message)
                return _error(failure.error_type, failure.message)
        if self.cancel_reason is not None:
            return _error("fusee.Cancelled", self.cancel_reason)
        assert inv.timeout is not None
        return _error(
            "fusee.Timeout",
            f"{where} took longer than its timeout of {format_duration(inv.timeout)} "
            f"(set it with fusee.object(..., timeout=) or fusee.exclusive(fn, timeout=))",
        )

    # -- after an invocation ----------------------------------------------------------

    def _project_later(self) -> None:
        """At an invocation's end (its ``obj.done`` just landed): write the projection
        in the background once it is ``REPROJECT_AFTER`` records behind the journal
        (or there is none yet), never on the call's path; leaving memory writes it too
        (``_project_behind``). Every reader of the state (shared handlers, ``state()``,
        ``list_objects``) folds the journal past a projection that is behind
        (``current_state``), so it sees every invocation a caller was answered for;
        puts stay in order, each after the one before."""
        if self._background is None:
            raise RuntimeError("_project_later outside _serve")
        self._raise_projection_error()
        self._boundary = self.core.fence
        if self.projection_rev and self.core.history.size - self._projected_size < REPROJECT_AFTER:
            return
        self._put_soon()

    def _project_behind(self) -> None:
        """Leaving memory (idle, parked, evicted): the projection catches up with the
        last invocation that ended, so ``nats kv get`` shows the state of a key at rest
        and the next activation reads a short journal."""
        if self._background is not None and self._boundary != self._projected_at:
            self._put_soon()

    def _put_soon(self) -> None:
        assert self._background is not None
        self._projected_size = self.core.history.size
        self._projected_at = self._boundary
        before, done = self._projecting, anyio.Event()
        self._projecting = done
        data, seq, cursor = encode_state(self.state), self._boundary, self.cursor
        self._background.start_soon(self._put_after, before, done, data, seq, cursor)

    async def _put_after(
        self, before: anyio.Event | None, done: anyio.Event, data: bytes, seq: int, cursor: int
    ) -> None:
        with anyio.CancelScope(shield=True):  # a put begun is finished, even on eviction
            try:
                if before is not None:
                    await before.wait()
                if self._projection_error is None:
                    await self._put(data, seq, cursor)
            except BaseException as exc:  # noqa: BLE001 - raised in the actor's own flow
                self._projection_error = exc
            finally:
                done.set()

    def _raise_projection_error(self) -> None:
        if self._projection_error is not None:
            error, self._projection_error = self._projection_error, None
            raise error

    async def _project_state(self, *, force: bool) -> None:
        """Write the state to KV now (activation's catch-up)."""
        if self._boundary and (force or not self.projection_rev):
            await self._put(encode_state(self.state), self._boundary, self.cursor)
            self._projected_size = self.core.history.size
            self._projected_at = self._boundary

    async def _put(self, data: bytes, seq: int, cursor: int) -> None:
        """Write the state to KV, tagged with the journal record it was made at (after
        that record landed: the projection is never ahead of the journal). Without
        changes it is rewritten only every ``REPROJECT_AFTER`` records, to keep the
        journal an activation reads short."""
        revision = await self.core.store.put_state(
            self.object_type,
            self.key,
            data,
            journal_seq=seq,
            cursor=cursor,
            last=self.projection_rev,
        )
        if revision is None:
            # another writer projected since: this copy is stale (a newer owner exists)
            raise Fenced(f"the state of object {self.core.run_id!r} was written by another worker")
        self.projection_rev = revision

    async def _reply(self, inv: Invocation, done: ObjectDone, at: int) -> None:
        if not inv.reply:
            return
        await self.core.store.publish_core(inv.reply, reply_body(done, at))


def _error(error_type: str, message: str) -> dict[str, Any]:
    return {"error_type": error_type, "message": message}


def reply_body(done: ObjectDone, at: int) -> bytes:
    """What a caller gets: the invocation's result or error, and ``at``, the journal
    sequence of its ``obj.done`` (what the caller's later reads must reflect)."""
    body: dict[str, Any] = {"seq": done.inbox_seq, "at": at}
    if done.ok:
        body["result"] = done.result
    else:
        body["error_type"], body["message"] = done.error_type, done.message
    return msgspec.json.encode(body)
