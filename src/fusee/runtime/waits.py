"""Waits, sans I/O: what an actor read of its inbox, and what each wait does next.

The async shell (``actors/run_actor.py``) owns no decision here. It feeds what happened
(inbox messages read, the timer scheduled, the time now) and performs the command it
gets back, then asks again:

- :class:`Commit`: the wait is over, journal this ``wait.done``;
- :class:`SetTimer`: schedule the wait's timer, then call :meth:`Wait.timer_scheduled`;
- :class:`Sleep`: nothing to do until the inbox changes past ``version`` or ``until``;
- :class:`Park`: leave memory; whoever parks the actor reads its inbox again above
  ``left_at`` (a message read after it is no longer looked at by this copy).

The windows a shell cannot see (a message read while the timer was being scheduled,
or just as the idle time ran out) are closed here by one rule: every answer is computed
from the view as it is now, and a view that changed since the last answer restarts the
idle time. ``tests/unit/test_wait_machine.py`` drives this code with every order of
reads, timer fires, commits, parks and crashes.

The worker's side (the actors parked, the re-read after parking, dropped wake-ups) is
``runtime/parking.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field

import msgspec

from fusee.runtime.inbox import ChildEnded, Completion, InboxMessage, Signal, TimerFired
from fusee.runtime.records import WaitDone, WaitStarted

__all__ = (
    "InboxView",
    "Wait",
    "Commit",
    "SetTimer",
    "Sleep",
    "Park",
    "WaitCommand",
    "Idle",
    "TIMER_EARLY",
)

# A timer counts as due this much before its time (the clocks of the schedule's server
# and of the worker differ a little; a wait woken by its timer must not sleep again).
TIMER_EARLY = 0.005


@dataclass
class InboxView:
    """What an actor read of its inbox that its waits may take (cancels and
    invocations are the actor's, not kept here).

    ``seen`` is the last inbox sequence read; ``version`` grows with each message kept;
    ``claimed`` are the signals a wait took that are not journaled as taken yet (so a
    concurrent wait of the same name takes the next); ``floor``: signals at or below it
    are not for the running code (an object's invocation takes those sent after it was
    queued)."""

    seen: int = 0
    messages: list[tuple[int, InboxMessage]] = field(default_factory=list)
    version: int = 0
    claimed: set[int] = field(default_factory=set)
    floor: int = 0

    def read(self, seq: int) -> None:
        """The inbox was read up to ``seq`` (whatever the message there was)."""
        self.seen = max(self.seen, seq)

    def add(self, seq: int, msg: InboxMessage) -> None:
        self.messages.append((seq, msg))
        self.version += 1

    def drop_through(self, seq: int) -> None:
        """Forget the messages at or below ``seq`` (an object moved past them)."""
        self.messages = [(s, m) for s, m in self.messages if s > seq]
        self.claimed = set()

    def resolve(
        self, started: WaitStarted, *, consumed: Container[int], start: int, now: float
    ) -> WaitDone | None:
        """How the wait ``started`` of the generation (or invocation) that began at
        journal sequence ``start`` ends, if it can now; else ``None``. A signal it
        takes is claimed at once."""
        pos, name, wait = started.pos, started.name, started.wait
        for seq, msg in self.messages:
            if wait == "signal" and isinstance(msg, Signal):
                if (
                    msg.name == name
                    and seq > self.floor
                    and seq not in consumed
                    and seq not in self.claimed
                ):
                    self.claimed.add(seq)
                    return WaitDone(pos=pos, name=name, wait=wait, value=msg.payload, inbox_seq=seq)
            elif wait == "completion" and isinstance(msg, Completion):
                # engine.complete checked the token; the first completion of it wins
                if msg.pos == pos and msg.start == start and seq not in consumed:
                    return WaitDone(pos=pos, name=name, wait=wait, value=msg.value, inbox_seq=seq)
            elif wait == "child" and isinstance(msg, ChildEnded) and msg.id == name:
                # sent by the child, maybe more than once: any copy will do
                value = msgspec.Raw(msgspec.json.encode(msg.outcome()))
                return WaitDone(pos=pos, name=name, wait=wait, value=value, inbox_seq=seq)
        if started.until is not None and (
            now >= started.until - TIMER_EARLY or self.timer_fired(pos, start)
        ):
            return WaitDone(pos=pos, name=name, wait=wait, timed_out=True)
        return None

    def timer_fired(self, pos: int, start: int) -> bool:
        """Whether the timer of wait ``pos`` of generation ``start`` fired. A timer
        stored without ``start`` (an older version's) counts when it fired after the
        generation began (the inbox and the journal share one stream, so their
        sequences compare)."""
        return any(
            isinstance(m, TimerFired)
            and m.pos == pos
            and (m.start == start if m.start is not None else seq > start)
            for seq, m in self.messages
        )


@dataclass(frozen=True)
class Commit:
    done: WaitDone


@dataclass(frozen=True)
class SetTimer:
    pos: int
    until: float


@dataclass(frozen=True)
class Sleep:
    """Wait until the view's version is past ``version``, or ``until`` (clock time).
    ``kept``: the idle time ran out but the actor may not park (a sibling branch of
    ``ctx.all``/``ctx.race`` is busy)."""

    until: float
    version: int
    kept: bool = False


@dataclass(frozen=True)
class Park:
    left_at: int


WaitCommand = Commit | SetTimer | Sleep | Park


class Wait:
    """One wait, from its ``wait.started`` to its ``wait.done``. The actor stays in
    memory ``park_after`` seconds without news, then parks (when it may: no sibling
    branch busy)."""

    def __init__(self, started: WaitStarted, *, park_after: float, now: float) -> None:
        self.started = started
        self.park_after = park_after
        self.timer_set = False
        self._version = -1  # the view's version the last answer saw
        self._idle_since = now

    def timer_scheduled(self) -> None:
        self.timer_set = True

    def next(
        self,
        view: InboxView,
        *,
        consumed: Container[int],
        start: int,
        now: float,
        may_park: Callable[[], bool],
    ) -> WaitCommand:
        """What to do now, given everything read so far. ``may_park`` is asked only
        once the idle time ran out (inside ``ctx.all``/``ctx.race`` asking marks this
        branch idle: a branch that is still setting its timer, or has news, is not)."""
        if view.version != self._version:
            self._version = view.version  # news: the idle time starts again
            self._idle_since = now
        started = self.started
        done = view.resolve(started, consumed=consumed, start=start, now=now)
        if done is not None:
            return Commit(done)
        if (
            started.until is not None
            and not self.timer_set
            and not view.timer_fired(started.pos, start)
        ):
            return SetTimer(started.pos, started.until)
        deadline = self._idle_since + self.park_after
        if started.until is not None:
            deadline = min(deadline, started.until)
        if now < deadline:
            return Sleep(deadline, self._version)
        if may_park():
            return Park(view.seen)
        self._idle_since = now
        return Sleep(now + self.park_after, self._version, kept=True)


class Idle:
    """An object with nothing queued: it stays in memory ``park_after`` seconds after
    the last news (an invocation or a cancel read), then leaves (idle)."""

    def __init__(self, *, park_after: float, now: float) -> None:
        self.park_after = park_after
        self._version = -1
        self._since = now

    def next(self, *, version: int, seen: int, now: float) -> Sleep | Park:
        """``version`` counts the reads that queued something; ``seen`` is the last
        inbox sequence read."""
        if version != self._version:
            self._version, self._since = version, now
        until = self._since + self.park_after
        if now < until:
            return Sleep(until, version)
        return Park(seen)
