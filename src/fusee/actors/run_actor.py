"""A run as a single-writer actor: activate from the journal, execute, commit, end.

The actor stays in memory between steps (no replay per step). It is evicted, and
replayed from its journal when it resumes, when its worker gives it up, when it is
fenced out, and after every step in ``FUSEE_ALWAYS_REPLAY=1`` mode.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
import structlog

from fusee.actors.children import cancel_children, live_children, notify_parent
from fusee.actors.combinators import may_park
from fusee.actors.context import Context
from fusee.actors.outcomes import Outcome, failure_of
from fusee.actors.ports import RunStore, Stored
from fusee.actors.registry import Registry
from fusee.actors.run_index import project_index
from fusee.errors import (
    CommitFailed,
    ContinueAsNew,
    DeterminismError,
    Evicted,
    JournalGap,
    NotEncodable,
    Parked,
    Unreplayable,
)
from fusee.logs import get_logger
from fusee.runtime.codec import decode_value, encode_value
from fusee.runtime.durations import format_duration
from fusee.runtime.history import History, Replayer
from fusee.runtime.inbox import Cancel, InboxMessage, Invoke, Unknown, decode_message
from fusee.runtime.index import decode_info, info_from_history
from fusee.runtime.records import (
    AnyRecord,
    RunCancelled,
    RunCompleted,
    RunContinued,
    RunFailed,
    RunPaused,
    ValueRef,
    WaitDone,
    WaitStarted,
    encode_record,
    kind_of,
)
from fusee.runtime.waits import Commit, InboxView, Park, SetTimer, Wait

__all__ = ("RunActor", "Outcome")

log = get_logger()


class RunActor:
    def __init__(
        self,
        *,
        store: RunStore,
        namespace: str,
        eid: str,
        run_id: str,
        partition: int,
        registry: Registry,
        clock: Callable[[], float],
        always_replay: bool = False,
        evict_requested: Callable[[], bool] = lambda: False,
        woken: anyio.Event | None = None,
        park_after: float = 1.0,
        partitions: int | None = None,
    ) -> None:
        self.store = store
        self.tokens = store.tokens
        self.namespace = namespace
        self.eid = eid
        self.run_id = run_id
        self.partition = partition
        self.registry = registry
        self.clock = clock
        self.always_replay = always_replay
        self.evict_requested = evict_requested
        self.history = History(run_id)
        self.fence = 0
        self.writer = secrets.token_hex(6)
        self.commits = 0
        # set by the worker when the run's inbox may hold something new
        self.woken = woken  # made in run(): an Event needs the event loop
        self.cancel_reason: str | None = None
        # what was read of the inbox for the waits (pure: runtime/waits.py), and an
        # event set each time it grows (made in run(): an Event needs the event loop)
        self.view = InboxView()
        self.inbox_changed: anyio.Event | None = None
        self.park_after = park_after
        self.partitions = partitions  # the namespace's, to route messages to other runs
        self.running_steps: set[anyio.Event] = set()  # the running steps' s.signal
        # ctx.all / ctx.race commit from concurrent branches: one append at a time, each
        # under the fence and the link the previous one left
        self._commit_lock = anyio.Lock()
        self.combinators = 0  # ctx.all / ctx.race running: always_replay waits for their end
        self._workflow_scope: anyio.CancelScope | None = None
        # Inbox messages the worker's inbox consumer handed over (``pushes``: set by a
        # worker that hands over every message of this inbox from before the first
        # read on), so a read needs no round trip to the server.
        self.pushes = False
        self._pushed: list[Stored] = []
        self._push_ok = False  # a read covered what came before the pushes began
        # The last inbox sequence read when the actor decided to leave memory (park, or
        # go idle): what its watcher read after that, it no longer looks at, so whoever
        # parks it reads the inbox again from here.
        self.left_at = 0

    # -- the commit ---------------------------------------------------------------

    async def commit(self, record: AnyRecord) -> int:
        """Append ``record`` under this actor's fence, linked to its predecessor.

        Raises:
            Fenced: another worker owns this run now; this copy must stop.
        """
        # Nothing more is journaled from a workflow whose scope was cancelled (the run is
        # being cancelled, or replayed to find its compensations).
        await anyio.lowlevel.checkpoint_if_cancelled()
        if not self.combinators:
            # one task commits at a time: no lock, no shield (each costs a trip through
            # the event loop on every step)
            return await self._append(record)
        async with self._commit_lock:
            # shielded: a branch cancelled mid-append (a race's loser) still records what
            # landed, so the next commit links to it under the right fence
            with anyio.CancelScope(shield=True):
                seq = await self._append(record)
        return seq

    async def _append(self, record: AnyRecord) -> int:
        prev, prev_hash = self.history.link()
        record = msgspec.structs.replace(record, prev=prev, prev_hash=prev_hash)
        # Values the workflow took since the last commit (ctx.now()...) ride on this
        # record, whatever it is: nothing was done with them durably before it.
        if pending := self.history.take_pending():
            record = msgspec.structs.replace(record, values=pending)
        # An object handler's invocation rides on its first record (see ObjectActor).
        if (invocation := self.history.take_invocation()) is not None:
            record = msgspec.structs.replace(record, invoked=invocation)
        data = encode_record(record)
        # The ID names this writer too: when a reply is lost and the fence refuses the
        # retry, the last record's ID tells our landed write from another writer's.
        # A commit cut short (cancelled by the run's timeout) may still land: the next
        # commit must not reuse its ID, or the read-back would take that record for it.
        self.commits += 1
        msg_id = f"{self.eid}:{self.history.started_seq}:{self.commits}:{self.writer}"
        try:
            seq = await self.store.append(
                self.eid, kind_of(record), data, fence=self.fence, msg_id=msg_id
            )
        except NotEncodable:
            # too large to be stored (refused before it was sent): what rode on it
            # rides on the record the caller writes instead (a failed step's)
            self.history.pending[:0] = pending
            self.history.pending_invocation = self.history.pending_invocation or invocation
            raise
        except Exception as exc:
            # the store's, not the workflow's: never an exception its code could catch
            raise CommitFailed(
                f"{kind_of(record)} of {self.run_id!r} was not journaled: "
                f"{exc or type(exc).__name__}"
            ) from exc
        self.history.add(seq, record, data)
        self.fence = seq
        return seq

    async def before_step(self) -> None:
        """A run's start is journaled already: nothing to do before a step."""

    async def store_value(self, data: bytes) -> ValueRef:
        """Store a value too large for a record out of line, before the record naming it.

        Raises:
            CommitFailed: the store refused it or did not answer (not the workflow's
                error: its code cannot catch it).
        """
        try:
            return await self.store.put_value(self.eid, data)
        except NotEncodable:
            raise  # over the largest value stored out of line: the step fails
        except Exception as exc:
            raise CommitFailed(
                f"a value of {len(data):,} bytes of {self.run_id!r} was not stored: "
                f"{exc or type(exc).__name__}"
            ) from exc

    async def read_value(self, ref: ValueRef) -> bytes:
        """A value the journal names, stored out of line.

        Raises:
            Unreplayable: it is missing or not the one named (the run pauses).
        """
        try:
            return await self.store.get_value(ref)
        except JournalGap as gap:
            raise Unreplayable(str(gap)) from None

    # -- waits ------------------------------------------------------------------------

    async def wait_out(self, started: WaitStarted) -> WaitDone:
        """Until the wait ends: a signal of its name in the inbox, or its time. Stays in
        memory for ``park_after`` seconds, then leaves (``Parked``): the next inbox
        message (a signal, the fired timer) brings the run back by replay. What to do
        at each turn is decided by :class:`fusee.runtime.waits.Wait`; this performs it."""
        history = self.history
        wait = Wait(started, park_after=self.park_after, now=self.clock())
        while True:
            assert self.inbox_changed is not None
            changed = self.inbox_changed  # set by the next read that keeps a message
            cmd = wait.next(
                self.view,
                consumed=history.consumed,
                start=history.started_seq,
                now=self.clock(),
                may_park=may_park(),
            )
            if isinstance(cmd, Commit):
                may_park(idle=False)  # busy again: a sibling branch must not park the run
                await self.commit(cmd.done)
                log.info(
                    "wait.done",
                    pos=started.pos,
                    wait=started.wait,
                    name=started.name,
                    timed_out=cmd.done.timed_out,
                )
                await self.maybe_evict()
                return history.waited[started.pos]
            if isinstance(cmd, SetTimer):
                await self.store.schedule_timer(
                    self.eid, self.partition, cmd.pos, cmd.until, start=history.started_seq
                )
                wait.timer_scheduled()
            elif isinstance(cmd, Park):
                self.left_at = cmd.left_at
                raise Parked
            else:
                if cmd.kept:
                    log.debug("wait.kept", pos=started.pos, reason="another branch is busy")
                if self.view.version == cmd.version:  # (else: read meanwhile, look again)
                    with anyio.move_on_after(max(0.0, cmd.until - self.clock())):
                        await changed.wait()

    async def stop_workflow(self) -> None:
        """Cancel the workflow where it is (its code reached where it was stopped before)."""
        if self._workflow_scope is not None:
            self._workflow_scope.cancel()
        await anyio.lowlevel.checkpoint()

    async def maybe_evict(self) -> None:
        """Drop the in-memory copy at this step boundary when asked to (or always)."""
        if (self.always_replay and not self.combinators) or self.evict_requested():
            raise Evicted

    # -- activation ---------------------------------------------------------------

    async def _load(self) -> None:
        self.history = History(self.run_id)
        self.view.claimed = set()
        self.fence = 0
        for msg in await self.store.read_journal(self.eid):
            self.fence = msg.seq
            self.history.feed(msg.seq, msg.data)

    async def run(self) -> Outcome:
        """Activate, execute until the run ends or parks, and say how it left."""
        if self.woken is None:
            self.woken = anyio.Event()
        self.inbox_changed = anyio.Event()
        with structlog.contextvars.bound_contextvars(run_id=self.run_id):
            first = True
            while True:
                try:
                    await self._load()
                except JournalGap as gap:
                    # Nothing is appended after a broken chain: an operator looks first.
                    log.error("run.paused", reason=str(gap))
                    await self._project(running=False, reason=str(gap), paused=True)
                    return "paused"
                if self.history.started is None:
                    if await self.store.get_index(self.eid) is None:
                        return "ended"  # a marker left by a start that never happened
                    # Indexed but no journal: it was purged or lost. Say so, loudly.
                    reason = (
                        f"the journal of run {self.run_id!r} is gone (purged or lost) "
                        f"while the run index still lists it"
                    )
                    log.error("run.paused", reason=reason)
                    await self._mark_index_paused(reason)
                    return "paused"
                if self.history.ended:
                    await self._after_end()  # again: it may not have reached its parent
                    await self._project(running=False)
                    return "ended"
                if self.history.paused is not None:
                    await self._project(running=False)
                    return "paused"
                # A cancel (read now, or before an eviction) is carried out by replaying the
                # workflow to where it stopped, to run its compensations.
                await self._read_inbox()
                wf = self.registry.get(self.history.started.workflow)
                if wf is None and self.cancel_reason is not None:
                    # nobody here can replay it: it ends without its compensations
                    return await self._end(RunCancelled(reason=self.cancel_reason))
                if wf is None:
                    reason = (
                        f"no workflow named {self.history.started.workflow!r} is registered at "
                        f"this worker (it has: {', '.join(self.registry.names()) or 'none'})"
                    )
                    log.error("run.unrunnable", reason=reason)
                    await self._project(running=False, reason=reason)
                    return "unrunnable"
                if first:
                    log.info(
                        "run.resumed" if self.history.size > 1 else "run.started",
                        workflow=wf.name,
                        steps=len(self.history.outcomes),
                    )
                    await self._project(running=True)
                    first = False
                try:
                    outcome = await self._execute(wf)
                    if outcome == "continued":
                        continue  # its next generation, read back from the journal
                    return outcome
                except Parked:
                    log.info("run.parked")
                    await self._project(running=False, waiting=True)
                    return "parked"
                except Evicted:
                    if not self.always_replay:
                        raise
                    continue  # replay from the journal, as a new worker would

    async def _execute(self, wf: Any) -> Outcome:
        started = self.history.started
        assert started is not None
        ctx = Context(self, Replayer(self.history))
        deadline = None
        if started.timeout is not None:
            remaining = started.started_at + started.timeout - self.clock()
            deadline = anyio.current_time() + max(0.0, remaining)
        record: AnyRecord
        escaped: BaseException | None = None
        async with anyio.create_task_group() as watch:
            # A cancel in the run's inbox cancels the workflow where it is; the running
            # step sees its s.signal set and its task cancelled.
            watch.start_soon(self._watch_inbox)
            try:
                record, paused = await self._run_workflow(wf, ctx, deadline)
            except BaseException as exc:  # noqa: BLE001 - re-raised below, outside the group
                # (Evicted, Fenced, cancellation) must leave ungrouped
                escaped = exc
            watch.cancel_scope.cancel()
        if escaped is not None:
            raise escaped
        if paused is not None:
            return await self._pause(paused)
        if self.cancel_reason is not None and not isinstance(record, RunCompleted | RunFailed):
            record = RunCancelled(reason=self.cancel_reason)
        if not isinstance(record, RunCompleted | RunContinued):
            # Outside the workflow's scope: neither a cancel nor the run's timeout stops them.
            try:
                failed = await ctx._compensate()
            except DeterminismError as exc:
                return await self._pause(str(exc))
            if failed:
                log.warning(
                    "run.compensations_failed",
                    steps=[f.step for f in failed],
                    errors=[f"{f.error_type}: {f.message}" for f in failed],
                )
        return await self._end(record)

    async def _run_workflow(
        self, wf: Any, ctx: Context, deadline: float | None
    ) -> tuple[AnyRecord, str | None]:
        """Run the workflow's code; returns its end record, or a reason to pause."""
        started = self.history.started
        assert started is not None
        replayer = ctx._replayer
        record: AnyRecord = RunCancelled(reason="")
        with anyio.CancelScope(
            deadline=deadline if deadline is not None else float("inf")
        ) as scope:
            self._workflow_scope = scope
            if self.cancel_reason is not None:
                scope.cancel()  # replayed up to where it stopped, to find its compensations
            try:
                continued: ContinueAsNew | None = None
                try:
                    if wf.takes_input:
                        arg = decode_value(bytes(started.input), wf.input_type)
                        result = await wf.fn(ctx, arg)
                    else:
                        result = await wf.fn(ctx)
                except ContinueAsNew as exc:  # return ctx.continue_as_new(...)
                    continued = exc
                if replayer.broken is not None:
                    raise replayer.broken  # raised at a step, and the workflow caught it
                replayer.check_finished(f"the return of {wf.fn.__qualname__}")
                if continued is not None:
                    record = RunContinued(
                        workflow=started.workflow,
                        input=msgspec.Raw(continued.data),
                        started_at=started.started_at,
                        timeout=started.timeout,
                        partition=started.partition,
                        parent=started.parent,
                        generation=self.history.generation + 1,
                        continued_at=self.clock(),
                    )
                else:
                    record = RunCompleted(
                        result=msgspec.Raw(
                            encode_value(
                                result,
                                f"the result of run {self.run_id!r}",
                                limit=self.store.max_value,
                            )
                        )
                    )
            except (Exception, Unreplayable) as exc:  # noqa: BLE001 - the workflow's own error ends the run, journaled
                failure = failure_of(
                    exc, replayer, f"the input of run {self.run_id!r} does not fit {wf.name}"
                )
                if failure.broken:
                    return record, failure.message
                record = RunFailed(
                    error_type=failure.error_type, message=failure.message, step=failure.step
                )
        if scope.cancelled_caught:
            if self.cancel_reason is not None:
                record = RunCancelled(reason=self.cancel_reason)
            elif started.timeout is not None:
                record = RunCancelled(
                    reason=f"timeout: the run took longer than {format_duration(started.timeout)}"
                )
            else:  # stopped where its compensations began, its cancel no longer in the inbox
                record = RunCancelled(reason="cancelled")
        return record, None

    async def _watch_inbox(self, *, once: bool = True) -> None:
        """Read the inbox each time the worker says it has news (its inbox consumer saw
        a message, or a wake hint came); a cancel stops the running code, and ends the
        watch ``once`` it did (a run ends; an object watches on for its next ones)."""
        while True:
            assert self.woken is not None
            await self.woken.wait()
            self.woken = anyio.Event()
            if await self._read_inbox():
                self.cancel_running()
                if once:
                    return

    def cancel_running(self) -> None:
        """Stop the code where it is: each running step's ``s.signal`` is set first (so
        its cleanup knows why it stops), then the workflow's scope is cancelled."""
        for signal in list(self.running_steps):
            signal.set()
        if self._workflow_scope is not None:
            self._workflow_scope.cancel()

    def push(self, msg: Stored) -> None:
        """A message stored in this actor's inbox, handed over by the worker."""
        if self.pushes:
            self._pushed.append(msg)

    def push_lost(self) -> None:
        """The worker missed a message of some inbox: the next read asks the server."""
        self._push_ok = False

    async def _fetch_inbox(self) -> list[Stored]:
        """The inbox messages above what the view saw: those handed over, once a read
        from the server covered everything before them; else read from the server."""
        seen = self.view.seen
        if self._push_ok:
            taken = [m for m in self._pushed if m.seq > seen]
            self._pushed = []
            return taken
        read = list(await self.store.read_inbox(self.partition, self.eid, seen))
        last = read[-1].seq if read else seen
        # handed over meanwhile, and not in the read: kept for the next one
        self._pushed = [m for m in self._pushed if m.seq > last]
        self._push_ok = self.pushes
        return read

    async def _inbox_messages(self) -> list[tuple[int, InboxMessage | Unknown]]:
        """What arrived in the inbox since the view's ``seen``, decoded: ``(seq,
        message)`` (bytes that are not a JSON object are skipped, and logged)."""
        out: list[tuple[int, InboxMessage | Unknown]] = []
        for msg in await self._fetch_inbox():
            self.view.read(msg.seq)
            decoded = decode_message(msg.data)
            if decoded is None:
                log.warning("inbox.unreadable", seq=msg.seq)
                continue
            if isinstance(decoded, Unknown):
                log.warning("inbox.unknown", seq=msg.seq, kind=decoded.kind, why=decoded.why)
            out.append((msg.seq, decoded))
        return out

    def _keep(self, seq: int, msg: InboxMessage) -> None:
        """A message for the waits: kept in the view, and a waiting wait looks again."""
        self.view.add(seq, msg)
        if self.inbox_changed is not None:
            self.inbox_changed.set()
            self.inbox_changed = anyio.Event()

    async def _read_inbox(self) -> bool:
        """Read what arrived in the run's inbox; True when it asks to cancel the run."""
        cancel = False
        for seq, msg in await self._inbox_messages():
            if isinstance(msg, Cancel):
                if self.cancel_reason is None:
                    self.cancel_reason = msg.reason or "cancelled"
                    log.info("run.cancelling", reason=self.cancel_reason)
                cancel = True
            elif not isinstance(msg, Unknown | Invoke):
                self._keep(seq, msg)
        return cancel

    async def _end(self, record: AnyRecord) -> Outcome:
        if isinstance(record, RunContinued):
            return await self._continue(record)
        await self.commit(record)
        log.info(f"run.{_END_STATUS[type(record)]}", **_end_fields(record))
        await self._after_end()
        await self._project(running=False)
        return "ended"

    async def _after_end(self) -> None:
        """An ended run cancels the children it still waited for, and a child tells its
        parent how it ended. Both are idempotent: an ended run activated again (its
        worker died before they were sent) sends them again."""
        end = self.history.end
        if end is None:
            return
        if live_children(self.history):
            await cancel_children(
                self.store,
                self.partitions,
                self.history,
                f"parent {self.run_id!r} {_END_STATUS[type(end)]}"
                + (f": {end.reason}" if isinstance(end, RunCancelled) else ""),
            )
        await notify_parent(self.store, self.partitions, self.history)

    async def _continue(self, record: RunContinued) -> Outcome:
        """End this generation and start the next in one record (a crash before it
        lands replays this generation; after it, the next one starts from the journal)."""
        if live_children(self.history):  # nothing in the next generation waits for them
            await cancel_children(
                self.store,
                self.partitions,
                self.history,
                f"parent {self.run_id!r} continued as new",
            )
        await self.commit(record)
        log.info("run.continued", generation=record.generation)
        await self._project(running=True)
        return "continued"

    async def _pause(self, reason: str) -> Outcome:
        log.error("run.paused", reason=reason)
        await self.commit(RunPaused(reason=reason))
        await self._project(running=False)
        return "paused"

    async def _mark_index_paused(self, reason: str) -> None:
        current = await self.store.get_index_entry(self.eid)
        if current is None or not current[0]:
            return
        info = decode_info(current[0])
        info.status, info.reason, info.updated_at = "paused", reason, self.clock()
        await project_index(self.store, self.eid, info, current[1])

    async def _project(
        self,
        *,
        running: bool,
        reason: str | None = None,
        paused: bool = False,
        waiting: bool = False,
    ) -> None:
        if self.history.started is None:
            return
        info = info_from_history(self.history, now=self.clock(), running=running)
        if reason is not None:
            info.reason = reason
        if paused:
            info.status = "paused"
        elif waiting and not info.ended:
            info.status = "waiting"
        await project_index(self.store, self.eid, info, self.fence)


_END_STATUS: dict[type, str] = {
    RunCompleted: "completed",
    RunFailed: "failed",
    RunCancelled: "cancelled",
}


def _end_fields(record: AnyRecord) -> dict[str, Any]:
    if isinstance(record, RunFailed):
        return {"error": f"{record.error_type}: {record.message}", "step": record.step}
    if isinstance(record, RunCancelled):
        return {"reason": record.reason}
    return {}
