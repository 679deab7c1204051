"""Calls of ``ctx`` from tasks the workflow starts itself (``asyncio.gather``, an anyio
task group, a framework's parallel tool calls), outside ``ctx.all``: which lane (task)
a call comes from, for the replayer's order check (``runtime/lanes.py``), and what the
actor acts on when such tasks raise through a task group. The steps those tasks run are
``stragglers.Stragglers``.

See "Concurrent calls outside ctx.all" in docs/design.md.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

import anyio

from fusee.actors.combinators import in_branch
from fusee.errors import (
    CommitFailed,
    ContinueAsNew,
    ControlFlow,
    Evicted,
    Fenced,
    Parked,
    StepBudgetExceeded,
    StepPaused,
    Unreplayable,
)
from fusee.runtime.lanes import ROOT, Lanes

__all__ = ("Lane", "enter_root", "lane_of", "control_in")

# what the actor acts on first when tasks of a task group raise several
_PRECEDENCE: tuple[type[ControlFlow], ...] = (
    CommitFailed,
    Fenced,
    Unreplayable,
    StepPaused,
    StepBudgetExceeded,
    ContinueAsNew,
    Evicted,
    Parked,
)


def control_in(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """What the actor must see of ``group``, raised through the code by a task group
    whose tasks made ``ctx`` calls: the control flow in it (the copy leaves memory,
    the run pauses, another worker took it...), else the group itself."""
    found = [e for e in _leaves(group) if isinstance(e, ControlFlow)]
    for kind in _PRECEDENCE:
        for exc in found:
            if isinstance(exc, kind):
                return exc
    return found[0] if found else group


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


@dataclass(frozen=True)
class Lane:
    """The lane of the task that set it (a child task sees its parent's, copied with
    its context, until its own first call)."""

    lanes: Lanes
    lane: int
    task: int


_LANE: ContextVar[Lane | None] = ContextVar("fusee_lane", default=None)


def enter_root(lanes: Lanes) -> None:
    """The task running the code's execution (the workflow, the handler) is its root
    lane: called in that task before the code runs."""
    _LANE.set(Lane(lanes, ROOT, anyio.get_current_task().id))


def lane_of(lanes: Lanes) -> int:
    """The lane of the task making a ``ctx`` call now: its own once it made one, the
    one it was started from before (the call opens its own then). A branch of
    ``ctx.all`` / ``ctx.race`` is in the lane of the code that called the combinator:
    the combinator sequences its branches itself."""
    lane = _LANE.get()
    if lane is None or lane.lanes is not lanes:
        return ROOT  # (no root was entered: one task runs the code)
    if in_branch():
        return lane.lane
    # (1.5 µs a call: asyncio.current_task() is cheaper, but actors/ stay off asyncio)
    task = anyio.get_current_task().id
    if lane.task == task:
        return lane.lane
    own = Lane(lanes, lanes.open(lane.lane), task)
    _LANE.set(own)  # (this task's context only)
    return own.lane
