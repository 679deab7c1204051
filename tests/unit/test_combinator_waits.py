"""Waits inside ``ctx.all`` / ``ctx.race``, driven with every order: a run parks only
when every branch waits with nothing to do and its timer set.

Two or three branches of one combinator each run a wait (``fusee.runtime.waits.Wait``)
over the run's one inbox view; the parking rule among them is
``fusee.runtime.settle.may_park``, which the shell asks the way ``ActorCore.wait_out``
does (only once a branch's idle time ran out). Hypothesis picks the order of each
branch's decisions, timer schedules (which take a while: NATS may be slow), signals
and the clock. Parking cancels every branch where it is, so the properties are:

- a run parks only when no branch is setting its timer: a wait whose timer never
  landed has nothing to wake it at its time;
- a run parks only when no branch has something in what it read that ends its wait.

The review of issue 11 found the first broken (a branch was counted idle as soon as it
decided to set its timer); ``test_the_eager_idle_mark_is_found`` puts that back.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fusee.runtime.inbox import Signal
from fusee.runtime.records import WaitStarted
from fusee.runtime.settle import BranchState, Ended
from fusee.runtime.settle import may_park as settle_may_park
from fusee.runtime.waits import Commit, InboxView, Park, SetTimer, Sleep, Wait, WaitCommand
from tests.machines import machine_settings

START = 1
PARK_AFTER = 1.0

# How the shell asks a branch's wait what to do, given the branch's BranchState: the
# fixed shape passes may_park itself (asked only once the idle time ran out).
Ask = Callable[[Wait, InboxView, BranchState, float], WaitCommand]


def _ask(wait: Wait, view: InboxView, branch: BranchState, now: float) -> WaitCommand:
    return wait.next(
        view,
        consumed=(),
        start=START,
        now=now,
        may_park=lambda: settle_may_park(branch),
    )


ASK: list[Ask] = [_ask]


@dataclass
class Branch:
    state: BranchState
    wait: Wait
    status: str = "deciding"  # deciding | timer | sleeping | done
    cmd: Any = None


@dataclass
class Run:
    view: InboxView = field(default_factory=InboxView)
    branches: list[Branch] = field(default_factory=list)
    timers: set[int] = field(default_factory=set)  # positions whose timer landed
    seq: int = START
    now: float = 1000.0
    parked: bool = False


class CombinatorWaits(RuleBasedStateMachine):
    run: Run

    @initialize(
        waits=st.lists(
            st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([None, 0.5, 5.0])),
            min_size=2,
            max_size=3,
        )
    )
    def begin(self, waits: list[tuple[str, float | None]]) -> None:
        self.run = Run()
        states: list[BranchState] = []
        for i in range(len(waits)):
            states.append(BranchState(i, states))
        for i, (name, timeout) in enumerate(waits):
            until = None if timeout is None else self.run.now + timeout
            started = WaitStarted(pos=i + 1, name=name, wait="signal", until=until)
            wait = Wait(started, park_after=PARK_AFTER, now=self.run.now)
            self.run.branches.append(Branch(states[i], wait))

    def _live(self, *statuses: str) -> list[int]:
        if not hasattr(self, "run") or self.run.parked:
            return []
        return [i for i, b in enumerate(self.run.branches) if b.status in statuses]

    @precondition(lambda self: bool(self._live("deciding")))
    @rule(data=st.data())
    def decide(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self._live("deciding")))
        b = self.run.branches[i]
        cmd = ASK[0](b.wait, self.run.view, b.state, self.run.now)
        b.cmd = cmd
        if isinstance(cmd, Commit):
            b.status = "done"  # it commits and its branch ends
            b.state.ended = Ended.VALUE
        elif isinstance(cmd, SetTimer):
            b.status = "timer"
        elif isinstance(cmd, Sleep):
            b.status = "sleeping"
        elif isinstance(cmd, Park):
            self.run.parked = True  # the run leaves: every branch cancelled where it is

    @precondition(lambda self: bool(self._live("timer")))
    @rule(data=st.data())
    def timer_lands(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(self._live("timer")))
        b = self.run.branches[i]
        self.run.timers.add(b.wait.started.pos)
        b.wait.timer_scheduled()
        b.status = "deciding"

    @precondition(lambda self: bool(self._live("sleeping")))
    @rule(data=st.data())
    def sleeper_wakes(self, data: st.DataObject) -> None:
        """A sleeping branch wakes: its time came (the clock jumps there) or the view
        grew since it fell asleep."""
        i = data.draw(st.sampled_from(self._live("sleeping")))
        b = self.run.branches[i]
        if self.run.view.version == b.cmd.version:
            self.run.now = max(self.run.now, b.cmd.until)
        b.status = "deciding"

    @precondition(lambda self: hasattr(self, "run") and not self.run.parked)
    @rule(name=st.sampled_from(["a", "b"]))
    def signal(self, name: str) -> None:
        run = self.run
        run.seq += 1
        run.view.read(run.seq)
        run.view.add(run.seq, Signal(name=name))

    @precondition(lambda self: hasattr(self, "run"))
    @rule(dt=st.sampled_from([0.25, 1.0]))
    def tick(self, dt: float) -> None:
        self.run.now += dt

    @invariant()
    def parks_only_with_every_timer_set(self) -> None:
        if not hasattr(self, "run") or not self.run.parked:
            return
        for b in self.run.branches:
            started = b.wait.started
            if b.status != "done" and started.until is not None:
                assert started.pos in self.run.timers, (
                    f"parked while wait {started.pos}'s timer was {b.status}: nothing "
                    f"wakes it at its time"
                )

    @invariant()
    def parks_only_with_nothing_to_take(self) -> None:
        if not hasattr(self, "run") or not self.run.parked:
            return
        for b in self.run.branches:
            if b.status == "done":
                continue
            look = copy.deepcopy(self.run.view)
            found = look.resolve(b.wait.started, consumed=(), start=START, now=self.run.now)
            assert found is None or not found.inbox_seq, f"parked with {found} unread"


@contextlib.contextmanager
def _eager_idle() -> Iterator[None]:
    """The defect: may_park asked (marking the branch idle) at every turn, also when the
    wait is about to set its timer."""

    def eager(wait: Wait, view: InboxView, branch: BranchState, now: float) -> WaitCommand:
        answer = settle_may_park(branch)
        return wait.next(view, consumed=(), start=START, now=now, may_park=lambda: answer)

    ASK[0] = eager
    try:
        yield
    finally:
        ASK[0] = _ask


SETTINGS = machine_settings(600, 25)


def test_every_order_parks_only_when_it_may() -> None:
    run_state_machine_as_test(CombinatorWaits, settings=SETTINGS)


def test_the_eager_idle_mark_is_found() -> None:
    with _eager_idle(), pytest.raises(AssertionError):
        run_state_machine_as_test(
            CombinatorWaits, settings=settings(SETTINGS, phases=[Phase.generate])
        )
