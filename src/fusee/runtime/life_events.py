"""What a run's life-cycle machine (:mod:`fusee.runtime.run_life`) takes and gives:
the events its driver feeds it (what the last command brought) and the commands it
answers with (what the driver performs, in order)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from fusee.runtime.history import History
from fusee.runtime.inbox import Resume
from fusee.runtime.index import UNREAD, Current, IndexEntry, RunInfo
from fusee.runtime.records import AnyRecord, RunPaused

__all__ = (
    "Left",
    "Command",
    "Load",
    "ReadIndex",
    "ClearUnstarted",
    "Unmark",
    "Project",
    "Log",
    "Execute",
    "Commit",
    "StopWatch",
    "RunCompensations",
    "Flush",
    "CancelChildren",
    "NotifyParent",
    "Finish",
    "Reraise",
    "Event",
    "Loaded",
    "LoadFailed",
    "IndexRead",
    "Returned",
    "Continued",
    "Raised",
    "Broken",
    "Stopped",
    "CodeEnded",
    "ParkedOut",
    "EvictedOut",
    "PausedOut",
    "Committed",
    "WatchStopped",
    "CompensationsRan",
    "CompensationsBroken",
    "CancelRead",
)

Left: TypeAlias = Literal["ended", "paused", "unrunnable", "parked"]
"""How an activation of a run left (a generation that continued goes on in it)."""

# -- commands ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """Read the journal and the inbox (together); answer :class:`Loaded` or
    :class:`LoadFailed`. ``forgive``: every break of the chain at a sequence up to
    this is taken as it is (a cancel of a run whose chain broke ends it)."""

    forgive: int = 0


@dataclass(frozen=True)
class ReadIndex:
    """Read the run's index entry; answer :class:`IndexRead`."""


@dataclass(frozen=True)
class ClearUnstarted:
    """Remove the active marker of a run with no journal, unless it started meanwhile."""


@dataclass(frozen=True)
class Unmark:
    """Remove the run's active marker."""


@dataclass(frozen=True)
class Project:
    """Write the run's index entry ``info`` (compared with what the index holds, never
    going back). ``unmark``: the run leaves the active runs here, its marker goes too.
    ``journal_seq``: the journal record it was made from (None: the last one read or
    written). ``current``: what the index holds, when known (None: nothing to compare
    with, as for an end that just landed; the entry just read), else ``UNREAD``: it is
    read first."""

    info: RunInfo
    unmark: bool = False
    journal_seq: int | None = None
    current: Current = UNREAD


@dataclass(frozen=True)
class Log:
    level: Literal["info", "warning", "error"]
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Execute:
    """Run the workflow's code, watching its inbox for a cancel. ``cancelled``: a cancel
    was read already; the code is replayed to where it stopped (its compensations are
    found so), not run on. ``remaining``: seconds left of the run's timeout (None: it
    has none), after which its code is stopped."""

    cancelled: bool
    remaining: float | None = None


@dataclass(frozen=True)
class Commit:
    """Journal ``record``; answer :class:`Committed` (a fenced commit raises out).
    ``unlist``: the run's workflow, whose paused listing entry is removed in the same
    write (a ``run.resumed``: the run is not paused any more)."""

    record: AnyRecord
    unlist: str | None = None


@dataclass(frozen=True)
class StopWatch:
    """Stop watching the inbox (the code's scope is closed); answer :class:`WatchStopped`."""


@dataclass(frozen=True)
class RunCompensations:
    """Run the compensations the code registered; answer :class:`CompensationsRan` or
    :class:`CompensationsBroken`."""


@dataclass(frozen=True)
class Flush:
    """Journal the waits' ends that ride on the next record (a message to another inbox
    follows)."""


@dataclass(frozen=True)
class CancelChildren:
    """Cancel the children the run started and has not seen end (those not ended)."""

    reason: str


@dataclass(frozen=True)
class NotifyParent:
    """Tell the parent of this ended child how it ended (no parent: nothing)."""


@dataclass(frozen=True)
class Finish:
    """The activation leaves: ``outcome``."""

    outcome: Left


@dataclass(frozen=True)
class Reraise:
    """The exception the driver caught (an eviction outside the forced-replay mode)
    leaves the actor."""


Command: TypeAlias = (
    Load
    | ReadIndex
    | ClearUnstarted
    | Unmark
    | Project
    | Log
    | Execute
    | Commit
    | StopWatch
    | RunCompensations
    | Flush
    | CancelChildren
    | NotifyParent
    | Finish
    | Reraise
)

# -- events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """The journal read (``history``) and the inbox: ``cancel``, the reason of the first
    cancel in it ("": it gives none; None: no cancel). ``registered``: this worker has the run's workflow;
    ``workflows``: the names it has (for the reason it cannot run)."""

    history: History
    cancel: str | None = None
    registered: bool = True
    workflows: tuple[str, ...] = ()
    resume: tuple[int, Resume] | None = None  # the last resume message (inbox seq, it)


@dataclass(frozen=True)
class LoadFailed:
    """The journal's chain is broken (``reason``); ``history``: what was read before.
    ``cancel``: as :class:`Loaded`'s (the inbox was read too); ``last``: the journal's
    last sequence (0: none read)."""

    history: History
    reason: str
    cancel: str | None = None
    last: int = 0


@dataclass(frozen=True)
class IndexRead:
    entry: IndexEntry | None


@dataclass(frozen=True)
class Returned:
    """The workflow returned ``result`` (encoded)."""

    result: bytes


@dataclass(frozen=True)
class Continued:
    """The workflow returned ``ctx.continue_as_new`` with ``input`` (encoded).
    ``count_steps``: its workflow has a ``max_steps``, so the next generation is told
    how many steps the run journaled so far."""

    input: bytes
    count_steps: bool = False


@dataclass(frozen=True)
class Raised:
    """The workflow raised: its own error, journaled."""

    error_type: str
    message: str
    step: str | None = None


@dataclass(frozen=True)
class Broken:
    """The code no longer matches its journal, or the journal cannot be read back."""

    reason: str


@dataclass(frozen=True)
class Stopped:
    """The code's scope was cancelled: by a cancel, or by the run's timeout."""


CodeEnded: TypeAlias = Returned | Continued | Raised | Broken | Stopped


@dataclass(frozen=True)
class ParkedOut:
    """The code left memory to wait (``Parked``)."""


@dataclass(frozen=True)
class PausedOut:
    """A step's attempts ran out under ``on_exhausted="pause"`` (``StepPaused``): the
    run pauses with ``record``."""

    record: RunPaused


@dataclass(frozen=True)
class EvictedOut:
    """The code was evicted at a step boundary (``Evicted``)."""


@dataclass(frozen=True)
class Committed:
    pass


@dataclass(frozen=True)
class WatchStopped:
    pass


@dataclass(frozen=True)
class CompensationsRan:
    """``failed``: ``(step, "ErrorType: message")`` of those that failed for good."""

    failed: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CompensationsBroken:
    reason: str


@dataclass(frozen=True)
class CancelRead:
    """The inbox watch read a cancel (``reason``; "": it gives none) while the code ran."""

    reason: str


Event: TypeAlias = (
    Loaded
    | LoadFailed
    | IndexRead
    | CodeEnded
    | ParkedOut
    | EvictedOut
    | PausedOut
    | Committed
    | WatchStopped
    | CompensationsRan
    | CompensationsBroken
    | CancelRead
)
