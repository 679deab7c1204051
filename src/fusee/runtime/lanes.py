"""Which task took each position: calls made from concurrent tasks outside ``ctx.all``.

Positions are handed out in the order calls reach ``ctx``. ``ctx.all`` and ``ctx.race``
start their branches one at a time, so that order is the list's on any replay. Tasks
the workflow starts itself (``asyncio.gather``, an anyio task group, a framework's
parallel tool calls) are not sequenced by fusee: on replay a journaled call returns at
once, so a task whose first call was slow live can run ahead of another task and reach
its next call first. Each task is a *lane*; a call's ``after`` is the position its lane
took before (a lane's first call: the last position its parent lane had taken). It is
journaled when it is not ``pos - 1``, and a replay compares it with what the lane took
before there: a call that reaches a position another task took live is caught, not
given that task's result (see "Concurrent calls outside ctx.all" in docs/design.md).

Pure: lane numbers in, ``after`` out. The shell says which lane a call comes from.
"""

from __future__ import annotations

__all__ = ("ROOT", "Lanes")

ROOT = 0  # the lane of the task running the workflow's (or handler's) code


class Lanes:
    """The last position each lane took, for one execution of the code."""

    def __init__(self) -> None:
        self._last: dict[int, int] = {ROOT: 0}
        self._next = ROOT + 1

    def open(self, parent: int) -> int:
        """A task of lane ``parent`` makes its first call: its new lane, whose call
        comes after the last position ``parent`` took."""
        lane = self._next
        self._next += 1
        self._last[lane] = self._last[parent]
        return lane

    def take(self, lane: int, pos: int) -> int:
        """Lane ``lane`` takes ``pos``: the position its call comes after."""
        after = self._last[lane]
        self._last[lane] = pos
        return after
