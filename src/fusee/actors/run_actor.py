"""A run's driver: activate from the journal, execute the workflow's generations, end.

It runs on an :class:`~fusee.actors.core.ActorCore` (the fence, the commits, the inbox,
the waits: the same for objects). The actor stays in memory between steps (no replay
per step). It is evicted, and replayed from its journal when it resumes, when its
worker gives it up, when it is fenced out, and after every step in
``FUSEE_ALWAYS_REPLAY=1`` mode.
"""

from __future__ import annotations

import functools
from typing import Any

import anyio
import msgspec
import structlog

from fusee.actors.children import cancel_children, live_children, notify_parent
from fusee.actors.context import Context, run_compensations
from fusee.actors.core import ActorCore
from fusee.actors.outcomes import Outcome, failure_of
from fusee.actors.registry import Registry
from fusee.actors.run_index import project_index
from fusee.errors import (
    ContinueAsNew,
    DeterminismError,
    Evicted,
    JournalGap,
    Parked,
    Unreplayable,
)
from fusee.logs import get_logger
from fusee.runtime.codec import decode_value, encode_value
from fusee.runtime.durations import format_duration
from fusee.runtime.history import History, Replayer
from fusee.runtime.inbox import Cancel, Invoke, Unknown
from fusee.runtime.index import decode_info, info_from_history
from fusee.runtime.records import (
    AnyRecord,
    RunCancelled,
    RunCompleted,
    RunContinued,
    RunFailed,
    RunPaused,
)

__all__ = ("RunActor", "Outcome")

log = get_logger()


class RunActor:
    def __init__(
        self,
        *,
        registry: Registry,
        core: ActorCore,
    ) -> None:
        """A run's driver over ``core``; ``registry``: the workflows it may run."""
        self.core = core
        self.registry = registry
        self.cancel_reason: str | None = None

    # -- activation ---------------------------------------------------------------

    async def _load(self) -> None:
        self.core.history = History(self.core.run_id)
        self.core.view.claimed = set()
        self.core.fence = 0
        for msg in await self.core.store.read_journal(self.core.eid):
            self.core.fence = msg.seq
            self.core.history.feed(msg.seq, msg.data)

    async def _load_and_read(self) -> None:
        """The journal and the inbox, read at once: an activation's two round trips go
        out together, not one after the other (a parked run a signal brings back waits
        for both). The journal's error comes first (a broken chain pauses the run)."""
        failed: list[Exception] = []

        async def inbox() -> None:
            try:
                await self._read_inbox()
            except Exception as exc:  # noqa: BLE001 - raised below, outside the group
                failed.append(exc)

        async with anyio.create_task_group() as reads:
            reads.start_soon(inbox)
            try:
                await self._load()
            except Exception as exc:  # noqa: BLE001 - raised below, outside the group
                failed.insert(0, exc)
        if failed:
            raise failed[0]

    async def run(self) -> Outcome:
        """Activate, execute until the run ends or parks, and say how it left."""
        self.core.start()
        with structlog.contextvars.bound_contextvars(run_id=self.core.run_id):
            first = True
            while True:
                try:
                    await self._load_and_read()
                except JournalGap as gap:
                    # Nothing is appended after a broken chain: an operator looks first.
                    log.error("run.paused", reason=str(gap))
                    await self._project(running=False, reason=str(gap), paused=True, leaving=True)
                    return "paused"
                if self.core.history.started is None:
                    if await self.core.store.get_index(self.core.eid) is None:
                        # a marker left by a start that never happened, or a message to
                        # a run that starts now: its marker goes unless it started
                        await self.core.store.clear_unstarted(self.core.partition, self.core.eid)
                        return "ended"
                    # Indexed but no journal: it was purged or lost. Say so, loudly.
                    reason = (
                        f"the journal of run {self.core.run_id!r} is gone (purged or lost) "
                        f"while the run index still lists it"
                    )
                    log.error("run.paused", reason=reason)
                    await self._mark_index_paused(reason)
                    await self._unmark()
                    return "paused"
                if self.core.history.ended:
                    await self._after_end()  # again: it may not have reached its parent
                    await self._project(running=False, leaving=True)
                    return "ended"
                if self.core.history.paused is not None:
                    await self._project(running=False, leaving=True)
                    return "paused"
                # A cancel (read with the journal, or before an eviction) is carried out by
                # replaying the workflow to where it stopped, to run its compensations.
                wf = self.registry.get(self.core.history.started.workflow)
                if wf is None and self.cancel_reason is not None:
                    # nobody here can replay it: it ends without its compensations
                    return await self._end(RunCancelled(reason=self.cancel_reason))
                if wf is None:
                    reason = (
                        f"no workflow named {self.core.history.started.workflow!r} is registered at "
                        f"this worker (it has: {', '.join(self.registry.names()) or 'none'})"
                    )
                    log.error("run.unrunnable", reason=reason)
                    await self._project(running=False, reason=reason)
                    return "unrunnable"
                if first:
                    log.info(
                        "run.resumed" if self.core.history.size > 1 else "run.started",
                        workflow=wf.name,
                        steps=len(self.core.history.outcomes),
                    )
                    # (no index entry: ``describe()`` says running while its
                    # partition has an owner, see "Writes per run")
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
                    if not self.core.always_replay:
                        raise
                    continue  # replay from the journal, as a new worker would

    async def _execute(self, wf: Any) -> Outcome:
        started = self.core.history.started
        assert started is not None
        replayer = Replayer(self.core.history)
        ctx = Context(self.core, replayer)
        deadline = None
        if started.timeout is not None:
            remaining = started.started_at + started.timeout - self.core.clock()
            deadline = anyio.current_time() + max(0.0, remaining)
        record: AnyRecord
        escaped: BaseException | None = None
        completed = False
        async with anyio.create_task_group() as watch:
            # A cancel in the run's inbox cancels the workflow where it is; the running
            # step sees its s.signal set and its task cancelled.
            watch.start_soon(functools.partial(self.core.watch_inbox, self._read_inbox, once=True))
            try:
                record, paused = await self._run_workflow(wf, ctx, replayer, deadline)
                if paused is None and isinstance(record, RunCompleted):
                    # Committed before the watch is stopped: leaving the group waits
                    # for the watch task to end (a trip through the event loop), and
                    # that need not come before the result. A cancel read meanwhile
                    # changes nothing: the workflow's scope is closed, and a completed
                    # run stays completed (as below).
                    await self.core.commit(record)
                    completed = True
            except BaseException as exc:  # noqa: BLE001 - re-raised below, outside the group
                # (Evicted, Fenced, cancellation) must leave ungrouped
                escaped = exc
            watch.cancel_scope.cancel()
        if escaped is not None:
            raise escaped
        if completed:
            return await self._ended(record)
        if paused is not None:
            return await self._pause(paused)
        if self.cancel_reason is not None and not isinstance(record, RunCompleted | RunFailed):
            record = RunCancelled(reason=self.cancel_reason)
        if not isinstance(record, RunCompleted | RunContinued):
            # Outside the workflow's scope: neither a cancel nor the run's timeout stops them.
            try:
                failed = await run_compensations(ctx)
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
        self, wf: Any, ctx: Context, replayer: Replayer, deadline: float | None
    ) -> tuple[AnyRecord, str | None]:
        """Run the workflow's code; returns its end record, or a reason to pause."""
        started = self.core.history.started
        assert started is not None
        record: AnyRecord = RunCancelled(reason="")
        with anyio.CancelScope(
            deadline=deadline if deadline is not None else float("inf")
        ) as scope:
            self.core.workflow_scope = scope
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
                        generation=self.core.history.generation + 1,
                        continued_at=self.core.clock(),
                    )
                else:
                    record = RunCompleted(
                        result=msgspec.Raw(
                            encode_value(
                                result,
                                f"the result of run {self.core.run_id!r}",
                                limit=self.core.store.max_value,
                            )
                        )
                    )
            except (Exception, Unreplayable) as exc:  # noqa: BLE001 - the workflow's own error ends the run, journaled
                failure = failure_of(
                    exc, replayer, f"the input of run {self.core.run_id!r} does not fit {wf.name}"
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

    async def _read_inbox(self) -> bool:
        """Read what arrived in the run's inbox; True when it asks to cancel the run."""
        cancel = False
        for seq, msg in await self.core.inbox_messages():
            if isinstance(msg, Cancel):
                if self.cancel_reason is None:
                    self.cancel_reason = msg.reason or "cancelled"
                    log.info("run.cancelling", reason=self.cancel_reason)
                cancel = True
            elif not isinstance(msg, Unknown | Invoke):
                self.core.keep(seq, msg)
        return cancel

    async def _end(self, record: AnyRecord) -> Outcome:
        if isinstance(record, RunContinued):
            return await self._continue(record)
        await self.core.commit(record)
        return await self._ended(record)

    async def _ended(self, record: AnyRecord) -> Outcome:
        """After the end ``record`` landed."""
        log.info(f"run.{_END_STATUS[type(record)]}", **_end_fields(record))
        await self._after_end()
        await self._project(running=False, leaving=True)
        return "ended"

    async def _after_end(self) -> None:
        """An ended run cancels the children it still waited for, and a child tells its
        parent how it ended. Both are idempotent: an ended run activated again (its
        worker died before they were sent) sends them again."""
        end = self.core.history.end
        if end is None:
            return
        if live_children(self.core.history):
            await cancel_children(
                self.core.store,
                self.core.partitions,
                self.core.history,
                f"parent {self.core.run_id!r} {_END_STATUS[type(end)]}"
                + (f": {end.reason}" if isinstance(end, RunCancelled) else ""),
            )
        await notify_parent(self.core.store, self.core.partitions, self.core.history)

    async def _continue(self, record: RunContinued) -> Outcome:
        """End this generation and start the next in one record (a crash before it
        lands replays this generation; after it, the next one starts from the journal)."""
        if live_children(self.core.history):  # nothing in the next generation waits for them
            await self.core.flush()  # a message to another inbox: on durable waits only
            await cancel_children(
                self.core.store,
                self.core.partitions,
                self.core.history,
                f"parent {self.core.run_id!r} continued as new",
            )
        await self.core.commit(record)
        log.info("run.continued", generation=record.generation)
        return "continued"

    async def _pause(self, reason: str) -> Outcome:
        log.error("run.paused", reason=reason)
        await self.core.commit(RunPaused(reason=reason))
        await self._project(running=False, leaving=True)
        return "paused"

    async def _mark_index_paused(self, reason: str) -> None:
        current = await self.core.store.get_index_entry(self.core.eid)
        if current is None or not current[0]:
            return
        info = decode_info(current[0])
        info.status, info.reason, info.updated_at = "paused", reason, self.core.clock()
        await project_index(self.core.store, self.core.eid, info, current[1])

    async def _project(
        self,
        *,
        running: bool,
        reason: str | None = None,
        paused: bool = False,
        waiting: bool = False,
        leaving: bool = False,
    ) -> None:
        """Write the run's index entry; ``leaving``: the run ends or pauses here, and
        its active marker goes too (in the same write for an end)."""
        if self.core.history.started is None:
            if leaving:
                await self._unmark()
            return
        info = info_from_history(self.core.history, now=self.core.clock(), running=running)
        if reason is not None:
            info.reason = reason
        if paused:
            info.status = "paused"
        elif waiting and not info.ended:
            info.status = "waiting"
        unmark = self.core.partition if leaving else None
        await project_index(self.core.store, self.core.eid, info, self.core.fence, unmark=unmark)

    async def _unmark(self) -> None:
        await self.core.store.clear_run_active(self.core.partition, self.core.eid)


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
