"""``ctx.all`` / ``ctx.race`` settling, sans I/O: which branch's end is taken, and when.

Each branch of a combinator runs as a task of its own (``actors/combinators.py``); the
order their ends come in is the event loop's, not the journal's: on replay every
journaled branch ends at once. So ends are taken in journal order, the sequence of
the record that ended each branch: a branch that ended is taken only once no branch
still running ended earlier in the journal. The first end taken that decides (a race's
winner, an ``all``'s first failure, a journaled cancel of the whole combinator, a
branch that makes the run leave) settles it, the same way live and on replay.
``tests/unit/test_settle.py`` checks that every arrival order settles the same way.

:func:`may_park` is the parking rule inside combinators: a wait that found nothing
parks the run only once every other branch (up the tree of nested combinators) waits
too, since a branch running a step keeps the run in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from fusee.runtime.history import History

__all__ = ("BranchState", "Ended", "Settle", "journaled_end", "may_park", "positions")


class Ended(Enum):
    """How a branch ended, as far as settling cares."""

    VALUE = "value"
    ERROR = "error"  # its call raised an exception
    CANCELLED = "cancelled"  # the journal says this whole combinator lost a race (replay)
    LEFT = "left"  # it raised what makes the run leave (parked, evicted, fenced)


@dataclass(eq=False)
class BranchState:
    """One branch of a combinator: the positions its call took, the branches of a
    combinator nested in it, and how far it got."""

    index: int
    siblings: list[BranchState]
    parent: BranchState | None = None  # the branch the combinator itself runs in
    positions: list[tuple[int, str, str]] = field(default_factory=list)  # pos, call, name
    inner: list[BranchState] | None = None
    idle: bool = False  # waiting, and would park the run
    ended: Ended | None = None
    taken: bool = False  # its end was taken, in journal order

    def is_idle(self) -> bool:
        if self.ended is not None or self.idle:
            return True
        return self.inner is not None and all(b.is_idle() for b in self.inner)


def positions(branch: BranchState) -> list[tuple[int, str, str]]:
    """The positions of the branch and of the combinators nested in it."""
    found = list(branch.positions)
    for b in branch.inner or ():
        found.extend(positions(b))
    return found


def journaled_end(history: History, branch: BranchState) -> int | None:
    """The journal sequence of the record that ended the branch (its last end, not
    counting cancellations), if the journal holds one."""
    ends = [
        history.ends[p]
        for p, _, _ in positions(branch)
        if p in history.ends and p not in history.cancelled
    ]
    if branch.positions and all(p in history.cancelled for p, _, _ in branch.positions):
        return min(history.ends[p] for p, _, _ in branch.positions)
    return max(ends) if ends else None


def _end_seq(history: History, branch: BranchState) -> int:
    # A branch that ended with nothing journaled ended before it awaited anything (a
    # wrong argument): first, on replay too.
    seq = journaled_end(history, branch)
    return 0 if seq is None else seq


class Settle:
    """Feed it each branch as it ends (:meth:`ended`); it answers the branch that
    decides the combinator, ``None`` while none does yet. :attr:`over` once every end
    was taken without one deciding."""

    def __init__(
        self,
        history: History,
        branches: list[BranchState],
        *,
        race: bool,
        return_exceptions: bool,
    ) -> None:
        self.history = history
        self.branches = branches
        self.race = race
        self.return_exceptions = return_exceptions
        self._finished: list[BranchState] = []
        self._left = len(branches)

    @property
    def over(self) -> bool:
        return self._left == 0

    def ended(self, branch: BranchState) -> BranchState | None:
        assert branch.ended is not None
        finished = self._finished
        finished.append(branch)
        while True:
            for b in finished:
                if b.ended is Ended.LEFT:
                    return b  # the run leaves, whatever the journal order
            todo = [b for b in finished if not b.taken]
            if not todo:
                return None
            first = min(todo, key=lambda b: _end_seq(self.history, b))
            seq = _end_seq(self.history, first)
            if any(
                b not in finished and (j := journaled_end(self.history, b)) is not None and j < seq
                for b in self.branches
            ):
                return None  # a branch that ended earlier in the journal still replays
            first.taken = True
            self._left -= 1
            if first.ended is Ended.CANCELLED:
                return first
            if self.race:
                return first  # the winner
            if first.ended is Ended.ERROR and not self.return_exceptions:
                return first


def may_park(branch: BranchState | None, *, idle: bool = True) -> bool:
    """Whether a wait that found nothing may park the run, in ``branch`` (None:
    outside any combinator, always). ``idle=False`` says the branch is busy again."""
    if branch is None:
        return True
    branch.idle = idle
    b: BranchState | None = branch
    while idle and b is not None:
        if not all(s.is_idle() for s in b.siblings if s is not b):
            return False
        b = b.parent
    return idle
