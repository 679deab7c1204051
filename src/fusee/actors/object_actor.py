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

What runs next, what a caller is answered and when, when the state is projected and
when the key leaves are decided by the pure :class:`~fusee.runtime.object_life.
ObjectLife`: this driver performs its commands and runs the handlers' code.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import anyio
import anyio.abc
import msgspec
import structlog

from fusee.actors.children import cancel_children, live_children
from fusee.actors.concurrency import control_in
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
from fusee.runtime.life_events import Log
from fusee.runtime.object_life import (
    REPROJECT_AFTER,
    CancelRunning,
    Command,
    Decided,
    Keep,
    Loaded,
    ObjectLife,
    PutState,
    QueueChanged,
    RaiseWriteError,
    Reply,
    RunEdit,
    RunHandler,
    error_fields,
)
from fusee.runtime.objects import ReadOnlyState, StateView, edit_changes, encode_state, fold
from fusee.runtime.records import Invocation, ObjectDone, ObjectStarted
from fusee.runtime.waits import Park

__all__ = ("ObjectActor", "REPROJECT_AFTER")

log = get_logger()


class ObjectActor:
    """The shell of :class:`~fusee.runtime.object_life.ObjectLife`: it reads, journals,
    runs the handlers' code, writes the projection and answers the callers, as the
    machine's commands say."""

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
        self.object_type = object_type
        self.key = key
        self.life = ObjectLife(core.run_id, park_after=core.park_after)
        self._background: anyio.abc.TaskGroup | None = None
        self._projecting: anyio.Event | None = None  # set once the put in flight is done
        self._projection_error: BaseException | None = None
        self._queue_changed = anyio.Event()  # set when an invocation or a cancel is read

    async def before_step(self) -> None:
        """An invocation is journaled before its first step runs, so it shows as
        running (and its start time survives a crash)."""
        if self.core.history.pending_invocation is not None:
            await self.core.commit(ObjectStarted())

    # -- activation -------------------------------------------------------------------

    async def run(self) -> Outcome:
        """Activate, run what is queued, and say how it left: ``idle`` (nothing queued
        for ``park_after`` seconds), ``parked`` (an invocation waits), ``unrunnable``."""
        self.core.start()
        with structlog.contextvars.bound_contextvars(object=self.object_type, key=self.key):
            while True:
                try:
                    snap = await read_object(self.core.store, self.object_type, self.key)
                except JournalGap as gap:
                    log.error("object.paused", reason=str(gap))
                    return "paused"
                self.core.history, self.core.fence = snap.history, snap.fence
                loaded = Loaded(
                    snap.state,
                    snap.cursor,
                    snap.revision,
                    snap.projected_at,
                    tuple(snap.unprojected),
                    snap.history.size,
                )
                catch_up = self.life.loaded(loaded)
                self.core.read_again(self.life.cursor)  # from the cursor, from the server
                try:
                    await self._perform(catch_up)  # (the callers a projection missed)
                    return await self._serve()
                except Parked:
                    running = self.life.running
                    log.info("object.parked", inbox_seq=running.inbox_seq if running else 0)
                    return "parked"
                except Evicted:
                    if not self.core.always_replay:
                        raise
                    continue  # replay from the journal, as a new worker would

    async def _perform(self, commands: list[Command]) -> bool:
        """Carry out ``commands``; True when one said to stop the running code."""
        cancel = False
        for cmd in commands:
            if isinstance(cmd, Log):
                getattr(log, cmd.level)(cmd.event, **cmd.fields)
            elif isinstance(cmd, Reply):
                await self._reply(cmd.invocation, cmd.done, cmd.at)
            elif isinstance(cmd, PutState):
                if not cmd.background:
                    await self._put(cmd.data, cmd.seq, cmd.cursor)
                else:
                    self._put_soon(cmd)
            elif isinstance(cmd, RaiseWriteError):
                self._raise_projection_error()
            elif isinstance(cmd, Keep):
                self.core.keep(cmd.seq, cmd.message)
            elif isinstance(cmd, CancelRunning):
                cancel = True
            elif isinstance(cmd, QueueChanged):
                self._queue_changed.set()
                self._queue_changed = anyio.Event()
            else:
                raise AssertionError(f"not a command here: {cmd!r}")
        return cancel

    # -- the queue --------------------------------------------------------------------

    async def _serve(self) -> Outcome:
        # Two helpers live as long as this activation: the inbox watcher (the only
        # reader of the inbox once the first read is done: it queues invocations, hands
        # the running one its signals and cancels) and the projection writes (the reply
        # goes out once obj.done landed, the projection after it, in the background).
        # Leaving (idle, parked, evicted) waits for the writes.
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
                await self._perform(self.life.leaving(self.core.history.size))
            except (Parked, Evicted) as exc:
                escaped = exc
                await self._perform(self.life.leaving(self.core.history.size))
            except BaseException as exc:  # noqa: BLE001 - re-raised below, ungrouped
                escaped = exc  # (Fenced, a failed commit: the worker tells them apart)
            finally:
                self._background = None
                background.cancel_scope.cancel()  # the watcher; the writes are shielded
        if escaped is not None:
            try:
                self._raise_projection_error()
            except BaseException as error:  # (both leave: the escaped one named)
                raise error from escaped
            raise escaped
        self._raise_projection_error()
        return outcome

    def _begun(self) -> Invocation | None:
        history = self.core.history
        return history.invocation if history.done is None else None

    async def _serve_queue(self) -> Outcome:
        while True:
            obj = self.registry.get_object(self.object_type)
            invocation = self.life.next(
                self._begun(), self.core.clock, functools.partial(_timeout, obj)
            )
            if invocation is None:
                if self.core.evict_requested():
                    raise Evicted
                if await self._idle():
                    return "idle"
                continue
            names = self.registry.object_names() if obj is None else ()
            line = self.life.unrunnable(obj is not None, invocation, names)
            if line is not None:
                await self._perform([line])
                return "unrunnable"
            await self._invoke(obj, invocation)
            await self.core.maybe_evict()

    async def _idle(self) -> bool:
        """Nothing queued: True once the machine says to leave; False as soon as
        something was queued (or a cancel read)."""
        self.life.idle_begin(self.core.clock())
        while True:
            changed = self._queue_changed  # set by the next read that queues something
            cmd = self.life.idle_next(seen=self.core.view.seen, now=self.core.clock())
            if cmd is None:
                return False
            if isinstance(cmd, Park):
                self.core.left_at = cmd.left_at
                return True
            with anyio.move_on_after(max(0.0, cmd.until - self.core.clock())):
                await changed.wait()

    async def _read_inbox(self) -> bool:
        """Hand what arrived to the machine; True when it cancels the running one."""
        before = self._begun()  # (as it was when the read began)
        messages = await self.core.inbox_messages()  # (an invocation may end or begin)
        begun = self._begun()  # (as it is now: the one a cancel must reach)
        began_at = self.core.history.invocation_at
        return await self._perform(
            self.life.inbox(messages, begun=begun, begun_at=began_at, before=before)
        )

    # -- one invocation ---------------------------------------------------------------

    async def _invoke(self, obj: ObjectType | None, inv: Invocation) -> None:
        history = self.core.history
        if history.invocation is not inv:
            history.begin(inv, self.core.partition)
        self.core.view.floor = inv.inbox_seq
        handlers = {n: h.shared for n, h in obj.handlers.items()} if obj is not None else None
        what = self.life.start(inv, handlers=handlers, journaled=history.generation_size)
        began = self.core.clock()
        handler = obj.handlers.get(inv.handler) if obj is not None else None
        view = (
            ReadOnlyState(self.life.state, self.object_type)
            if isinstance(what, RunHandler) and what.shared
            else StateView(self.life.state, self.object_type)
        )
        replayer = Replayer(history)
        ctx = ObjectContext(
            self.core, replayer, object_type=self.object_type, key=self.key, state=view
        )
        log.debug("invocation.started", handler=inv.handler, inbox_seq=inv.inbox_seq)
        fields: dict[str, Any]
        if isinstance(what, Decided):
            fields = what.fields
        elif isinstance(what, RunEdit):
            fields = self._edit(inv)
        else:
            assert isinstance(what, RunHandler)
            assert handler is not None
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
                fields = error_fields(
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
        if self._background is None:
            raise RuntimeError("an invocation ended outside _serve")
        await self._perform(self.life.ended(inv, done, self.core.fence, history.size))
        # the next invocation starts clean
        self.core.workflow_scope = None
        self.core.running_steps.clear()
        self.core.view.drop_through(self.life.cursor)

    def _state_fits(self, inv: Invocation, fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` when the state they leave fits one stored value (the projection
        is one KV message); else the invocation's failure, its changes dropped."""
        if not fields.keys() & {"state_set", "state_deleted", "state_cleared"}:
            return fields
        after = fold(
            self.life.state, ObjectDone(inbox_seq=inv.inbox_seq, handler=inv.handler, **fields)
        )
        try:
            check_size(
                encode_state(after),
                f"the state of object {self.core.run_id!r} after handler {inv.handler!r}",
                self.core.store.max_value,
            )
        except NotEncodable as exc:
            return error_fields("fusee.NotEncodable", f"{exc} Its changes were dropped.")
        return fields

    def _edit(self, inv: Invocation) -> dict[str, Any]:
        """``objects edit / set / clear``: an exclusive invocation like any other, so it
        waits its turn and no handler that began before it overwrites it."""
        try:
            changes = edit_changes(msgspec.json.decode(bytes(inv.input)), "objects edit")
            return {"result": msgspec.Raw(b"null"), **changes}
        except Exception as exc:  # noqa: BLE001 - a bad edit fails alone, state untouched
            return error_fields(error_type_name(exc), str(exc))

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
            if self.life.cancel_reason is not None:
                scope.cancel()
            try:
                try:
                    if handler.takes_input:
                        result = handler.fn(ctx, decode_value(bytes(inv.input), handler.input_type))
                    else:
                        result = handler.fn(ctx)
                    if inspect.isawaitable(result):
                        result = await result
                except BaseExceptionGroup as group:
                    raise control_in(group) from None  # (as a run's)
                finally:
                    # (as a run's: tasks the handler left running stop first)
                    replayer.closed = True
                    await self.core.stragglers.stop()
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
                return error_fields(
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
                return error_fields(failure.error_type, failure.message)
        if self.life.cancel_reason is not None:
            return error_fields("fusee.Cancelled", self.life.cancel_reason)
        assert inv.timeout is not None
        return error_fields(
            "fusee.Timeout",
            f"{where} took longer than its timeout of {format_duration(inv.timeout)} "
            f"(set it with fusee.object(..., timeout=) or fusee.exclusive(fn, timeout=))",
        )

    # -- after an invocation ----------------------------------------------------------

    def _put_soon(self, cmd: PutState) -> None:
        """Write the projection in the background, after the put before it."""
        assert self._background is not None
        before, done = self._projecting, anyio.Event()
        self._projecting = done
        self._background.start_soon(self._put_after, before, done, cmd.data, cmd.seq, cmd.cursor)

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

    async def _put(self, data: bytes, seq: int, cursor: int) -> None:
        """Write the state to KV, tagged with the journal record it was made at (after
        that record landed: the projection is never ahead of the journal)."""
        revision = await self.core.store.put_state(
            self.object_type,
            self.key,
            data,
            journal_seq=seq,
            cursor=cursor,
            last=self.life.revision,
        )
        if revision is None:
            # another writer projected since: this copy is stale (a newer owner exists)
            raise Fenced(f"the state of object {self.core.run_id!r} was written by another worker")
        self.life.projected(revision)

    async def _reply(self, inv: Invocation, done: ObjectDone, at: int) -> None:
        if not inv.reply:
            return
        await self.core.store.publish_core(inv.reply, reply_body(done, at))


def _timeout(obj: ObjectType | None, handler: str) -> float | None:
    """The timeout of ``handler`` of ``obj`` (the type's, unless the handler has one)."""
    if obj is None:
        return None
    if handler in obj.handlers:
        return obj.handler_timeout(obj.handlers[handler])
    return obj.timeout


def reply_body(done: ObjectDone, at: int) -> bytes:
    """What a caller gets: the invocation's result or error, and ``at``, the journal
    sequence of its ``obj.done`` (what the caller's later reads must reflect)."""
    body: dict[str, Any] = {"seq": done.inbox_seq, "at": at}
    if done.ok:
        body["result"] = done.result
    else:
        body["error_type"], body["message"] = done.error_type, done.message
    return msgspec.json.encode(body)
