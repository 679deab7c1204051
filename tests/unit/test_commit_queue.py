"""Group commit, driven with every order of appends, sends, appenders leaving and a
closing connection.

The pure queue (``fusee.runtime.commits``) decides which record goes out alone and
which waits for the committer; the model around it is the adapter's shape
(``adapters/jetstream/commit.py``): an appender sends its own record alone, or waits
for the committer, a task of its own started by the appender that found no committer.
Appenders leave at any point (a run's cancel, its timeout): one that leaves a lone send
takes its record away, one that waits leaves its record to the committer. Invariants:

- a record is sent once at most (never alone and in a batch, never in two batches);
- nothing waits silently: while records are queued, a committer runs;
- every record gets one outcome, its own: once the sends in flight end, every record
  of an appender that did not leave a lone send is stored or failed (closed), whoever
  else left.

The defect of issue 9 is put back: the first appender to queue runs the committer in
its own task, so when it leaves, the lot it was sending, and the queue, are lost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fusee.runtime.commits import CommitQueue, Route

APPENDERS = 6


@dataclass
class Model:
    plan: CommitQueue[int] = field(default_factory=lambda: CommitQueue(direct_limit=2, max_batch=3))
    state: dict[int, str] = field(default_factory=dict)  # appender: alone | waiting | left | done
    alone: set[int] = field(default_factory=set)  # lone sends in flight
    committer: int | None = None  # who runs it: -1 its own task, else the appender's
    sending: list[int] | None = None  # the committer's lot in flight
    sent: list[int] = field(default_factory=list)  # every record sent, each time
    outcome: dict[int, str] = field(default_factory=dict)  # record: stored | closed
    cut: set[int] = field(default_factory=set)  # lone sends cut short by their appender
    closed: bool = False


LEADER = False  # the defect, put back by the test that looks for it


class CommitMachine(RuleBasedStateMachine):
    m: Model

    @initialize()
    def begin(self) -> None:
        self.m = Model()

    def _has(self, what: str) -> bool:
        return hasattr(self, "m") and any(s == what for s in self.m.state.values())

    @precondition(lambda self: hasattr(self, "m"))
    @rule(who=st.integers(0, APPENDERS - 1))
    def append(self, who: int) -> None:
        m = self.m
        if who in m.state:
            return
        if m.closed:  # the store refuses it at once
            m.state[who], m.outcome[who] = "done", "closed"
            return
        route = m.plan.offer(who)
        if route is Route.ALONE:
            m.state[who] = "alone"
            m.alone.add(who)
            m.sent.append(who)
            return
        m.state[who] = "waiting"
        if route is Route.START:
            m.committer = who if LEADER else -1

    @precondition(lambda self: hasattr(self, "m") and bool(self.m.alone))
    @rule(data=st.data())
    def lone_send_ends(self, data: st.DataObject) -> None:
        self._lone_send_ends(data.draw(st.sampled_from(sorted(self.m.alone))))

    def _lone_send_ends(self, who: int) -> None:
        m = self.m
        m.alone.discard(who)
        m.plan.sent_alone()
        m.outcome[who] = "stored"
        m.state[who] = "done"

    @precondition(
        lambda self: hasattr(self, "m") and self.m.committer is not None and self.m.sending is None
    )
    @rule()
    def committer_takes_a_lot(self) -> None:
        m = self.m
        lot = m.plan.next_lot()
        if not lot:
            m.committer = None  # the queue is empty: it ends
            return
        m.sending = lot
        m.sent.extend(lot)

    @precondition(lambda self: hasattr(self, "m") and self.m.sending is not None)
    @rule()
    def batch_ends(self) -> None:
        m = self.m
        assert m.sending is not None
        for who in m.sending:
            m.outcome[who] = "stored"
        m.sending = None

    @precondition(lambda self: hasattr(self, "m") and bool(self.m.state))
    @rule(data=st.data())
    def appender_leaves(self, data: st.DataObject) -> None:
        """Cancelled: a lone send is cut short (its own record only); a waiting
        appender stops waiting, its record stays with the committer."""
        m = self.m
        who = data.draw(st.sampled_from(sorted(m.state)))
        if m.state[who] == "alone":
            m.alone.discard(who)
            m.plan.sent_alone()
            m.cut.add(who)
        m.state[who] = "left"
        if m.committer == who:  # the committer ran in its task: it dies with it
            m.committer, m.sending = None, None

    @precondition(lambda self: hasattr(self, "m") and not self.m.closed)
    @rule()
    def connection_closes(self) -> None:
        m = self.m
        m.closed = True
        if m.committer is not None:
            left = [*(m.sending or []), *m.plan.close()]
            for who in left:
                m.outcome.setdefault(who, "closed")
            m.committer, m.sending = None, None

    @invariant()
    def sent_once_at_most(self) -> None:
        if hasattr(self, "m"):
            assert len(self.m.sent) == len(set(self.m.sent)), self.m.sent

    @invariant()
    def nothing_waits_silently(self) -> None:
        if hasattr(self, "m") and self.m.plan.queue:
            assert self.m.committer is not None, f"{self.m.plan.queue} queued, no committer"

    def teardown(self) -> None:
        if not hasattr(self, "m"):
            return
        m = self.m
        for _ in range(100):  # every send in flight ends; the committer runs dry
            if m.alone:
                self._lone_send_ends(min(m.alone))
            elif m.sending is not None:
                self.batch_ends()
            elif m.committer is not None:
                self.committer_takes_a_lot()
            else:
                break
        for who, state in m.state.items():
            if who not in m.cut:  # (a lone send cut short took only itself away)
                assert who in m.outcome, f"record {who} ({state}) never got an outcome"
        assert not m.plan.queue
        assert m.plan.in_flight == 0


SETTINGS = settings(
    max_examples=500,
    stateful_step_count=30,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


def test_every_order_keeps_the_invariants() -> None:
    run_state_machine_as_test(CommitMachine, settings=SETTINGS)


@contextlib.contextmanager
def _leader() -> Iterator[None]:
    global LEADER
    LEADER = True
    try:
        yield
    finally:
        LEADER = False


def test_the_first_appender_sending_the_lot_is_found() -> None:
    with _leader(), pytest.raises(AssertionError):
        run_state_machine_as_test(
            CommitMachine, settings=settings(SETTINGS, phases=[Phase.generate])
        )
