"""A run's journal, folded into what replay needs. Pure: records in, decisions out.

:class:`History` checks each record's link to its predecessor as it is fed and keeps
the step outcomes by position. :class:`Replayer` walks the workflow's calls against
it: a position that has an outcome is replayed, the first one that has none runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from fusee.errors import ControlFlow, DeterminismError, JournalGap
from fusee.runtime.lanes import ROOT, Lanes
from fusee.runtime.records import (
    TERMINAL,
    AnyRecord,
    CallCancelled,
    Invocation,
    ObjectDone,
    RunContinued,
    RunPaused,
    RunResumed,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepRetrying,
    Value,
    ValueRef,
    WaitDone,
    WaitStarted,
    decode_record,
    kind_of,
    record_hash,
)

__all__ = (
    "History",
    "Replayer",
    "Replayed",
    "ReplayedFailure",
    "Execute",
    "ReplayedCancel",
    "Abandoned",
    "load_journal",
)


@dataclass
class History:
    """The records of one run, verified link by link.

    A run that continued as new (``run.continued``) has generations: the chain is
    checked across all of them, but only the last one is folded (its steps, waits and
    values; ``started`` is its ``run.started`` or ``run.continued``). Inbox messages a
    wait took stay taken across generations."""

    run_id: str
    started: RunStarted | None = None
    started_seq: int = 0
    outcomes: dict[int, StepCompleted | StepFailed] = field(default_factory=dict)
    retries: dict[int, list[StepRetrying]] = field(default_factory=dict)
    waits: dict[int, WaitStarted] = field(default_factory=dict)
    waited: dict[int, WaitDone] = field(default_factory=dict)
    consumed: set[int] = field(default_factory=set)  # inbox messages a wait took
    cancelled: dict[int, CallCancelled] = field(default_factory=dict)  # lost a race
    ends: dict[int, int] = field(default_factory=dict)  # pos: seq of the record ending it
    values: list[Value] = field(default_factory=list)  # ctx.now()... journaled, in order
    pending: list[Value] = field(default_factory=list)  # handed out, not journaled yet
    # waits resolved and not journaled yet: they ride on the next record (``waited``)
    resolved: list[WaitDone] = field(default_factory=list)
    end: AnyRecord | None = None
    paused: RunPaused | None = None
    paused_seq: int = 0  # the sequence of ``paused``
    # a step's pauses (its attempts ran out under on_exhausted="pause"), by position;
    # at a position resumed: its failed attempts and its step.retrying records before
    # the last resume (an earlier budget's)
    pauses: dict[int, list[RunPaused]] = field(default_factory=dict)
    resumed_failed: dict[int, int] = field(default_factory=dict)
    resumed_retries: dict[int, int] = field(default_factory=dict)
    # breaks of the chain at a sequence up to this are taken as they are: a forced
    # resume accepted them (journaled: ``forgiven``; read from the inbox: ``forgive``)
    forgive: int = 0
    forgiven: int = 0
    # the sequence of the last forced ``run.resumed`` a cancel journaled (no inbox
    # message: ``RunLife._cancel_paused``), to end a broken run without its code
    cancel_forced_seq: int = 0
    steps_before: int = 0  # steps journaled in the generations before this one
    last_seq: int = 0
    last_hash: str = ""
    size: int = 0
    generation: int = 1
    generation_size: int = 0  # records since the last generation began, itself included
    # per position, generation_size once its last record so far was added (journal_size()
    # on replay: what the run had journaled when its code was there)
    size_at: dict[int, int] = field(default_factory=dict)
    # per position, what its call came after when not ``pos - 1`` (runtime/lanes.py):
    # journaled (its first record's), and handed out and not journaled yet
    afters: dict[int, int] = field(default_factory=dict)
    after_due: dict[int, int] = field(default_factory=dict)
    # objects: the invocation running (its generation), and the last one that ended
    invocation: Invocation | None = None
    pending_invocation: Invocation | None = None  # begun, not journaled yet
    invocation_at: int = 0  # the sequence of its first journaled record (0: none yet)
    done: ObjectDone | None = None

    def feed(
        self, seq: int, data: bytes, *, anchor: bool = False, scheduler: str | None = None
    ) -> AnyRecord | None:
        """Add the record stored at stream sequence ``seq``. An ``anchor`` is the first
        record read of a journal read from the middle (an object's, from the record its
        state projection was made at): it is taken as it is, and what follows must link
        to it.

        A break at a sequence up to :attr:`forgive` (a forced resume accepted it) is
        taken as it is: the record as an anchor, or skipped (None) if unreadable.

        Raises:
            JournalGap: the record does not name the previous record as its predecessor,
                or cannot be decoded.
        """
        if scheduler is not None:  # (never fusee's: its schedules target inboxes)
            if seq <= self.forgive:  # a forced resume accepted the break: skipped
                return None
            raise JournalGap(
                f"run {self.run_id!r}: the journal record at sequence {seq} was written by "
                f"a message schedule (on {scheduler}), never by fusee: forged",
                seq=seq,
            )
        try:
            record = decode_record(data)
        except msgspec.DecodeError as exc:
            if seq <= self.forgive:  # a forced resume accepted the break: skipped
                return None
            raise JournalGap(
                f"run {self.run_id!r}: the journal record at sequence {seq} cannot be read ({exc})",
                seq=seq,
            ) from None
        if anchor or (self.size > 0 and seq <= self.forgive):
            self.add(seq, record, data)
            return record
        if self.size > 0 and (record.prev != self.last_seq or record.prev_hash != self.last_hash):
            raise JournalGap(
                f"run {self.run_id!r}: the journal record at sequence {seq} ({kind_of(record)}) "
                f"names sequence {record.prev} (hash {record.prev_hash or '-'}) as its "
                f"predecessor, but the one before it is sequence {self.last_seq} "
                f"(hash {self.last_hash}): a record is missing or was replaced",
                seq=seq,
            )
        if self.size == 0 and not isinstance(record, RunStarted) and not record.invoked:
            raise JournalGap(
                f"run {self.run_id!r}: the journal starts with {kind_of(record)} at sequence {seq}, "
                f"not run.started",
                seq=seq,
            )
        self.add(seq, record, data)
        return record

    def add(self, seq: int, record: AnyRecord, data: bytes) -> None:
        """Add a record this process just wrote (``data`` is its encoding; the link was
        made by :meth:`link`, so it needs no check)."""
        self._apply(seq, record)
        self.last_seq = seq
        self.last_hash = record_hash(data)
        self.size += 1
        self.generation_size += 1
        pos = getattr(record, "pos", None)
        if isinstance(pos, int):
            self.size_at[pos] = self.generation_size
            if isinstance(record.after, int):
                self.afters.setdefault(pos, record.after)
                self.after_due.pop(pos, None)

    def begin(self, invocation: Invocation, partition: int = 0) -> None:
        """Start an object handler's invocation in memory: a new generation whose first
        record (whatever it is) will carry ``invocation`` (see :meth:`take_riders`)."""
        self._start_invocation(invocation, partition)
        self.pending_invocation = invocation

    def _start_invocation(self, inv: Invocation, partition: int) -> None:
        self._new_generation(self.generation + 1)
        # The invocation's inbox sequence names it everywhere a run uses the sequence of
        # its first record (step keys, timers, completion tokens, Msg-IDs): it is known
        # before anything is journaled, so it is the same before and after a crash.
        self.started = RunStarted(
            workflow=inv.handler,
            input=inv.input,
            started_at=inv.started_at,
            timeout=inv.timeout,
            partition=partition,
        )
        self.started_seq = inv.inbox_seq
        self.invocation = inv
        self.invocation_at = 0
        self.done = None

    def _new_generation(self, generation: int) -> None:
        self.outcomes, self.retries, self.waits, self.waited = {}, {}, {}, {}
        self.pauses, self.resumed_failed, self.resumed_retries = {}, {}, {}
        self.paused_seq = 0
        self.size_at = {}
        self.afters, self.after_due = {}, {}
        self.values = []
        self.end = self.paused = None
        self.cancelled, self.ends = {}, {}
        self.generation = generation
        self.generation_size = 0

    def _apply(self, seq: int, record: AnyRecord) -> None:
        invoked = record.invoked
        if invoked and (self.invocation is None or self.invocation.inbox_seq != invoked.inbox_seq):
            # the first record of an invocation, read back (one this process began has
            # started its generation already, in begin())
            self._start_invocation(invoked, self.started.partition if self.started else 0)
        if invoked:
            self.invocation_at = seq
        if isinstance(record.values, list):
            self.values.extend(record.values)
        if isinstance(record.waited, list):
            # before the record that carries them, as if each were a record of its own
            # at that sequence: counted in the generation's size, so ``journal_size()``
            # is the same whether a wait's end rode on a record or was journaled alone
            for done in record.waited:
                self._wait_done(seq, done)
                self.generation_size += 1
                self.size_at[done.pos] = self.generation_size
                if isinstance(done.after, int):
                    self.afters.setdefault(done.pos, done.after)
                    self.after_due.pop(done.pos, None)
        match record:
            case RunStarted():
                if isinstance(record, RunContinued):  # a new generation: forget the last
                    self._new_generation(record.generation)
                    self.pending = []
                    if isinstance(record.steps, int):
                        self.steps_before = record.steps
                self.started, self.started_seq = record, seq
                self.generation_size = 0
            case ObjectDone():
                self.end = self.done = record
            case StepCompleted() | StepFailed():
                self.outcomes[record.pos] = record
                self.ends.setdefault(record.pos, seq)
            case CallCancelled():
                self.cancelled[record.pos] = record
                self.ends.setdefault(record.pos, seq)
            case StepRetrying():
                self.retries.setdefault(record.pos, []).append(record)
            case WaitStarted():
                self.waits[record.pos] = record
            case WaitDone():
                self._wait_done(seq, record)
            case RunPaused():
                self.paused, self.paused_seq = record, seq
                if isinstance(record.pos, int):
                    self.pauses.setdefault(record.pos, []).append(record)
            case RunResumed():
                self._resumed(seq, record)
            case _ if isinstance(record, TERMINAL):
                self.end = record

    def _resumed(self, seq: int, record: RunResumed) -> None:
        if record.force:
            self.forgiven = max(self.forgiven, record.gap)
            self.forgive = max(self.forgive, record.gap)
            if not record.inbox_seq:
                self.cancel_forced_seq = seq
        paused = self.paused
        if paused is None or record.paused != self.paused_seq:
            return  # (a forced resume of a break names no pause)
        self.paused, self.paused_seq = None, 0
        if isinstance(paused.pos, int):  # the step gets a fresh budget
            self.resumed_failed[paused.pos] = self.failed_attempts(paused.pos)
            self.resumed_retries[paused.pos] = len(self.retries.get(paused.pos, ()))

    def step_positions(self) -> int:
        """How many steps this generation journaled (ended, retried or paused), the
        compensations included: what ``max_steps`` counts, with :attr:`steps_before`."""
        return len(self.outcomes.keys() | self.retries.keys() | self.pauses.keys())

    def _wait_done(self, seq: int, done: WaitDone) -> None:
        self.waited[done.pos] = done
        self.ends.setdefault(done.pos, seq)
        if done.inbox_seq:
            self.consumed.add(done.inbox_seq)

    def resolve(self, done: WaitDone) -> None:
        """A wait ended and is not journaled yet: the next record carries it
        (``waited``). Until then it is not durable; a crash resolves it again."""
        self.resolved.append(done)

    def is_resolved(self, pos: int) -> bool:
        """Whether the wait at ``pos`` ended, journaled or not yet."""
        return pos in self.waited or any(d.pos == pos for d in self.resolved)

    def take_pending(self) -> list[Value]:
        """The values handed out since the last commit, for the next record to carry."""
        taken, self.pending = self.pending, []
        return taken

    def take_riders(self) -> dict[str, Any]:
        """What the next record carries, whatever it is: the values handed out since the
        last commit (``values``), an object's invocation begun and not journaled yet
        (``invoked``) and the waits resolved since (``waited``). Nothing was done with
        them durably before that record."""
        riders: dict[str, Any] = {}
        if pending := self.take_pending():
            riders["values"] = pending
        if self.pending_invocation is not None:
            riders["invoked"], self.pending_invocation = self.pending_invocation, None
        if self.resolved:
            riders["waited"], self.resolved = [self.stamp(d) for d in self.resolved], []
        return riders

    def stamp(self, record: AnyRecord) -> AnyRecord:
        """``record`` with the ``after`` its position was handed out with, when that
        is not ``pos - 1`` and not journaled yet (calls of concurrent tasks)."""
        if not self.after_due:
            return record
        pos = getattr(record, "pos", None)
        if isinstance(pos, int) and pos in self.after_due:
            return msgspec.structs.replace(record, after=self.after_due[pos])
        return record

    def give_back(self, riders: dict[str, Any]) -> None:
        """The record that was to carry ``riders`` was not stored (too large, refused
        before it was sent): the next one carries them."""
        self.pending[:0] = riders.get("values", [])
        self.pending_invocation = self.pending_invocation or riders.get("invoked")
        self.resolved[:0] = riders.get("waited", [])

    def link(self) -> tuple[int, str]:
        """``(prev, prev_hash)`` for the next record to append."""
        return self.last_seq, self.last_hash

    def failed_attempts(self, pos: int) -> int:
        """How many attempts of the step at ``pos`` failed and were journaled (its
        retries, and the last attempt of each budget that paused the run)."""
        return len(self.retries.get(pos, ())) + len(self.pauses.get(pos, ()))

    @property
    def ended(self) -> bool:
        return self.end is not None

    @property
    def pending_force(self) -> bool:
        """Breaks of the chain were taken as they are (:attr:`forgive`: a forced resume
        read in the inbox, or a cancel's read) that no journaled resume accepted yet."""
        return self.forgive > self.forgiven

    @property
    def cancel_forced(self) -> bool:
        """The journal ends with the forced ``run.resumed`` of a cancel of a run whose
        chain broke (its ``run.cancelled`` did not land): not to be replayed, its
        records are missing; the cancel ends it."""
        return 0 < self.cancel_forced_seq == self.last_seq


@dataclass(frozen=True)
class Replayed:
    """The step at this position already completed: here is its result (or, for one
    stored out of line, ``ref``, where to read it)."""

    pos: int
    result: bytes
    ref: ValueRef | None = None


@dataclass(frozen=True)
class ReplayedFailure:
    """The step at this position already failed for good."""

    pos: int
    record: StepFailed


@dataclass(frozen=True)
class Execute:
    """No outcome yet at this position: run the step, as attempt ``attempt``.
    ``last_retry``: the journaled wait to finish first; ``base``: the failed attempts
    of earlier budgets (the run paused there and was resumed), not counted against
    the retry policy's attempts."""

    pos: int
    attempt: int
    last_retry: StepRetrying | None
    base: int = 0


class ReplayedCancel(ControlFlow):
    """The call at this position lost a ``ctx.race`` (or was cancelled by a ``ctx.all``
    that failed fast) in the journal: its branch is cancelled again, at once."""

    def __init__(self, record: CallCancelled) -> None:
        super().__init__(f"call {record.pos} ({record.name!r}) was cancelled: {record.reason}")
        self.record = record


class Abandoned(ControlFlow):
    """A call from a task the workflow's code left running once that code's execution
    ended (it returned, or the actor left memory): not the code the actor runs now."""


class Replayer:
    """Hands out step positions in call order and matches them against the journal."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.next_pos = 1
        self.next_value = 0  # index into the run's values (journaled, then pending)
        # Once the code and the journal disagree, they stay disagreeing: every later call
        # raises the same error, so a workflow that catches it cannot carry on.
        self.broken: DeterminismError | None = None
        # told each position as it is handed out (ctx.all / ctx.race track their branches)
        self.on_position: Callable[[int, str, str], None] | None = None  # pos, call, name
        # which lane (task) the call being made comes from (set by the shell; None: one
        # task makes every call), and what each lane took last (runtime/lanes.py)
        self.lane: Callable[[Lanes], int] | None = None
        self.lanes = Lanes()
        self.last_lane = ROOT  # the lane of the last position handed out
        # once the code's execution is over, a task it left running makes no more calls
        # (the root's, the compensations, still do)
        self.closed = False

    def begin_step(self, name: str, location: str) -> Replayed | ReplayedFailure | Execute:
        """Decide the fate of the code's next ``ctx.step(name, ...)``, made at ``location``.

        Raises:
            DeterminismError: the journal holds another step at this position.
        """
        pos = self._next_position("step", name)
        outcome = self.history.outcomes.get(pos)
        retries = self.history.retries.get(pos, [])
        journaled_name = self._step_name_at(pos)
        wait = self.history.waited.get(pos) or self.history.waits.get(pos)
        if wait is not None:  # the code used to wait here
            journaled_name = f"{wait.wait} {wait.name}"
        lost = self.history.cancelled.get(pos)
        if lost is not None and journaled_name is None:
            journaled_name = lost.name if lost.call == "step" else f"{lost.call} {lost.name}"
        if journaled_name is not None and journaled_name != name:
            self.broken = DeterminismError(
                f"run {self.history.run_id!r}: step {pos} is {journaled_name!r} in the journal, "
                f"but the code now calls {name!r} at {location}. The workflow's code changed "
                f"while the run was in flight; deploy the old code to finish it, or start a "
                f"new run."
            )
            raise self.broken
        if lost is not None:
            raise ReplayedCancel(lost)
        match outcome:
            case StepCompleted():
                ref = outcome.result_ref if isinstance(outcome.result_ref, ValueRef) else None
                return Replayed(pos, bytes(outcome.result), ref)
            case StepFailed():
                return ReplayedFailure(pos, outcome)
            case _:
                history = self.history
                since = retries[history.resumed_retries.get(pos, 0) :]
                return Execute(
                    pos,
                    history.failed_attempts(pos) + 1,
                    since[-1] if since else None,
                    history.resumed_failed.get(pos, 0),
                )

    def begin_wait(
        self, name: str, wait: str, location: str
    ) -> WaitDone | tuple[int, WaitStarted | None]:
        """Decide the fate of the code's next wait (``wait`` is ``signal`` or ``sleep``):
        its journaled end, or ``(pos, started)`` when it has not ended.

        Raises:
            DeterminismError: the journal holds another call at this position.
        """
        pos = self._next_position(wait, name)
        done = self.history.waited.get(pos)
        started = self.history.waits.get(pos)
        journaled: WaitDone | WaitStarted | None = done or started
        step_name = self._step_name_at(pos)
        lost = self.history.cancelled.get(pos)
        what = None
        if step_name is not None:
            what = f"step {step_name!r}"
        elif journaled is not None and (journaled.name, journaled.wait) != (name, wait):
            what = f"{journaled.wait} {journaled.name!r}"
        elif lost is not None and (lost.name, lost.call) != (name, wait):
            what = f"step {lost.name!r}" if lost.call == "step" else f"{lost.call} {lost.name!r}"
        if what is not None:
            self.broken = DeterminismError(
                f"run {self.history.run_id!r}: call {pos} is {what} in the journal, but the "
                f"code now waits ({wait} {name!r}) at {location}. The workflow's code changed "
                f"while the run was in flight; deploy the old code to finish it, or start a "
                f"new run."
            )
            raise self.broken
        if done is not None:
            return done
        if lost is not None:
            raise ReplayedCancel(lost)
        return pos, started

    def _next_position(self, call: str, name: str) -> int:
        """Hand out the next position to ``call`` (``step`` or a wait's kind) ``name``."""
        if self.broken is not None:
            raise self.broken
        pos = self.next_pos
        lane = ROOT if self.lane is None else self.lane(self.lanes)
        if lane != ROOT and self.closed:
            raise Abandoned(
                f"run {self.history.run_id!r}: {call} {name!r} was called from a task the "
                f"workflow left running after its code ended (or left memory); it takes "
                f"no position"
            )
        if self.on_position is not None:
            self.on_position(pos, call, name)  # may refuse: the position is not taken then
        after = self.lanes.take(lane, pos)
        history = self.history
        # journaled: did its call come after the same one live? (A generation journaled
        # with no `after` at all: recorded before fusee wrote them, or with every call
        # after the one before it; not checked, so runs in flight across the upgrade
        # keep replaying.)
        if pos in history.size_at and history.afters:
            journaled = history.afters.get(pos, pos - 1)
            if journaled != after:
                self.broken = DeterminismError(
                    f"run {history.run_id!r}: {call} {name!r} took position {pos}, which "
                    f"{self._journaled_at(pos) or 'a call'} took when the run first ran: "
                    f"that call came after position {journaled}, this one after "
                    f"{after}. Calls from concurrent tasks outside ctx.all reached ctx in "
                    f"another order than they did live (a journaled call returns at "
                    f"once on replay): run them with ctx.all, or make each task one call."
                )
                raise self.broken
        elif after != pos - 1:
            history.after_due[pos] = after
        self.last_lane = lane
        self.next_pos += 1
        return pos

    def take_value(self, kind: str, make: Callable[[], float | str], location: str) -> float | str:
        """The code's next ``ctx.now()`` / ``random()`` / ``uuid()`` (``kind``): the
        journaled value on replay, else ``make()``, kept pending until the next commit.

        Raises:
            DeterminismError: the journal holds another kind of value at this index.
        """
        if self.broken is not None:
            raise self.broken
        index = self.next_value
        self.next_value += 1
        journaled = self.history.values
        if index >= len(journaled):
            value = Value(kind, make())
            self.history.pending.append(value)
            return value.value
        value = journaled[index]
        if value.kind != kind:
            self.broken = DeterminismError(
                f"run {self.history.run_id!r}: value {index + 1} is ctx.{value.kind}() in the "
                f"journal, but the code now calls ctx.{kind}() at {location}. The workflow's "
                f"code changed while the run was in flight; deploy the old code to finish it, "
                f"or start a new run."
            )
            raise self.broken
        return value.value

    def _step_name_at(self, pos: int) -> str | None:
        outcome = self.history.outcomes.get(pos)
        if outcome is not None:
            return outcome.name
        retries = self.history.retries.get(pos)
        if retries:
            return retries[0].name
        pauses = self.history.pauses.get(pos)
        return pauses[0].step if pauses and isinstance(pauses[0].step, str) else None

    def _journaled_at(self, pos: int) -> str | None:
        """What the journal holds at ``pos``: ``step 'name'``, ``signal 'name'``,
        ``child 'id'``... (a call cancelled there says so), or None."""
        step = self._step_name_at(pos)
        if step is not None:
            return f"step {step!r}"
        wait = self.history.waited.get(pos) or self.history.waits.get(pos)
        if wait is not None:
            return f"{wait.wait} {wait.name!r}"
        lost = self.history.cancelled.get(pos)
        if lost is not None:
            return f"{'step' if lost.call == 'step' else lost.call} {lost.name!r} (cancelled)"
        return None

    def check_finished(self, location: str) -> None:
        """The workflow returned: the journal must hold no call the code did not reach
        (a step, a wait, a child, a cancelled call) and no value it did not take.

        Raises:
            DeterminismError: the journal has calls or values past the code's last one.
        """
        history = self.history
        journaled = (
            history.outcomes.keys()
            | history.retries.keys()
            | history.pauses.keys()
            | history.waits.keys()
            | history.waited.keys()
            | history.cancelled.keys()
        )
        beyond = sorted(p for p in journaled if p >= self.next_pos)
        if beyond:
            pos = beyond[0]
            raise DeterminismError(
                f"run {history.run_id!r}: the journal has call {pos} "
                f"({self._journaled_at(pos)}), but the code now returns after "
                f"{self.next_pos - 1} call(s) (at {location}). The workflow's code changed "
                f"while the run was in flight; deploy the old code to finish it, or start a "
                f"new run."
            )
        values = history.values
        if self.next_value < len(values):
            left = values[self.next_value]
            raise DeterminismError(
                f"run {history.run_id!r}: the journal has value {self.next_value + 1} "
                f"(ctx.{left.kind}()), but the code now returns after taking "
                f"{self.next_value} value(s) (at {location}). The workflow's code changed "
                f"while the run was in flight."
            )


def load_journal(
    history: History,
    messages: Sequence[tuple[int, bytes]],
    *,
    scheduled: Mapping[int, str] | None = None,
) -> list[AnyRecord]:
    """Feed ``messages`` (``(seq, data)``, in order) to ``history``; the records taken,
    in order. A break of the chain that a forced resume journaled later in them
    accepted (``run.resumed`` with ``force``, its ``gap`` at or past the break) is taken
    as it is (an unreadable record there is skipped). ``scheduled``: the sequences of
    records a message schedule wrote, with the schedule's subject (a break: forged).

    Raises:
        JournalGap: a break no forced resume accepted.
    """
    taken: list[AnyRecord] = []
    i = 0
    while i < len(messages):
        seq, data = messages[i]
        try:
            by = scheduled.get(seq) if scheduled else None
            if (record := history.feed(seq, data, scheduler=by)) is not None:
                taken.append(record)
        except JournalGap as gap:
            accepted = _forced_gap(messages[i + 1 :], scheduled or {})
            if accepted < gap.seq:
                raise
            history.forgive = max(history.forgive, accepted)
            continue  # fed again, forgiven
        i += 1
    return taken


def _forced_gap(messages: Sequence[tuple[int, bytes]], scheduled: Mapping[int, str]) -> int:
    """The furthest ``gap`` a forced ``run.resumed`` among ``messages`` accepts (0: none;
    one a message schedule wrote accepts nothing)."""
    furthest = 0
    for seq, data in messages:
        if seq in scheduled:
            continue
        try:
            record = decode_record(data)
        except msgspec.DecodeError:
            continue
        if isinstance(record, RunResumed) and record.force:
            furthest = max(furthest, record.gap)
    return furthest
