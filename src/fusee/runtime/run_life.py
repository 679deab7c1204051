"""A run's life cycle, sans I/O: what an activation does once it read the journal and
the inbox, and what follows the workflow's end.

The run's driver (``actors/run_actor.py``) owns no decision here. It performs each
command it gets, in order, and feeds back what the last one brought (an event); the
machine answers with the next commands:

- :class:`Load`: read the journal and the inbox together, then :class:`Loaded` (or
  :class:`LoadFailed`: the chain is broken);
- :class:`ReadIndex`: read the run's index entry (a run with no journal), then
  :class:`IndexRead`;
- :class:`Execute`: run the workflow's code (replayed up to where a cancel stopped it,
  when ``cancelled``), its inbox watched meanwhile, then one of :data:`CodeEnded`
  (or :class:`ParkedOut` / :class:`EvictedOut` from anywhere until the end);
- :class:`Commit`: journal a record, then :class:`Committed`;
- :class:`StopWatch`: stop watching the inbox, then :class:`WatchStopped`;
- :class:`RunCompensations`: then :class:`CompensationsRan` or
  :class:`CompensationsBroken`;
- the others need no answer: :class:`Log`, :class:`Project` (the index entry),
  :class:`Unmark`, :class:`ClearUnstarted`, :class:`Flush`, :class:`CancelChildren`,
  :class:`NotifyParent`; and the last: :class:`Finish` (how the activation left) or
  :class:`Reraise` (the exception the driver caught leaves the actor).

A cancel read while the code runs is fed as :class:`CancelRead` at any time. The
commands and events are in :mod:`fusee.runtime.life_events`.
``tests/unit/test_run_life.py`` drives this with every order and combination of its
events; ``tests/unit/test_life_machine.py`` runs the whole driver over a store that dies.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from fusee.runtime.durations import format_duration
from fusee.runtime.history import History
from fusee.runtime.inbox import Resume
from fusee.runtime.index import UNREAD, IndexEntry, decode_info, info_from_history
from fusee.runtime.life_events import (
    Broken,
    CancelChildren,
    CancelRead,
    ClearUnstarted,
    CodeEnded,
    Command,
    Commit,
    Committed,
    CompensationsRan,
    Continued,
    Event,
    EvictedOut,
    Execute,
    Finish,
    Flush,
    IndexRead,
    Left,
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
from fusee.runtime.records import (
    AnyRecord,
    RunCancelled,
    RunCompleted,
    RunContinued,
    RunFailed,
    RunPaused,
    RunResumed,
)

__all__ = ("RunLife", "live_children", "END_STATUS")


def _resumes(history: History, msg: Resume) -> bool:
    """Whether the resume message ``msg`` resumes the run as read: it forces past a
    break of the chain that the load accepted for it and no journaled resume did yet
    (whatever pause the journal then ends at: a step's pause before the break, which
    the message, sent while the break hid it, names as 0), or it names the pause the
    journal ends paused at. Any other (a second resume of a pause resumed already, one
    of an earlier pause) is stale: ignored."""
    if history.ended:
        return False
    if msg.force and history.pending_force:
        return True
    if history.paused is not None:
        return msg.paused == history.paused_seq and history.paused_seq > 0
    return False


def _cancel_ends(paused: RunPaused | None) -> bool:
    """Whether a cancel read with the pause ``paused`` is carried out at once: any but
    one made while a cancel was being carried out (its code or compensations did not
    match), which waits for an operator's resume (the cancel is carried out then)."""
    return paused is not None and not isinstance(paused.cancelling, str)


def live_children(history: History) -> list[str]:
    """The IDs of the children the run started and has not seen end."""
    return [
        w.name
        for pos, w in sorted(history.waits.items())
        if w.wait == "child" and not history.is_resolved(pos)
    ]


END_STATUS: dict[type, str] = {
    RunCompleted: "completed",
    RunFailed: "failed",
    RunCancelled: "cancelled",
}

# what the machine waits for
_Phase = Literal[
    "begin",  # nothing asked yet
    "load",  # Loaded / LoadFailed
    "index",  # IndexRead
    "code",  # how the code ended (or it parked / was evicted)
    "commit",  # Committed, of self._record
    "watch",  # WatchStopped
    "compensate",  # CompensationsRan / CompensationsBroken
    "done",  # nothing more: the activation left
]


class RunLife:
    """One activation of a run, from its journal read to how it leaves.

    ``always_replay``: an eviction is replayed here from the journal (the forced-replay
    mode), not raised out of the actor. Call :meth:`begin`, then :meth:`feed` each
    answer with the time it came (``now``: the index entry's time, a continued run's)."""

    def __init__(self, *, always_replay: bool = False) -> None:
        self.always_replay = always_replay
        self.cancel_reason: str | None = None  # the run is being cancelled (and why)
        self.history = History("")
        self._first = True  # no activation line logged yet
        self._phase: _Phase = "begin"
        self._record: AnyRecord | None = None  # the end being committed, or made
        self._paused: str | None = None  # a reason to pause, once the watch stopped
        self._loaded_event: Loaded | None = None  # the last activation's read
        self._resuming = False  # (a cancel read with the resume is new)
        self._forgiving = False  # the journal was read again for a cancel, breaks taken
        self._unreplayed = False  # a cancel ends the run without its code (nor compensations)

    def begin(self) -> list[Command]:
        self._expect("begin")
        self._phase = "load"
        return [Load()]

    def feed(self, event: Event, now: float) -> list[Command]:
        """The next commands, given what the last one brought (``event``)."""
        if isinstance(event, CancelRead):
            return self._cancel_read(event.reason)
        if isinstance(event, Loaded):
            self._expect("load")
            return self._loaded(event, now)
        if isinstance(event, LoadFailed):
            self._expect("load")
            self.history = event.history
            if event.cancel is not None and self.cancel_reason is None:
                self.cancel_reason = event.cancel or "cancelled"
            if self.cancel_reason is not None and event.last > 0 and not self._forgiving:
                # cancelled: read again taking every break as it is, to end it there
                self._forgiving = True
                return [Load(forgive=event.last)]
            # Nothing else is appended after a broken chain: an operator looks first.
            return [
                Log("error", "run.paused", {"reason": event.reason}),
                *self._project(now, reason=event.reason, paused=True, leaving=True),
                self._finish("paused"),
            ]
        if isinstance(event, IndexRead):
            self._expect("index")
            return self._index_read(event.entry, now)
        if isinstance(event, PausedOut):
            if self._phase != "code":
                raise ValueError(f"PausedOut while the machine waits for {self._phase}")
            record = self._record = event.record
            self._phase = "commit"
            return [
                Log(
                    "error",
                    "run.paused",
                    {"reason": record.reason, "step": record.step, "attempts": record.attempts},
                ),
                Commit(record),
            ]
        if isinstance(event, ParkedOut | EvictedOut):
            if self._phase not in ("code", "commit", "watch", "compensate"):
                raise ValueError(
                    f"{type(event).__name__} while the machine waits for {self._phase}"
                )
            if isinstance(event, ParkedOut):
                return [
                    Log("info", "run.parked"),
                    *self._project(now, waiting=True),
                    self._finish("parked"),
                ]
            if not self.always_replay:
                self._phase = "done"
                return [Reraise()]
            self._phase = "load"  # replay from the journal, as a new worker would
            return [Load()]
        if isinstance(event, Returned | Continued | Raised | Broken | Stopped):
            self._expect("code")
            return self._code_ended(event, now)
        if isinstance(event, Committed):
            self._expect("commit")
            return self._committed(now)
        if isinstance(event, WatchStopped):
            self._expect("watch")
            return self._watch_stopped(now)
        if isinstance(event, CompensationsRan):
            self._expect("compensate")
            out: list[Command] = []
            if event.failed:
                out.append(
                    Log(
                        "warning",
                        "run.compensations_failed",
                        {
                            "steps": [step for step, _ in event.failed],
                            "errors": [error for _, error in event.failed],
                        },
                    )
                )
            assert self._record is not None
            return out + self._end(self._record)
        self._expect("compensate")
        return self._pause(event.reason)

    # -- activation -------------------------------------------------------------------

    def _loaded(self, event: Loaded, now: float) -> list[Command]:
        history = self.history = event.history
        self._loaded_event = event
        new_cancel = event.cancel is not None and self.cancel_reason is None
        if new_cancel:
            self.cancel_reason = event.cancel or "cancelled"
        started = history.started
        if started is None:
            self._phase = "index"
            return [ReadIndex()]
        if history.ended:
            # again: its parent may not have heard, its children not been cancelled
            return [
                *self._end_notices(),
                *self._project(now, leaving=True),
                self._finish("ended"),
            ]
        if history.cancel_forced:
            # a cancel's forced resume landed and its end did not: ended so, no code
            # runs over the broken journal (records are missing)
            self.cancel_reason = self.cancel_reason or "cancelled"
            return [
                Log(
                    "info",
                    "run.cancelling",
                    {"reason": self.cancel_reason, "compensations": "not run: paused"},
                ),
                # (the paused listing goes with the end: the resume's may not have)
                *self._end(RunCancelled(reason=self.cancel_reason), unlist=started.workflow),
            ]
        if self.cancel_reason is not None and (
            _cancel_ends(history.paused) or history.pending_force
        ):
            return self._cancel_paused(new_cancel)
        resume = event.resume
        if resume is not None and _resumes(history, resume[1]):
            # journaled first: a crash after it runs on; before it, reads it again
            seq, msg = resume
            self._record = RunResumed(
                paused=history.paused_seq if history.paused is not None else 0,
                inbox_seq=seq,
                force=msg.force and history.pending_force,
                gap=history.forgive if msg.force else 0,
            )
            self._phase = "commit"
            self._resuming = new_cancel
            return [
                Log("info", "run.resuming", {"paused": self._record.paused, "force": msg.force}),
                Commit(self._record, unlist=started.workflow),
            ]
        if history.paused is not None:
            out: list[Command] = []
            if resume is not None:  # stale: said, so an operator sees why nothing ran
                out.append(
                    Log(
                        "info",
                        "run.resume_ignored",
                        {"paused": history.paused_seq, "names": resume[1].paused},
                    )
                )
            return [*out, *self._project(now, leaving=True), self._finish("paused")]
        return self._activate(event, new_cancel, now)

    def _cancel_paused(self, new_cancel: bool) -> list[Command]:
        """A cancel read with (or after) a pause: the run is not left paused. A step's
        pause is resumed to be cancelled (replayed to that step, where it stops and
        runs its compensations). A run paused by its code or its journal cannot be
        replayed safely (its code does not match, or records are missing): it ends
        cancelled without running code, its compensations not run; a broken chain
        is first accepted as it is (a forced ``run.resumed`` with no inbox message),
        so readers get past it (a death before its end: ``History.cancel_forced``).
        (A pause made while a cancel was carried out does not come here: it waits for
        an operator's resume, see :meth:`_pause`.)"""
        history = self.history
        paused = history.paused
        forced = history.pending_force
        assert history.started is not None
        # the run's paused listing entry goes with the first write, as a resume's does
        unlist = history.started.workflow
        self._phase = "commit"
        if paused is not None and paused.cause == "retries" and not forced:
            self._record = RunResumed(paused=history.paused_seq)
            self._resuming = new_cancel
            return [
                Log("info", "run.resuming", {"paused": history.paused_seq, "cancel": True}),
                Commit(self._record, unlist=unlist),
            ]
        out: list[Command] = [
            Log(
                "info",
                "run.cancelling",
                {"reason": self.cancel_reason, "compensations": "not run: paused"},
            )
        ]
        if forced:
            self._unreplayed = True
            self._record = RunResumed(
                paused=history.paused_seq if paused is not None else 0,
                force=True,
                gap=history.forgive,
            )
            return [*out, Commit(self._record, unlist=unlist)]
        assert self.cancel_reason is not None
        return [*out, *self._end(RunCancelled(reason=self.cancel_reason), unlist=unlist)]

    def _activate(self, event: Loaded, new_cancel: bool, now: float) -> list[Command]:
        history = self.history
        started = history.started
        assert started is not None
        out: list[Command] = []
        if new_cancel:  # (an ended or paused run is not cancelled: nothing said)
            out.append(Log("info", "run.cancelling", {"reason": self.cancel_reason}))
        # A cancel (read with the journal, or before an eviction) is carried out by
        # replaying the workflow to where it stopped, to run its compensations.
        if not event.registered and self.cancel_reason is not None:
            # nobody here can replay it: it ends without its compensations
            return out + self._end(RunCancelled(reason=self.cancel_reason))
        if not event.registered:
            reason = (
                f"no workflow named {started.workflow!r} is registered at "
                f"this worker (it has: {', '.join(event.workflows) or 'none'})"
            )
            return [
                *out,
                Log("error", "run.unrunnable", {"reason": reason}),
                *self._project(now, reason=reason),
                self._finish("unrunnable"),
            ]
        if self._first:
            # (no index entry: ``describe()`` says running while its partition has an
            # owner, see "Writes per run")
            self._first = False
            out.append(
                Log(
                    "info",
                    "run.resumed" if history.size > 1 else "run.started",
                    {"workflow": started.workflow, "steps": len(history.outcomes)},
                )
            )
        self._phase = "code"
        self._record = self._paused = None
        remaining = None
        if started.timeout is not None:
            remaining = max(0.0, started.started_at + started.timeout - now)
        return [*out, Execute(cancelled=self.cancel_reason is not None, remaining=remaining)]

    def _index_read(self, entry: IndexEntry | None, now: float) -> list[Command]:
        if entry is None or not entry[0]:
            # a marker left by a start that never happened, or a message to a run that
            # starts now: its marker goes unless it started
            return [ClearUnstarted(), self._finish("ended")]
        # Indexed but no journal: it was purged or lost. Say so, loudly.
        reason = (
            f"the journal of run {self.history.run_id!r} is gone (purged or lost) "
            f"while the run index still lists it"
        )
        info = decode_info(entry[0])
        info.status, info.reason, info.updated_at = "paused", reason, now
        project = Project(info, unmark=True, journal_seq=entry[1], current=entry)
        return [Log("error", "run.paused", {"reason": reason}), project, self._finish("paused")]

    def _cancel_read(self, reason: str) -> list[Command]:
        if self._phase == "done":
            raise ValueError("a cancel read after the activation left")
        if self.cancel_reason is not None:
            return []
        self.cancel_reason = reason or "cancelled"
        return [Log("info", "run.cancelling", {"reason": self.cancel_reason})]

    # -- the code's end -----------------------------------------------------------------

    def _code_ended(self, event: CodeEnded, now: float) -> list[Command]:
        started = self.history.started
        assert started is not None
        if isinstance(event, Returned):
            # Committed before the watch is stopped: stopping it waits for its task to
            # end (a trip through the event loop), and that need not come before the
            # result. A cancel read meanwhile changes nothing: a completed run stays
            # completed (its code's scope is closed).
            self._record = RunCompleted(result=msgspec.Raw(event.result))
            self._phase = "commit"
            return [Commit(self._record)]
        if isinstance(event, Broken):
            self._paused = event.reason
        elif isinstance(event, Continued):
            self._record = RunContinued(
                workflow=started.workflow,
                input=msgspec.Raw(event.input),
                started_at=started.started_at,
                timeout=started.timeout,
                partition=started.partition,
                parent=started.parent,
                generation=self.history.generation + 1,
                continued_at=now,
                steps=(
                    self.history.steps_before + self.history.step_positions()
                    if event.count_steps
                    else msgspec.UNSET
                ),
            )
        elif isinstance(event, Raised):
            self._record = RunFailed(
                error_type=event.error_type, message=event.message, step=event.step
            )
        elif self.cancel_reason is not None:
            self._record = RunCancelled(reason=self.cancel_reason)
        elif started.timeout is not None:
            self._record = RunCancelled(
                reason=f"timeout: the run took longer than {format_duration(started.timeout)}"
            )
        else:  # stopped where its compensations began, its cancel no longer in the inbox
            self._record = RunCancelled(reason="cancelled")
        self._phase = "watch"
        return [StopWatch()]

    def _watch_stopped(self, now: float) -> list[Command]:
        record = self._record
        if isinstance(record, RunCompleted):  # committed already
            return self._ended(record, now)
        if self._paused is not None:
            return self._pause(self._paused)
        assert record is not None
        # a cancel read until the watch stopped wins over anything but a completed or
        # failed run (a continued one included)
        if self.cancel_reason is not None and not isinstance(record, RunFailed):
            record = self._record = RunCancelled(reason=self.cancel_reason)
        if not isinstance(record, RunContinued):
            # Outside the workflow's scope: neither a cancel nor the run's timeout stops them.
            self._phase = "compensate"
            return [RunCompensations()]
        return self._end(record)

    def _end(self, record: AnyRecord, *, unlist: str | None = None) -> list[Command]:
        """Commit the end ``record`` (``unlist``: the workflow of a run ended from a
        pause, whose paused listing entry goes in the same write)."""
        self._record = record
        self._phase = "commit"
        # A continued one ends this generation and starts the next in one record (a crash
        # before it lands replays this generation; after it, the next one starts from the
        # journal). Nothing in the next generation waits for the children.
        if isinstance(record, RunContinued) and live_children(self.history):
            return [
                Flush(),  # a message to another inbox: on durable waits only
                CancelChildren(f"parent {self.history.run_id!r} continued as new"),
                Commit(record),
            ]
        return [Commit(record, unlist=unlist)]

    def _committed(self, now: float) -> list[Command]:
        record = self._record
        if isinstance(record, RunCompleted):
            self._phase = "watch"
            return [StopWatch()]
        if isinstance(record, RunContinued):
            self._phase = "load"  # its next generation, read back from the journal
            return [Log("info", "run.continued", {"generation": record.generation}), Load()]
        if isinstance(record, RunPaused):
            if self.cancel_reason is not None and record.cause == "retries":
                # a cancel was read before a step's pause landed: it is not left paused
                # (read again from the journal, as a new activation would). A pause of
                # the code made while cancelling (``cancelling``) stays, for an operator.
                self._phase = "load"
                return [Load()]
            return [*self._project(now, leaving=True), self._finish("paused")]
        if isinstance(record, RunResumed) and self._unreplayed:
            assert self.cancel_reason is not None
            return self._end(RunCancelled(reason=self.cancel_reason))
        if isinstance(record, RunResumed):
            assert self._loaded_event is not None
            self._phase = "load"  # (as if just loaded, the pause gone)
            return self._activate(self._loaded_event, self._resuming, now)
        assert record is not None
        return self._ended(record, now)

    def _ended(self, record: AnyRecord, now: float) -> list[Command]:
        """After the end ``record`` landed."""
        fields: dict[str, Any] = {}
        if isinstance(record, RunFailed):
            fields = {"error": f"{record.error_type}: {record.message}", "step": record.step}
        elif isinstance(record, RunCancelled):
            fields = {"reason": record.reason}
        return [
            Log("info", f"run.{END_STATUS[type(record)]}", fields),
            *self._end_notices(),
            # the end just landed: no index entry can say more (nothing to read first)
            *self._project(now, leaving=True, fresh=True),
            self._finish("ended"),
        ]

    def _pause(self, reason: str) -> list[Command]:
        """Pause the run (its code or compensations do not match its journal); made
        while a cancel is carried out, the pause says so (``cancelling``): the cancel
        waits for an operator's resume, not to skip the compensations."""
        cancelling = msgspec.UNSET if self.cancel_reason is None else self.cancel_reason
        self._record = RunPaused(reason=reason, cancelling=cancelling)
        self._phase = "commit"
        return [Log("error", "run.paused", {"reason": reason}), Commit(self._record)]

    def _end_notices(self) -> list[Command]:
        """An ended run cancels the children it still waited for, and a child tells its
        parent how it ended. Both are idempotent: an ended run activated again (its
        worker died before they were sent) sends them again."""
        end = self.history.end
        if end is None:
            return []
        out: list[Command] = []
        if live_children(self.history):
            reason = f"parent {self.history.run_id!r} {END_STATUS[type(end)]}"
            if isinstance(end, RunCancelled):
                reason += f": {end.reason}"
            out.append(CancelChildren(reason))
        return [*out, NotifyParent()]

    # -- helpers ----------------------------------------------------------------------

    def _project(
        self,
        now: float,
        *,
        reason: str | None = None,
        paused: bool = False,
        waiting: bool = False,
        leaving: bool = False,
        fresh: bool = False,
    ) -> list[Command]:
        """The run's index entry; ``leaving``: the run ends or pauses here, and its
        active marker goes too (in the same write for an end)."""
        if self.history.started is None:
            return [Unmark()] if leaving else []
        info = info_from_history(self.history, now=now, running=False)
        if reason is not None:
            info.reason = reason
        if paused:
            info.status = "paused"
        elif waiting and not info.ended:
            info.status = "waiting"
        return [Project(info, unmark=leaving, current=None if fresh and info.ended else UNREAD)]

    def _finish(self, outcome: Left) -> Finish:
        self._phase = "done"
        return Finish(outcome)

    def _expect(self, phase: _Phase) -> None:
        if self._phase != phase:
            raise ValueError(f"the machine waits for {self._phase}, not {phase}")
