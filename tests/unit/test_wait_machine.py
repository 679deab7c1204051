"""The waits' pure machine, driven with every order of what can happen around it.

A run waits for signals and sleeps, one wait after another. Around its machine
(``fusee.runtime.waits``): an inbox that anyone appends to, the worker's inbox consumer
that hands each message to the actor (or drops it when its queue is full), the actor's
reads, the timer schedules, the commits in flight, parking and the re-read that follows
it, reconciles, crashes of the worker (a commit in flight may have landed) and the
clock. Hypothesis picks the order; the invariants are what users rely on:

- nothing is appended twice: an inbox message is taken by one wait at most, a wait ends
  once, and a signal goes to a wait of its name;
- no signal is left unread while the run waits for it: an actor that sleeps (or
  leaves) has nothing in what it read, when it decided so, that ends its wait;
- nothing waits silently: a parked run with news has something in flight that brings
  it back;
- a run that can progress does: once everything in flight is delivered (no more drops),
  a wait with its signal in the inbox ends, a sleep ends at its time, and a run whose
  waits all can end, ends.

The defects the issue "Core correctness" fixed are put back one at a time
(``MUTANTS``), and the machine must find each.
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

from fusee.runtime import waits
from fusee.runtime.inbox import InboxMessage, Signal, TimerFired
from fusee.runtime.parking import ParkingLot
from fusee.runtime.records import WaitDone, WaitStarted
from fusee.runtime.waits import Commit, InboxView, Park, SetTimer, Sleep, Wait
from tests.machines import machine_settings

EID = "r-1"
PARTITION = 0
START = 1  # the journal sequence of run.started: its generation
PARK_AFTER = 1.0

Plan = tuple[
    str, str, float | None
]  # (wait, name, timeout): ("signal", "a", 5.0), ("sleep", "", 2.0)


@dataclass
class Actor:
    """The run's actor in memory: what it read, and where its current wait is."""

    view: InboxView
    wait: Wait | None = None
    status: str = "deciding"  # deciding | timer | commit | sleeping | leaving | ended
    cmd: Any = None  # the command being performed
    woken: bool = False  # the worker said the inbox may hold something new


@dataclass
class World:
    seq: int = START  # one stream: the journal's and the inbox's sequences interleave
    inbox: list[tuple[int, InboxMessage]] = field(default_factory=list)
    started: dict[int, WaitStarted] = field(default_factory=dict)  # journaled wait.started
    done: dict[int, WaitDone] = field(default_factory=dict)  # journaled wait.done
    timers: dict[int, float] = field(default_factory=dict)  # scheduled, not fired
    deliveries: list[tuple[int, InboxMessage]] = field(default_factory=list)  # the consumer's
    lot: ParkingLot = field(default_factory=ParkingLot)
    actor: Actor | None = None
    rereading: int | None = None  # the worker reads the inbox above this after a park
    # a reconcile's reads, answered when they were made: (eid, left_at, news), covered
    rechecking: tuple[list[tuple[str, int, bool]], int] | None = None
    now: float = 1000.0

    def store(self, msg: InboxMessage) -> None:
        self.seq += 1
        self.inbox.append((self.seq, msg))
        self.deliveries.append((self.seq, msg))

    @property
    def consumed(self) -> set[int]:
        return {d.inbox_seq for d in self.done.values() if d.inbox_seq}


class WaitMachine(RuleBasedStateMachine):
    plan: list[Plan]
    world: World

    @initialize(
        plan=st.lists(
            st.one_of(
                st.tuples(
                    st.just("signal"),
                    st.sampled_from(["a", "b"]),
                    st.one_of(st.none(), st.sampled_from([0.5, 3.0])),
                ),
                st.tuples(st.just("sleep"), st.just(""), st.sampled_from([0.5, 2.0])),
            ),
            min_size=1,
            max_size=3,
        ),
        parked=st.booleans(),
    )
    def begin(self, plan: list[Plan], parked: bool) -> None:
        self.plan = plan
        self.world = World()
        self._activate()
        if parked:  # (most runs that wait are parked: start from there too)
            for _ in range(4):
                if self._is("timer"):
                    self.timer_scheduled(reads=False)
                if self._is("sleeping"):
                    self.idle()
            if self._is("leaving"):
                self.parked()
                self.reread()

    # -- the actor ------------------------------------------------------------------

    def _activate(self) -> None:
        """A worker activates the run: it reads its inbox, replays its journal, and its
        code reaches the first wait without a ``wait.done``."""
        w = self.world
        actor = Actor(view=InboxView())
        self._read(actor)
        w.actor = actor
        self._next_wait(actor)

    def _next_wait(self, actor: Actor) -> None:
        w = self.world
        pos = len(w.done) + 1
        if pos > len(self.plan):
            actor.status, actor.wait = "ended", None
            return
        kind, name, timeout = self.plan[pos - 1]
        started = w.started.get(pos)
        if started is None:  # journaled when the code first reaches it (replayed after)
            until = None if timeout is None else w.now + timeout
            started = WaitStarted(pos=pos, name=name or "sleep", wait=kind, until=until)
            w.seq += 1
            w.started[pos] = started
        actor.wait = Wait(started, park_after=PARK_AFTER, now=w.now)
        actor.status, actor.cmd = "deciding", None
        self._decide()

    def _read(self, actor: Actor) -> None:
        for seq, msg in self.world.inbox:
            if seq > actor.view.seen:
                actor.view.read(seq)
                actor.view.add(seq, msg)
        actor.woken = False
        self._wake_sleeper()

    def _in_memory(self, *statuses: str) -> Actor | None:
        actor = self.world.actor
        if actor is not None and (not statuses or actor.status in statuses):
            return actor
        return None

    def _is(self, *statuses: str) -> bool:
        return hasattr(self, "world") and self._in_memory(*statuses) is not None

    def _decide(self) -> None:
        """The shell asks its wait what to do as soon as an await returns (no window
        here: this is synchronous code)."""
        actor = self._in_memory("deciding")
        if actor is None:
            return
        assert actor.wait is not None
        w = self.world
        cmd = actor.wait.next(
            actor.view, consumed=w.consumed, start=START, now=w.now, may_park=lambda: True
        )
        actor.cmd = cmd
        actor.status = {Commit: "commit", SetTimer: "timer", Sleep: "sleeping", Park: "leaving"}[
            type(cmd)
        ]

    @precondition(lambda self: self._is("timer"))
    @rule(reads=st.booleans())
    def timer_scheduled(self, reads: bool) -> None:
        actor = self._in_memory("timer")
        if actor is None:
            return
        if reads and actor.woken:  # the inbox watcher reads while the schedule is awaited
            self._read(actor)
        assert actor.wait is not None
        self.world.timers[actor.cmd.pos] = actor.cmd.until
        actor.wait.timer_scheduled()
        actor.status = "deciding"
        self._decide()

    @precondition(lambda self: self._is("commit"))
    @rule()
    def commit_acked(self) -> None:
        actor = self._in_memory("commit")
        if actor is None:
            return
        self._land(actor.cmd.done)
        self._next_wait(actor)

    def _land(self, done: WaitDone) -> None:
        w = self.world
        assert done.pos not in w.done, f"wait {done.pos} ended twice"
        w.seq += 1
        w.done[done.pos] = done

    @precondition(
        lambda self: self._is("deciding", "timer", "commit", "sleeping") and self.world.actor.woken
    )
    @rule()
    def read(self) -> None:
        """The actor's inbox watcher reads, once the worker said there is news (it runs
        beside the wait: while a timer is scheduled, a commit is in flight, it sleeps)."""
        actor = self._in_memory("deciding", "timer", "commit", "sleeping")
        if actor is not None and actor.woken:
            self._read(actor)

    def _wake_sleeper(self) -> None:
        """A sleeping wait wakes when the inbox view grew (the read sets its event) or
        its time came."""
        actor = self._in_memory("sleeping")
        if actor is None:
            return
        if actor.view.version != actor.cmd.version or self.world.now >= actor.cmd.until:
            actor.status = "deciding"
            self._decide()

    # -- the worker -----------------------------------------------------------------

    @precondition(lambda self: hasattr(self, "world") and bool(self.world.deliveries))
    @rule(drop=st.booleans())
    def deliver(self, drop: bool) -> None:
        """The worker's inbox consumer hands the next message over (or its queue is
        full, and it drops it)."""
        w = self.world
        if not w.deliveries:
            return
        w.deliveries.pop(0)
        if drop:
            w.lot.dropped()
            return
        w.lot.wake(EID)
        actor = w.actor
        if actor is None:  # not in memory: the wake loop activates it
            self._activate()
        elif actor.status not in ("leaving", "ended"):  # (a leaving actor no longer listens)
            actor.woken = True

    @precondition(lambda self: self._is("leaving"))
    @rule()
    def parked(self) -> None:
        """The worker takes the actor that left: parked first, then its inbox is read."""
        w = self.world
        actor = self._in_memory("leaving")
        if actor is None:
            return
        left_at = actor.cmd.left_at
        w.actor = None
        w.lot.leave(EID, PARTITION, left_at)
        w.rereading = left_at

    @precondition(lambda self: hasattr(self, "world") and self.world.rereading is not None)
    @rule()
    def reread(self) -> None:
        w = self.world
        if w.rereading is None:
            return
        left_at, w.rereading = w.rereading, None
        news = any(seq > left_at for seq, _ in w.inbox)
        if w.lot.looked(EID, left_at, news) and w.actor is None:
            self._activate()

    @rule()
    def reconcile(self) -> None:
        """The balance loop: after a drop it reads every parked inbox (below, in three
        steps: a drop may come while the reads are out); every 5th round pokes the
        actors in memory (a wake hint may have been lost)."""
        w = self.world
        if w.lot.missed and w.rechecking is None:
            parked, covered = w.lot.to_recheck({PARTITION})
            read = [(e, left, any(seq > left for seq, _ in w.inbox)) for e, _, left in parked]
            w.rechecking = (read, covered)
        actor = self._in_memory("deciding", "timer", "commit", "sleeping")
        if actor is not None:
            actor.woken = True

    @precondition(lambda self: hasattr(self, "world") and self.world.rechecking is not None)
    @rule()
    def recheck_reads(self) -> None:
        """The recheck's reads (made when it began) come back, and it is over."""
        w = self.world
        assert w.rechecking is not None
        (read, covered), w.rechecking = w.rechecking, None
        for eid, left_at, news in read:
            if w.lot.looked(eid, left_at, news) and w.actor is None:
                self._activate()
        w.lot.rechecked(True, covered)

    @rule(landed=st.booleans())
    def crash(self, landed: bool) -> None:
        """The worker dies (a commit in flight may have landed); the next owner
        activates every run with a marker, and a parked run keeps its marker."""
        w = self.world
        actor = w.actor
        if actor is not None and actor.status == "commit" and landed:
            self._land(actor.cmd.done)
        if actor is not None and actor.status == "ended":
            return
        w.lot, w.deliveries, w.rereading, w.rechecking = ParkingLot(), [], None, None
        self._activate()

    # -- the world ------------------------------------------------------------------

    @rule(name=st.sampled_from(["a", "b"]), handed=st.sampled_from(["later", "now", "dropped"]))
    def signal(self, name: str, handed: str) -> None:
        """A signal is stored; the worker's consumer hands it over later, at once, or
        drops it (its queue is full)."""
        self.world.store(Signal(name=name))
        if handed != "later":
            self.deliver(drop=handed == "dropped")

    @rule()
    def another_runs_message_dropped(self) -> None:
        """The worker's queue is shared by every run: a drop may be another run's."""
        self.world.lot.dropped()

    @precondition(lambda self: self._is("sleeping"))
    @rule()
    def idle(self) -> None:
        """Time passes until the sleeping wait's deadline (its idle time, or its end)."""
        actor = self._in_memory("sleeping")
        assert actor is not None
        self.world.now = max(self.world.now, actor.cmd.until)
        self._wake_sleeper()

    @rule(dt=st.sampled_from([0.25, 1.0, 2.5]))
    def tick(self, dt: float) -> None:
        self.world.now += dt
        self._wake_sleeper()

    @precondition(
        lambda self: (
            hasattr(self, "world") and any(self.world.now >= u for u in self.world.timers.values())
        )
    )
    @rule()
    def timer_fires(self) -> None:
        w = self.world
        for pos, until in list(w.timers.items()):
            if w.now >= until:
                del w.timers[pos]
                w.store(TimerFired(pos=pos, start=START))

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def nothing_taken_twice(self) -> None:
        if not hasattr(self, "world"):
            return
        taken = [d.inbox_seq for d in self.world.done.values() if d.inbox_seq]
        assert len(taken) == len(set(taken)), f"an inbox message was taken twice: {taken}"
        by_seq = dict(self.world.inbox)
        for done in self.world.done.values():
            if done.inbox_seq:
                msg = by_seq[done.inbox_seq]
                assert isinstance(msg, Signal), (done, msg)
                assert msg.name == done.name, (done, msg)

    @invariant()
    def a_sleeping_wait_has_nothing_to_take(self) -> None:
        actor = self._in_memory("sleeping", "leaving") if hasattr(self, "world") else None
        if actor is None or actor.wait is None:
            return
        if actor.status == "sleeping" and actor.view.version != actor.cmd.version:
            return  # read since it fell asleep: the read woke it (it decides again)
        look = copy.deepcopy(actor.view)  # (resolve claims what it finds)
        found = look.resolve(
            actor.wait.started, consumed=self.world.consumed, start=START, now=self.world.now
        )
        if found is not None and found.inbox_seq:
            raise AssertionError(
                f"wait {found.pos} ({found.name}) {actor.status} with signal "
                f"{found.inbox_seq} read and not taken"
            )

    @invariant()
    def a_parked_run_with_news_is_coming_back(self) -> None:
        """Nothing waits silently: a parked run with a message stored after its last
        read has something in flight that brings it back (a delivery to come, the
        re-read after parking, or a reconcile that reads every parked inbox)."""
        if not hasattr(self, "world"):
            return
        w = self.world
        if not w.lot.is_parked(EID):
            return
        left_at = w.lot.parked[EID][1]
        if not any(seq > left_at for seq, _ in w.inbox):
            return
        coming = w.rechecking is not None and any(e == EID and n for e, _, n in w.rechecking[0])
        assert w.deliveries or w.rereading is not None or w.lot.missed or coming, (
            f"parked at {left_at} with news and nothing to bring it back"
        )

    def teardown(self) -> None:
        if not hasattr(self, "world"):
            return
        self._drain()
        w = self.world
        actor = w.actor
        pos = len(w.done) + 1
        if pos > len(self.plan):
            return  # every wait ended
        kind, name, _ = self.plan[pos - 1]
        assert kind == "signal", f"sleep {pos} never ended ({actor and actor.status})"
        started = w.started.get(pos)
        assert started is not None
        assert started.until is None, f"wait {pos} with a timeout never ended"
        left = [s for s, m in w.inbox if isinstance(m, Signal) and m.name == name]
        untaken = [s for s in left if s not in w.consumed]
        assert not untaken, f"wait {pos} for {name!r} waits while signals {untaken} are stored"

    def _drain(self) -> None:
        """Everything in flight is delivered, read, performed; time passes until no
        deadline is left. A run that can progress must end its waits here."""
        w = self.world
        for _ in range(500):
            if w.actor is not None and w.actor.status == "ended":
                return
            if w.deliveries:
                self.deliver(drop=False)
                continue
            actor = w.actor
            if actor is not None and actor.woken and actor.status != "leaving":
                self.read()
                continue
            if actor is not None and actor.status == "timer":
                self.timer_scheduled(reads=False)
                continue
            if actor is not None and actor.status == "commit":
                self.commit_acked()
                continue
            if actor is not None and actor.status == "leaving":
                self.parked()
                continue
            if w.rereading is not None:
                self.reread()
                continue
            if actor is not None and actor.status == "sleeping":
                w.now = max(w.now, actor.cmd.until)
                self._wake_sleeper()
                continue
            due = list(w.timers.values())
            if due:
                w.now = max(w.now, min(due))
                self.timer_fires()
                continue
            if w.rechecking is not None:
                self.recheck_reads()
                continue
            if w.lot.missed:
                self.reconcile()
                continue
            return
        raise AssertionError("the run never settled")


# -- the defects of "Core correctness", put back -------------------------------------


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _timer_window() -> contextlib.ExitStack[bool | None]:
    """The wait's "changed" event taken after the timer was scheduled: a message read
    meanwhile is taken for seen, and the wait sleeps (then parks) with it unread."""
    real_next = Wait.next
    real_scheduled = Wait.timer_scheduled

    def scheduled(self: Wait) -> None:
        real_scheduled(self)
        self._blind = True  # type: ignore[attr-defined]

    def next_(self: Wait, view: InboxView, **kw: Any) -> waits.WaitCommand:
        if getattr(self, "_blind", False):
            self._blind = False  # type: ignore[attr-defined]
            self._version = view.version
            return Sleep(self._idle_since + self.park_after, view.version)
        return real_next(self, view, **kw)

    stack = contextlib.ExitStack()
    stack.enter_context(_patched(Wait, "timer_scheduled", scheduled))
    stack.enter_context(_patched(Wait, "next", next_))
    return stack


def _no_reread() -> contextlib.AbstractContextManager[None]:
    """A parked actor's inbox is not read again: a message stored after its last read
    and before it was parked reaches nobody."""
    return _patched(ParkingLot, "looked", lambda self, eid, left_at, news: False)


def _drop_forgotten() -> contextlib.AbstractContextManager[None]:
    """A dropped wake-up is not remembered: no reconcile reads the parked inboxes."""
    return _patched(ParkingLot, "dropped", lambda self: None)


def _consumed_ignored() -> contextlib.AbstractContextManager[None]:
    """A wait does not skip the signals the journal shows taken: after a crash (its
    ``wait.done`` landed, the ack lost) the replayed run takes the same signal again."""
    real = InboxView.resolve

    def resolve(self: InboxView, started: WaitStarted, **kw: Any) -> WaitDone | None:
        return real(self, started, **{**kw, "consumed": ()})

    return _patched(InboxView, "resolve", resolve)


def _recheck_forgets() -> contextlib.AbstractContextManager[object]:
    """A drop that comes while a reconcile's reads are out is cleared with them."""

    def rechecked(self: ParkingLot, complete: bool, covered: int) -> None:
        if complete:
            self.missed = False

    return _patched(ParkingLot, "rechecked", rechecked)


MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[object]]] = {
    "a signal taken again after a crash": _consumed_ignored,
    "a signal read while the timer is scheduled": _timer_window,
    "no re-read after parking": _no_reread,
    "a dropped wake-up forgotten": _drop_forgotten,
}

FIND = machine_settings(2000, 15, shrink=False)  # found is enough: no shrinking


def test_every_order_keeps_the_invariants() -> None:
    run_state_machine_as_test(
        WaitMachine,
        settings=settings(
            FIND,
            max_examples=400,
            stateful_step_count=40,
            phases=[Phase.generate, Phase.shrink],
            print_blob=True,
        ),
    )


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_the_machine_finds_each_defect_put_back(mutant: str) -> None:
    with MUTANTS[mutant](), pytest.raises(AssertionError):
        run_state_machine_as_test(WaitMachine, settings=FIND)


def test_an_idle_object_leaves_park_after_its_last_news() -> None:
    idle = waits.Idle(park_after=1.0, now=10.0)
    assert idle.next(version=0, seen=4, now=10.0) == Sleep(11.0, 0)
    assert idle.next(version=0, seen=4, now=10.5) == Sleep(11.0, 0)
    assert idle.next(version=1, seen=5, now=10.9) == Sleep(11.9, 1)  # news: again
    assert idle.next(version=1, seen=6, now=11.9) == Park(6)  # it read up to 6 first


def test_a_drop_during_a_recheck_is_not_cleared_with_it() -> None:
    """The machine above can reach this window (a reconcile's reads out, a drop), but
    rarely within its budget: the rule itself, directly, and the defect put back."""
    for defective in (False, True):
        with _recheck_forgets() if defective else contextlib.nullcontext():
            lot = ParkingLot()
            lot.leave(EID, PARTITION, 5)
            lot.dropped()  # another run's message
            parked, covered = lot.to_recheck({PARTITION})
            assert parked == [(EID, PARTITION, 5)]
            lot.dropped()  # a message for r-1, stored after its inbox was read
            lot.rechecked(True, covered)
            assert lot.missed is not defective  # the next reconcile reads r-1 again
