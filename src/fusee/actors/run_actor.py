"""A run's driver: activate from the journal, execute the workflow's generations, end.

It runs on an :class:`~fusee.actors.core.ActorCore` (the fence, the commits, the inbox,
the waits: the same for objects). The actor stays in memory between steps (no replay
per step). It is evicted, and replayed from its journal when it resumes, when its
worker gives it up, when it is fenced out, and after every step in
``FUSEE_ALWAYS_REPLAY=1`` mode.

What an activation does, and what follows the workflow's end, is decided by the pure
:class:`~fusee.runtime.run_life.RunLife`: this driver performs its commands (the reads,
the commits, running the code with its inbox watched, the compensations, the notices,
the index entry, the markers, the log lines) and feeds back what came of each.
"""

from __future__ import annotations

import functools
from typing import Any

import anyio
import structlog

from fusee.actors.children import cancel_children, notify_parent
from fusee.actors.concurrency import control_in
from fusee.actors.context import Context, run_compensations
from fusee.actors.core import ActorCore
from fusee.actors.outcomes import Outcome, failure_of
from fusee.actors.ports import scheduled_by
from fusee.actors.registry import Registry
from fusee.actors.run_index import project_index
from fusee.errors import (
    ContinueAsNew,
    DeterminismError,
    Evicted,
    JournalGap,
    Parked,
    StepBudgetExceeded,
    StepPaused,
    Unreplayable,
    error_type_name,
)
from fusee.logs import get_logger
from fusee.runtime.codec import decode_value, encode_value
from fusee.runtime.history import History, Replayer, load_journal
from fusee.runtime.inbox import Cancel, Invoke, Resume, Unknown
from fusee.runtime.life_events import (
    Broken,
    CancelChildren,
    CancelRead,
    ClearUnstarted,
    CodeEnded,
    Command,
    Commit,
    Committed,
    CompensationsBroken,
    CompensationsRan,
    Continued,
    Event,
    EvictedOut,
    Execute,
    Finish,
    Flush,
    IndexRead,
    Load,
    Loaded,
    LoadFailed,
    Log,
    NotifyParent,
    ParkedOut,
    PausedOut,
    Project,
    Raised,
    ReadIndex,
    Reraise,
    Returned,
    RunCompensations,
    Stopped,
    StopWatch,
    Unmark,
    WatchStopped,
)
from fusee.runtime.run_life import RunLife

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
        self.life = RunLife(always_replay=core.always_replay)
        self._ctx: Context | None = None  # the code's context, for its compensations
        self._resume: tuple[int, Resume] | None = None  # the last resume read in the inbox

    # -- activation ---------------------------------------------------------------

    async def _load(self, forgive: int = 0) -> None:
        """Read the journal (``forgive``: breaks of its chain up to this sequence are
        accepted, by a forced resume read in the inbox)."""
        self.core.history = History(self.core.run_id)
        self.core.history.forgive = forgive
        self.core.view.claimed = set()
        self.core.fence = 0
        messages = await self.core.store.read_journal(self.core.eid)
        if messages:
            self.core.fence = messages[-1].seq
        load_journal(
            self.core.history,
            [(m.seq, m.data) for m in messages],
            scheduled=scheduled_by(messages),
        )

    async def _load_and_read(self, forgive: int = 0) -> Loaded | LoadFailed:
        """The journal and the inbox, read at once: an activation's two round trips go
        out together, not one after the other (a parked run a signal brings back waits
        for both). The journal's error comes first (a broken chain pauses the run).
        ``forgive``: breaks up to this sequence are taken as they are (the machine asks,
        to end a cancelled run whose chain broke)."""
        failed: list[Exception] = []
        cancel: list[str | None] = [None]

        async def inbox() -> None:
            try:
                cancel[0] = await self._sort_inbox()
            except Exception as exc:  # noqa: BLE001 - raised below, outside the group
                failed.append(exc)

        async with anyio.create_task_group() as reads:
            reads.start_soon(inbox)
            try:
                await self._load(forgive)
            except Exception as exc:  # noqa: BLE001 - raised below, outside the group
                failed.insert(0, exc)
        if failed and isinstance(failed[0], JournalGap) and len(failed) == 1:
            gap, resume = failed[0], self._resume
            if resume is not None and resume[1].force and resume[1].gap >= gap.seq > 0:
                # a forced resume accepts the break: read again, taking it as it is
                try:
                    await self._load(forgive=max(forgive, resume[1].gap))
                    failed = []
                except JournalGap as again:
                    failed = [again]
        history = self.core.history
        if failed and isinstance(failed[0], JournalGap):
            return LoadFailed(history, str(failed[0]), cancel[0], self.core.fence)
        if failed:
            raise failed[0]
        started = history.started
        if started is None or self.registry.get(started.workflow) is not None:
            return Loaded(history, cancel[0], resume=self._resume)
        return Loaded(
            history,
            cancel[0],
            registered=False,
            workflows=tuple(self.registry.names()),
            resume=self._resume,
        )

    async def run(self) -> Outcome:
        """Activate, execute until the run ends or parks, and say how it left. What to
        do at each turn is decided by :class:`fusee.runtime.run_life.RunLife`; this
        performs it and feeds back what came of it."""
        self.core.start()
        with structlog.contextvars.bound_contextvars(run_id=self.core.run_id):
            commands = self.life.begin()
            while True:
                try:
                    event = await self._perform(commands)
                except Parked:
                    event = ParkedOut()
                except StepPaused as paused:
                    event = PausedOut(paused.record)
                except Evicted as exc:
                    event, evicted = EvictedOut(), exc
                if isinstance(event, Finish):
                    if event.outcome == "paused":
                        # what it read, it acted on: its worker watches for what follows
                        self.core.left_at = self.core.view.seen
                    return event.outcome
                if isinstance(event, Reraise):
                    raise evicted
                assert event is not None
                commands = self.life.feed(event, self.core.clock())

    async def _perform(self, commands: list[Command]) -> Event | Finish | Reraise | None:
        """Perform ``commands`` in order; what the last one brought, how the activation
        leaves, or None (nothing asked)."""
        for cmd in commands:
            if isinstance(cmd, Log):
                getattr(log, cmd.level)(cmd.event, **cmd.fields)
            elif isinstance(cmd, Project):
                await self._project(cmd)
            elif isinstance(cmd, Unmark):
                await self.core.store.clear_run_active(self.core.partition, self.core.eid)
            elif isinstance(cmd, ClearUnstarted):
                await self.core.store.clear_unstarted(self.core.partition, self.core.eid)
            elif isinstance(cmd, Flush):
                await self.core.flush()
            elif isinstance(cmd, CancelChildren):
                await cancel_children(
                    self.core.store, self.core.partitions, self.core.history, cmd.reason
                )
            elif isinstance(cmd, NotifyParent):
                await notify_parent(self.core.store, self.core.partitions, self.core.history)
            elif isinstance(cmd, Finish | Reraise):
                return cmd
            else:
                return await self._ask(cmd)
        return None

    async def _ask(self, cmd: Command) -> Event:
        if isinstance(cmd, Load):
            return await self._load_and_read(cmd.forgive)
        if isinstance(cmd, ReadIndex):
            return IndexRead(await self.core.store.get_index_entry(self.core.eid))
        if isinstance(cmd, Commit):
            await self.core.commit(cmd.record, unlist=cmd.unlist)
            return Committed()
        if isinstance(cmd, Execute):
            return await self._execute(cmd)
        if isinstance(cmd, RunCompensations):
            assert self._ctx is not None
            try:
                failed = await run_compensations(self._ctx)
            except DeterminismError as exc:
                return CompensationsBroken(str(exc))
            return CompensationsRan(
                tuple((f.step, f"{f.error_type}: {f.message}") for f in failed or ())
            )
        raise AssertionError(f"{cmd} is performed without an answer")  # pragma: no cover

    async def _execute(self, cmd: Execute) -> Event:
        """Run the workflow's code with its inbox watched, and perform what the machine
        asks until it stops the watch."""
        started = self.core.history.started
        assert started is not None
        wf = self.registry.get(started.workflow)
        assert wf is not None
        replayer = Replayer(self.core.history)
        ctx = self._ctx = Context(self.core, replayer, retry=wf.retry, max_steps=wf.max_steps)
        deadline = None if cmd.remaining is None else anyio.current_time() + cmd.remaining
        escaped: BaseException | None = None
        async with anyio.create_task_group() as watch:
            # A cancel in the run's inbox cancels the workflow where it is; the running
            # step sees its s.signal set and its task cancelled.
            watch.start_soon(functools.partial(self.core.watch_inbox, self._read_inbox, once=True))
            try:
                ended = await self._run_workflow(wf, ctx, replayer, deadline, cmd.cancelled)
                commands = self.life.feed(ended, self.core.clock())
                # (a completed run's end is committed before the watch stops)
                while not isinstance(commands[-1], StopWatch):
                    event = await self._perform(commands)
                    assert event is not None
                    assert not isinstance(event, Finish | Reraise)
                    commands = self.life.feed(event, self.core.clock())
                await self._perform(commands[:-1])
            except BaseException as exc:  # noqa: BLE001 - re-raised below, outside the group
                # (Evicted, Fenced, cancellation) must leave ungrouped
                escaped = exc
            watch.cancel_scope.cancel()
        if escaped is not None:
            raise escaped
        return WatchStopped()

    async def _run_workflow(
        self, wf: Any, ctx: Context, replayer: Replayer, deadline: float | None, cancelled: bool
    ) -> CodeEnded:
        """Run the workflow's code; how it ended."""
        started = self.core.history.started
        assert started is not None
        ended: CodeEnded = Stopped()
        with anyio.CancelScope(
            deadline=deadline if deadline is not None else float("inf")
        ) as scope:
            self.core.workflow_scope = scope
            if cancelled:
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
                except StepBudgetExceeded as exc:  # (the code cannot catch it)
                    return Raised(error_type_name(exc), str(exc), exc.step)
                except BaseExceptionGroup as group:
                    # a task group of the code's: its control flow is the actor's, taken
                    # as if the code had raised it itself
                    inner = control_in(group)
                    if isinstance(inner, StepBudgetExceeded):
                        return Raised(error_type_name(inner), str(inner), inner.step)
                    if not isinstance(inner, ContinueAsNew):
                        raise inner from None
                    continued = inner
                finally:
                    # tasks the code started and left running make no more calls, and
                    # their steps stop before anything follows the code's end
                    replayer.closed = True
                    await self.core.stragglers.stop()
                if replayer.broken is not None:
                    raise replayer.broken  # raised at a step, and the workflow caught it
                replayer.check_finished(f"the return of {wf.fn.__qualname__}")
                if continued is not None:
                    ended = Continued(continued.data, count_steps=wf.max_steps is not None)
                else:
                    ended = Returned(
                        encode_value(
                            result,
                            f"the result of run {self.core.run_id!r}",
                            limit=self.core.store.max_value,
                        )
                    )
            except (Exception, Unreplayable) as exc:  # noqa: BLE001 - the workflow's own error ends the run, journaled
                failure = failure_of(
                    exc, replayer, f"the input of run {self.core.run_id!r} does not fit {wf.name}"
                )
                if failure.broken:
                    return Broken(failure.message)
                ended = Raised(failure.error_type, failure.message, failure.step)
        if scope.cancelled_caught:
            return Stopped()
        return ended

    async def _read_inbox(self) -> bool:
        """Read what arrived in the run's inbox; True when it asks to cancel the run."""
        cancel = await self._sort_inbox()
        if cancel is not None:
            await self._perform(self.life.feed(CancelRead(cancel), self.core.clock()))
        return cancel is not None

    async def _sort_inbox(self) -> str | None:
        """Read the inbox: its messages for the waits are kept; the reason of the first
        cancel in it, as sent ("": none given; None: no cancel)."""
        cancel: str | None = None
        for seq, msg in await self.core.inbox_messages():
            if isinstance(msg, Cancel):
                if cancel is None:
                    cancel = msg.reason or ""
            elif isinstance(msg, Resume):
                self._resume = (seq, msg)  # (the machine decides whether it is stale)
            elif not isinstance(msg, Unknown | Invoke):
                self.core.keep(seq, msg)
        return cancel

    async def _project(self, cmd: Project) -> None:
        seq = self.core.fence if cmd.journal_seq is None else cmd.journal_seq
        unmark = self.core.partition if cmd.unmark else None
        # a run leaving paused keeps its marker if a cancel or a resume came meanwhile
        seen = self.core.view.seen if cmd.unmark and not cmd.info.ended else None
        await project_index(
            self.core.store,
            self.core.eid,
            cmd.info,
            seq,
            unmark=unmark,
            current=cmd.current,
            seen=seen,
        )
