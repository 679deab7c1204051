"""A keyed object's life-cycle machine (``fusee.runtime.object_life``), driven directly
with every order and combination of its events.

A world keeps what outlives an activation: the inbox (invocations of an exclusive
handler, a shared one, an unknown one and the built-in edit, malformed ones, cancels
of a queued invocation, of the running one and untargeted), the journal (an
invocation's first record when its handler journals one, its ``obj.done``), the KV
projection, and the replies the callers got. Each activation reads the world as
``read_object`` would, then hypothesis draws what happens next at every point: a
message arrives and the inbox is read (before an invocation, while its handler runs,
while the key waits idle; a read begun while a handler runs may return after its
``obj.done`` landed, during its reply or once the next invocation began), the handler journals a record first, returns, raises or
parks, a commit lands or the process dies before or after it, a background projection
write lands, fails or dies, an eviction (replayed in the same machine, as the forced-replay
mode does), the idle wait expires. Activations follow one another until every message
arrived and the key left idle with its writes landed.

The properties:

- every invocation stored ends once, in inbox order (one ``obj.done`` each, their
  inbox sequences increasing along the journal);
- a reply only after its ``obj.done`` landed, with what that record holds;
- a queued invocation a cancel was read for never runs its handler (it ends
  ``fusee.Cancelled`` with the cancel's reason);
- a projection is never written past an invocation whose caller was not answered
  (the catch-up's replies come before its projection);
- the projection of a key at rest equals the fold of the journal, at its cursor;
- a cancel of the running invocation read while it runs (or with the journal that
  shows it begun), or an untargeted one read while it runs here, stops it: it ends
  ``fusee.Cancelled``;
- a cancel's reason never ends an invocation other than its target;
- every message that is neither an invocation nor a cancel is kept for the waits;
- a malformed invocation ends ``fusee.InvalidInput``, one of an unknown handler
  ``fusee.UnknownHandler``, an edit is applied (unless cancelled while queued);
- no projection is written on a call's path (only the catch-up's, before serving);
- once a background write failed, no invocation ends after the next one (its error
  stops the key);
- an idle key leaves only when every invocation read has ended;
- the projection is less than ``reproject_after`` records behind while the key runs
  (plus, after a catch-up, the records of the invocation begun past its tag).

``MUTANTS`` puts defects back one at a time; each must be found, by the property it
breaks (its message).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusee.runtime import object_life
from fusee.runtime.inbox import Cancel, InboxMessage, Invoke, Signal, Unknown
from fusee.runtime.life_events import Log
from fusee.runtime.object_life import (
    CancelRunning,
    Command,
    Decided,
    Keep,
    Loaded,
    ObjectLife,
    PutState,
    QueueChanged,
    RaiseWriteError,
    Reply,
    RunEdit,
    RunHandler,
)
from fusee.runtime.objects import EDIT, State, decode_state, fold
from fusee.runtime.records import Invocation, ObjectDone
from fusee.runtime.waits import Park
from tests.machines import machine_settings

OBJ = "@counter/k"
HANDLERS = {"add": False, "peek": True}  # name: shared
REPROJECT = 3  # (the driver's 64, made small so the examples reach it)
# what a message is (exclusive invocations and cancels twice as likely: the windows
# between one invocation and the next need two of them and a cancel)
KINDS = ["add", "add", "cancel", "cancel", "peek", "untargeted", "edit", "bad", "x"]


class Died(Exception):
    """The process died: the activation is gone, what landed stays."""


class Left(Exception):
    """The activation left memory (idle or parked): its writes landed."""


class WriteFailed(Exception):
    """A background projection write failed and its error left the activation."""


@dataclass
class World:
    inbox: list[InboxMessage | Unknown] = field(default_factory=list)  # seq = index + 1
    to_come: list[InboxMessage | Unknown] = field(default_factory=list)
    # ("invoked", inv, None) or ("done", inv, done); journal sequence = index + 1
    journal: list[tuple[str, Invocation, ObjectDone | None]] = field(default_factory=list)
    projection: tuple[bytes, int, int] | None = None  # data, journal seq, cursor
    revision: int = 0
    replies: dict[int, list[tuple[int, ObjectDone]]] = field(default_factory=dict)
    deaths: int = 2
    # an invocation's inbox sequence: the reasons of the cancels read that mean it
    cancel_reasons: dict[int, set[str]] = field(default_factory=dict)

    def dones(self) -> list[tuple[int, Invocation, ObjectDone]]:
        return [(at, inv, d) for at, (kind, inv, d) in enumerate(self.journal, 1) if d]

    def read(self) -> tuple[Loaded, Invocation | None, int]:
        """As ``read_object``: the projection and the journal past it."""
        data, tag, cursor = self.projection or (b"{}", 0, 0)
        state = decode_state(data)
        unprojected = []
        for at, inv, done in self.dones():
            if at > tag:
                state, cursor = fold(state, done), inv.inbox_seq
                unprojected.append((inv, done, at))
        begun, begun_at = None, 0
        if self.journal and self.journal[-1][0] == "invoked":
            begun, begun_at = self.journal[-1][1], len(self.journal)
        size = len(self.journal) - tag + 1 if tag else len(self.journal)
        loaded = Loaded(state, cursor, self.revision, tag, tuple(unprojected), size)
        return loaded, begun, begun_at


@st.composite
def worlds(draw: st.DrawFn) -> World:
    world = World(deaths=draw(st.sampled_from([2, 0, 1])))
    for _ in range(draw(st.integers(1, 7))):
        seq = len(world.to_come) + 1
        kind = draw(st.sampled_from(KINDS))
        msg: InboxMessage | Unknown
        reply = draw(st.sampled_from([f"r{seq}", ""]))
        if kind == "cancel":
            target = draw(st.integers(1, max(1, seq + 1)))
            msg = Cancel(reason=draw(st.sampled_from([f"why{seq}", None])), target=target)
        elif kind == "untargeted":
            msg = Cancel(reason=f"now{seq}")
        elif kind == "edit":
            msg = Invoke(handler=EDIT, input=msgspec.Raw(b'{"set":{"e":1}}'), reply=reply)
        elif kind == "bad":
            msg = Unknown(kind="invoke", why="no handler field", reply=reply)
        elif kind == "x":
            others: list[InboxMessage] = [Invoke(handler="nope", reply=reply), Signal(name="s")]
            msg = draw(st.sampled_from(others))
        else:
            msg = Invoke(handler=kind, reply=reply)
        world.to_come.append(msg)
    return world


@dataclass
class Play:
    world: World
    data: st.DataObject
    life: ObjectLife
    steps: int = 0
    fed_cancels: dict[int, str] = field(default_factory=dict)  # target: reason (this activation)
    fed_invokes: set[int] = field(default_factory=set)
    fed_targets: set[int] = field(default_factory=set)  # every targeted cancel read
    seen: int = 0
    running: Invocation | None = None  # begun in this activation (start() said so)
    # what the driver's _begun() says: the journal's begun invocation, not ended, and
    # the journal record it began at (0: none yet)
    current: Invocation | None = None
    current_at: int = 0
    # a read of the inbox awaiting the server: what it brings, and the invocation
    # that was begun when it began, and when it returns: after that invocation's
    # obj.done landed, during its reply, or once the next one began (at the latest)
    in_flight: tuple[list[tuple[int, InboxMessage | Unknown]], Invocation | None, str] | None = None
    pending: list[PutState] = field(default_factory=list)  # background writes in flight
    write_failed: bool = False  # a background write failed, its error not raised yet
    ended_since_failure: int = 0  # invocations ended since
    base: int = 0  # the projection's tag as the activation read it (history.size counts from it)
    slack: int = 0  # records past the projection's tag when it was written

    def draw(self, options: list[str]) -> str:
        self.steps += 1
        if self.steps > 60:
            return options[0]
        return self.data.draw(st.sampled_from(options))

    def die_maybe(self) -> None:
        if self.world.deaths and self.draw(["live", "die"]) == "die":
            self.world.deaths -= 1
            raise Died

    # -- what the driver does with each command -------------------------------------

    def perform(self, commands: list[Command]) -> bool:
        cancel = False
        for cmd in commands:
            if isinstance(cmd, Reply):
                self.reply(cmd)
            elif isinstance(cmd, PutState):
                if cmd.background:
                    self.pending.append(cmd)
                    self.land_puts(maybe=True)
                else:
                    self.put(cmd)
            elif isinstance(cmd, CancelRunning):
                cancel = True
            elif isinstance(cmd, Keep):
                assert not isinstance(cmd.message, Invoke | Cancel | Unknown)
            elif isinstance(cmd, RaiseWriteError):
                if self.write_failed:
                    raise WriteFailed
            else:
                assert isinstance(cmd, Log | QueueChanged), cmd
        return cancel

    def reply(self, cmd: Reply) -> None:
        seq = cmd.invocation.inbox_seq
        landed = [d for at, inv, d in self.world.dones() if at == cmd.at]
        early = f"a reply to invocation {seq} before its obj.done landed (at {cmd.at})"
        assert landed == [cmd.done], early
        assert cmd.done.inbox_seq == seq, early
        if cmd.invocation.reply:
            self.world.replies.setdefault(seq, []).append((cmd.at, cmd.done))
        self.land_read("during its reply")
        self.die_maybe()

    def put(self, cmd: PutState) -> None:
        self.die_maybe()
        for at, inv, _ in self.world.dones():
            if at <= cmd.seq and inv.reply:
                assert inv.inbox_seq in self.world.replies, (
                    f"a projection written past invocation {inv.inbox_seq} whose caller "
                    f"was not answered"
                )
        assert cmd.seq <= len(self.world.journal), "a projection ahead of the journal"
        self.world.projection = (cmd.data, cmd.seq, cmd.cursor)
        # the catch-up's is tagged with the last obj.done, the records of an invocation
        # begun after it read already: the projection starts that far behind
        self.slack = 0 if cmd.background else len(self.world.journal) - cmd.seq
        self.world.revision += 1
        self.life.projected(self.world.revision)

    def land_puts(self, *, maybe: bool) -> None:
        while self.pending and (not maybe or self.draw(["later", "land"]) == "land"):
            cmd = self.pending.pop(0)
            if self.write_failed:
                continue  # (the driver writes no more once one failed)
            if self.world.deaths and self.draw(["lands", "fails"]) == "fails":
                self.world.deaths -= 1
                self.write_failed, self.ended_since_failure = True, 0
                continue
            self.put(cmd)

    # -- the inbox ------------------------------------------------------------------

    def arrive(self) -> None:
        if self.world.to_come:
            self.world.inbox.append(self.world.to_come.pop(0))

    def read(self, *, slow: bool = False) -> bool:
        """A read of the inbox; ``slow``: it may await the server (the watcher's, after
        pushes were lost) and return at a later point (:meth:`land_read`)."""
        cancel = self.land_read()  # (the watcher reads one at a time)
        messages = list(enumerate(self.world.inbox, 1))[self.seen :]
        self.seen = len(self.world.inbox)
        if slow and self.current is not None and self.draw(["now", "slow"]) == "slow":
            when = self.draw(["after its commit", "during its reply", "once the next began"])
            self.in_flight = (messages, self.current, when)
            return cancel
        return self.deliver(messages, self.current) or cancel

    def land_read(self, at: str = "") -> bool:
        """The read in flight returns if ``at`` is when it does (none: it returns now);
        True: a cancel of the running one."""
        if self.in_flight is None or at not in ("", self.in_flight[2]):
            return False
        messages, before, _ = self.in_flight
        self.in_flight = None
        return self.deliver(messages, before)

    def deliver(
        self, messages: list[tuple[int, InboxMessage | Unknown]], before: Invocation | None
    ) -> bool:
        """What a read brought reaches the machine, sorted against the invocation
        begun as it returns (``before``: the one begun as it began)."""
        for seq, msg in messages:
            if isinstance(msg, Invoke | Unknown):
                self.fed_invokes.add(seq)
        begun, begun_at = self.current, self.current_at
        settled = begun is before
        for _, msg in messages:
            if not isinstance(msg, Cancel):
                continue
            reason = msg.reason or "cancelled"
            if msg.target is None:  # the one running here, read while it runs, or none
                if begun is not None and settled and begun is self.running:
                    self.fed_targets.add(begun.inbox_seq)
                # (stored before the read began: one begun during it is not what it meant)
                if begun is not None and settled:
                    self.world.cancel_reasons.setdefault(begun.inbox_seq, set()).add(reason)
                continue
            self.fed_targets.add(msg.target)
            self.world.cancel_reasons.setdefault(msg.target, set()).add(reason)
            if begun is None or msg.target != begun.inbox_seq:
                self.fed_cancels[msg.target] = reason
        out = self.life.inbox(messages, begun=begun, begun_at=begun_at, before=before)
        kept = {c.seq for c in out if isinstance(c, Keep)}
        for seq, msg in messages:
            if not isinstance(msg, Invoke | Cancel | Unknown):
                assert seq in kept, f"a {type(msg).__name__} read was not kept for the waits"
        return self.perform(out)

    def news(self) -> bool:
        """Maybe a message arrives and is read; True: a cancel of the running one."""
        if self.world.to_come and self.draw(["quiet", "news"]) == "news":
            self.arrive()
            return self.read(slow=True)
        return False

    # -- one invocation -------------------------------------------------------------

    def invoke(self, inv: Invocation, journaled: int) -> None:
        handlers = HANDLERS
        cancels = dict(self.fed_cancels)
        if self.current is not inv:
            self.current, self.current_at = inv, 0  # (history.begin)
        what = self.life.start(inv, handlers=handlers, journaled=journaled)
        self.running = inv
        if journaled == 0 and inv.inbox_seq in cancels:
            ran = f"a cancelled queued invocation ({inv.inbox_seq}) ran: {what}"
            assert isinstance(what, Decided), ran
            assert what.fields == {
                "error_type": "fusee.Cancelled",
                "message": cancels[inv.inbox_seq],
            }, ran
        self.check_decided(inv, what)
        fields: dict[str, Any]
        if isinstance(what, Decided):
            fields = what.fields
        elif isinstance(what, RunEdit):
            fields = {"result": msgspec.Raw(b"null"), "state_set": {"e": msgspec.Raw(b"1")}}
        else:
            assert isinstance(what, RunHandler)
            assert what.shared == HANDLERS[inv.handler]
            cancelled = self.life.cancel_reason is not None
            # a read begun while the invocation before ran returns now, at the latest
            cancelled = self.land_read() or cancelled
            if journaled == 0 and self.draw(["plain", "journals"]) == "journals":
                self.world.journal.append(("invoked", inv, None))  # its first step
                self.current_at = len(self.world.journal)
            cancelled = self.news() or cancelled
            ends = ["returns", "raises", "parks", "evicted"]
            end = "cancelled" if cancelled else self.draw(ends)
            if inv.inbox_seq in self.fed_targets:
                assert end == "cancelled", (
                    f"a cancel of the running invocation {inv.inbox_seq} read, but it ran on"
                )
            if end in ("parks", "evicted"):
                if not self.world.journal or self.world.journal[-1][1] is not inv:
                    self.world.journal.append(("invoked", inv, None))
                raise Left(end)
            if end == "cancelled":
                assert self.life.cancel_reason is not None
                fields = {"error_type": "fusee.Cancelled", "message": self.life.cancel_reason}
            elif end == "raises" or what.shared:
                fields = (
                    {"error_type": "E", "message": "m"}
                    if end == "raises"
                    else {"result": msgspec.Raw(b"0")}
                )
            else:
                key = f"k{inv.inbox_seq}"
                fields = {"result": msgspec.Raw(b"1"), "state_set": {key: msgspec.Raw(b"1")}}
        done = ObjectDone(inbox_seq=inv.inbox_seq, handler=inv.handler, **fields)
        self.die_maybe()  # (a fenced commit is the same: nothing lands)
        self.commit(inv, done)
        self.current, self.current_at = None, 0
        self.land_read("after its commit")  # (before the driver hears it landed)
        self.die_maybe()
        after = self.life.ended(inv, done, len(self.world.journal), self.size())
        on_path = [c for c in after if isinstance(c, PutState) and not c.background]
        assert not on_path, f"a projection written on the call's path: {on_path}"
        if self.write_failed:
            self.ended_since_failure += 1
        self.perform(after)
        self.running = None

    def check_decided(self, inv: Invocation, what: Command) -> None:
        """What an invocation is, as its message says (unless cancelled while queued)."""
        if isinstance(what, Decided) and what.fields.get("error_type") == "fusee.Cancelled":
            return
        msg = self.world.inbox[inv.inbox_seq - 1]
        if isinstance(msg, Unknown):
            assert isinstance(what, Decided), f"a malformed invocation ran: {what}"
            assert what.fields.get("error_type") == "fusee.InvalidInput", (
                f"a malformed invocation ({inv.inbox_seq}) ended {what.fields}"
            )
        elif inv.handler == EDIT:
            assert isinstance(what, RunEdit), f"an edit ({inv.inbox_seq}) was not applied: {what}"
        elif inv.handler not in HANDLERS:
            assert isinstance(what, Decided), f"an unknown handler ran: {what}"
            assert what.fields.get("error_type") == "fusee.UnknownHandler", (
                f"an invocation of an unknown handler ({inv.inbox_seq}) ended {what.fields}"
            )

    def size(self) -> int:
        """The records the activation's history holds (read from its projection's tag
        on, and appended since)."""
        tag = self.base
        return len(self.world.journal) - tag + 1 if tag else len(self.world.journal)

    def commit(self, inv: Invocation, done: ObjectDone) -> None:
        before = [d.inbox_seq for _, _, d in self.world.dones()]
        assert done.inbox_seq not in before, f"invocation {done.inbox_seq} ended twice"
        assert not before or before[-1] < done.inbox_seq, (
            f"inbox order broken: {done.inbox_seq} ended after {before[-1]}"
        )
        skipped = sorted(s for s in self.fed_invokes - set(before) if s < done.inbox_seq)
        assert not skipped, f"inbox order broken: {done.inbox_seq} ended before {skipped}"
        assert not (self.write_failed and self.ended_since_failure), (
            f"invocation {done.inbox_seq} ended after a failed projection write was due "
            f"to stop the key"
        )
        if done.error_type == "fusee.Cancelled":
            reasons = self.world.cancel_reasons.get(done.inbox_seq, set())
            assert done.message in reasons, (
                f"invocation {done.inbox_seq} ended fusee.Cancelled by a cancel of another "
                f"({done.message!r}; its own: {sorted(reasons)})"
            )
        self.world.journal.append(("done", inv, done))

    # -- an activation --------------------------------------------------------------

    def activate(self) -> str:
        loaded, begun, begun_at = self.world.read()
        self.fed_cancels, self.fed_invokes, self.fed_targets, self.pending = {}, set(), set(), []
        self.seen, self.running = loaded.cursor, None
        self.current, self.current_at, self.in_flight = begun, begun_at, None
        self.write_failed, self.base = False, loaded.projected_at
        self.perform(self.life.loaded(loaded))
        try:
            return self.serve()
        except Left as left:
            self.in_flight = None  # (the watcher is cancelled: the next one reads it again)
            self.perform(self.life.leaving(self.size()))
            self.land_puts(maybe=False)
            if self.write_failed:
                raise WriteFailed from left  # (_serve raises it as it leaves)
            return str(left)

    def serve(self) -> str:
        self.read()
        while True:
            self.news()
            self.land_puts(maybe=True)
            _, begun, _ = self.world.read()
            inv = self.life.next(begun, lambda: 1.0, lambda handler: None)
            if inv is None:
                if self.idle():
                    raise Left("idle")
                continue
            journaled = 1 if inv is begun else 0
            self.invoke(inv, journaled)
            self.check_behind()

    def idle(self) -> bool:
        self.life.idle_begin(0.0)
        self.land_read()  # (it returns before the idle wait could end)
        now = 0.0
        while True:
            cmd = self.life.idle_next(seen=self.seen, now=now)
            if cmd is None:
                return False
            if isinstance(cmd, Park):
                ended = {d.inbox_seq for _, _, d in self.world.dones()}
                waiting = sorted(self.fed_invokes - ended)
                assert not waiting, f"an idle key left with work queued: {waiting}"
                return True
            if self.world.to_come and self.draw(["news", "expire"]) == "news":
                self.arrive()
                self.read()
            else:
                now = cmd.until

    def check_behind(self) -> None:
        if self.world.projection is not None and not self.pending and not self.write_failed:
            behind = len(self.world.journal) - self.world.projection[1]
            assert behind < REPROJECT + self.slack, f"the projection is {behind} records behind"


def play(world: World, data: st.DataObject) -> None:
    reuse = data.draw(st.booleans())  # the forced-replay mode re-activates the same actor
    life = ObjectLife(OBJ, park_after=1.0, reproject_after=REPROJECT)
    for _ in range(12):
        if not reuse:
            life = ObjectLife(OBJ, park_after=1.0, reproject_after=REPROJECT)
        p = Play(world, data, life)
        try:
            left = p.activate()
        except (Died, WriteFailed):
            continue
        if left == "idle" and not world.to_come:
            break
    else:
        world.deaths = 0  # (bounded: the draws ran out; one more calm activation)
        while True:
            p = Play(world, data, ObjectLife(OBJ, park_after=1.0, reproject_after=REPROJECT))
            p.steps = 1000
            if p.activate() == "idle" and not world.to_come:
                break
    check_at_rest(world)


def check_at_rest(world: World) -> None:
    invokes = [s for s, m in enumerate(world.inbox, 1) if isinstance(m, Invoke | Unknown)]
    ended = [d.inbox_seq for _, _, d in world.dones()]
    assert ended == invokes, f"not every invocation ended once, in inbox order: {ended}"
    state: State = {}
    for _, _, done in world.dones():
        state = fold(state, done)
    assert world.projection is not None or not ended, "no projection of a key at rest"
    if world.projection is not None:
        data, tag, cursor = world.projection
        assert (decode_state(data), cursor) == (state, ended[-1] if ended else 0), (
            "the projection at rest is not the fold of the journal"
        )
        assert tag == world.dones()[-1][0], "the projection at rest is not at the last obj.done"
    for seq, got in world.replies.items():
        assert all(g == got[0] for g in got), f"different replies to {seq}"
    for _, inv, _ in world.dones():
        if inv.reply:
            assert inv.inbox_seq in world.replies, f"the caller of {inv.inbox_seq} got no reply"


@given(world=worlds(), data=st.data())
@machine_settings(examples=400, steps=1)
def test_every_order_of_the_objects_events(world: World, data: st.DataObject) -> None:
    play(world, data)


# -- defects put back ------------------------------------------------------------------


@contextlib.contextmanager
def _patched(name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    """``name``: a method of the machine, ``Play.<method>`` (the driver's part), or
    several, joined by ``+`` (``wrap`` then wraps the first; the next ones are named
    with their wrapper in ``_ALSO``)."""
    first, *more = name.split("+")
    with contextlib.ExitStack() as stack:
        for each, wrapper in [(first, wrap)] + [(m, _ALSO[m]) for m in more]:
            owner: Any = Play if each.startswith("Play.") else ObjectLife
            attr = each.removeprefix("Play.")
            real = getattr(owner, attr)
            setattr(owner, attr, wrapper(real))
            stack.callback(setattr, owner, attr, real)
        yield


def _catch_up_put_first(real: Any) -> Any:
    def loaded(self: ObjectLife, snap: Loaded) -> list[Command]:
        out = real(self, snap)
        puts = [c for c in out if isinstance(c, PutState)]
        return puts + [c for c in out if not isinstance(c, PutState)]

    return loaded


def _cancel_ignored(real: Any) -> Any:
    def start(self: ObjectLife, inv: Invocation, **kw: Any) -> Any:
        self.cancels.pop(inv.inbox_seq, None)
        return real(self, inv, **kw)

    return start


def _newest_first(real: Any) -> Any:
    def nxt(self: ObjectLife, begun: Any, now: float, timeout: Any) -> Any:
        self.queue.reverse()
        try:
            return real(self, begun, now, timeout)
        finally:
            self.queue.reverse()

    return nxt


def _leave_queued(real: Any) -> Any:
    def idle_next(self: ObjectLife, *, seen: int, now: float) -> Any:
        self._idle_version = self.version
        return real(self, seen=seen, now=now)

    return idle_next


def _running_cancel_ignored(real: Any) -> Any:
    def inbox(self: ObjectLife, messages: Any, **kw: Any) -> list[Command]:
        before = self.cancel_reason
        out = real(self, messages, **kw)
        self.cancel_reason = before
        return [c for c in out if not isinstance(c, CancelRunning)]

    return inbox


def _never_reprojected(real: Any) -> Any:
    def ended(self: ObjectLife, inv: Invocation, done: ObjectDone, at: int, size: int) -> Any:
        self.reproject_after = 10**9
        return real(self, inv, done, at, size)

    return ended


def _no_projection_on_leaving(real: Any) -> Any:
    return lambda self, size: []


def _reply_at_the_wrong_record(real: Any) -> Any:
    def ended(self: ObjectLife, inv: Invocation, done: ObjectDone, at: int, size: int) -> Any:
        out = real(self, inv, done, at, size)
        return [Reply(c.invocation, c.done, at - 1) if isinstance(c, Reply) else c for c in out]

    return ended


def _signals_dropped(real: Any) -> Any:
    def inbox(self: ObjectLife, messages: Any, **kw: Any) -> list[Command]:
        return [c for c in real(self, messages, **kw) if not isinstance(c, Keep)]

    return inbox


def _untargeted_ignored(real: Any) -> Any:
    def inbox(self: ObjectLife, messages: Any, **kw: Any) -> list[Command]:
        kept = [(s, m) for s, m in messages if not (isinstance(m, Cancel) and m.target is None)]
        return list(real(self, kept, **kw))

    return inbox


def _write_error_kept(real: Any) -> Any:
    def ended(self: ObjectLife, *args: Any) -> list[Command]:
        return [c for c in real(self, *args) if not isinstance(c, RaiseWriteError)]

    return ended


def _put_on_the_path(real: Any) -> Any:
    def ended(self: ObjectLife, *args: Any) -> list[Command]:
        return [
            PutState(c.data, c.seq, c.cursor, False) if isinstance(c, PutState) else c
            for c in real(self, *args)
        ]

    return ended


def _reprojected_late(real: Any) -> Any:
    def ended(self: ObjectLife, *args: Any) -> list[Command]:
        self.reproject_after = REPROJECT + 1
        return list(real(self, *args))

    return ended


def _ends_ok(error_type: str) -> Callable[[Any], Any]:
    def wrap(real: Any) -> Any:
        def start(self: ObjectLife, inv: Invocation, **kw: Any) -> Any:
            what = real(self, inv, **kw)
            if isinstance(what, Decided) and what.fields.get("error_type") == error_type:
                return Decided({"result": msgspec.Raw(b"null")})
            return what

        return start

    return wrap


def _edit_a_no_op(real: Any) -> Any:
    def start(self: ObjectLife, inv: Invocation, **kw: Any) -> Any:
        what = real(self, inv, **kw)
        return Decided({"result": msgspec.Raw(b"null")}) if isinstance(what, RunEdit) else what

    return start


def _begun_before_the_read(real: Any) -> Any:
    """The driver sorts a read against the invocation begun as the read began."""

    def deliver(self: Play, messages: Any, before: Invocation | None) -> bool:
        current, at = self.current, self.current_at
        if before is not current:
            self.current, self.current_at = before, 0
        try:
            return bool(real(self, messages, before))
        finally:
            self.current, self.current_at = current, at

    return deliver


def _cancel_reason_unkeyed(real: Any) -> Any:
    def start(self: ObjectLife, inv: Invocation, **kw: Any) -> Any:
        self.cancel_of = inv.inbox_seq  # (whichever invocation it was read for)
        return real(self, inv, **kw)

    return start


def _catch_up_unwritten(real: Any) -> Any:
    def loaded(self: ObjectLife, snap: Loaded) -> list[Command]:
        return [c for c in real(self, snap) if not isinstance(c, PutState)]

    return loaded


_ALSO: dict[str, Callable[[Any], Any]] = {"start": _cancel_reason_unkeyed}

MUTANTS: dict[str, tuple[str, Callable[[Any], Any], str]] = {
    # defect: (the method it wraps, the wrapper, what the property that finds it says)
    "replies before the record lands": (
        "ended",
        _reply_at_the_wrong_record,
        "a reply to invocation .* before its obj.done landed",
    ),
    "the projection before the catch-up's replies": (
        "loaded",
        _catch_up_put_first,
        "a projection written past invocation .* whose caller was not answered",
    ),
    "a queued cancel ignored": ("start", _cancel_ignored, "a cancelled queued invocation"),
    "inbox order broken": ("next", _newest_first, "inbox order broken|ended once, in inbox order"),
    "a cancel of the running one ignored": (
        "inbox",
        _running_cancel_ignored,
        "a cancel of the running invocation .* read, but it ran on",
    ),
    "leaving with work queued": ("idle_next", _leave_queued, "an idle key left with work queued"),
    "no projection every REPROJECT_AFTER records": (
        "ended",
        _never_reprojected,
        "the projection is .* records behind",
    ),
    "no projection on leaving": (
        "leaving",
        _no_projection_on_leaving,
        "the projection at rest is not the fold",
    ),
    "signals dropped": ("inbox", _signals_dropped, "a Signal read was not kept for the waits"),
    "untargeted cancels ignored": (
        "inbox",
        _untargeted_ignored,
        "a cancel of the running invocation .* read, but it ran on",
    ),
    "a failed projection write not raised": (
        "ended",
        _write_error_kept,
        "ended after a failed projection write",
    ),
    "the projection on the call's path": (
        "ended",
        _put_on_the_path,
        "a projection written on the call's path",
    ),
    "reprojected one record late": (
        "ended",
        _reprojected_late,
        "the projection is .* records behind",
    ),
    "a malformed invocation ends ok": (
        "start",
        _ends_ok("fusee.InvalidInput"),
        "a malformed invocation",
    ),
    "an unknown handler ends ok": (
        "start",
        _ends_ok("fusee.UnknownHandler"),
        "an invocation of an unknown handler",
    ),
    "the edit a no-op": ("start", _edit_a_no_op, "an edit .* was not applied"),
    "the catch-up without its projection": (
        "loaded",
        _catch_up_unwritten,
        "no projection of a key at rest|the projection at rest is not",
    ),
    # the driver's part: a read sorted against the invocation begun as it began (a
    # cancel of the next is lost; one of the ended one stops the next)
    "a read sorted against the invocation begun as it began": (
        "Play.deliver",
        _begun_before_the_read,
        "a cancel of the running invocation .* read, but it ran on"
        "|ended fusee.Cancelled by a cancel of another",
    ),
    "a cancel's reason kept for another invocation": (
        "Play.deliver+start",
        _begun_before_the_read,
        "ended fusee.Cancelled by a cancel of another",
    ),
}


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_the_machine_finds_each_defect_put_back(mutant: str) -> None:
    name, wrap, says = MUTANTS[mutant]

    @given(world=worlds(), data=st.data())
    @machine_settings(examples=600, steps=1, shrink=False)
    def search(world: World, data: st.DataObject) -> None:
        play(world, data)

    with _patched(name, wrap), pytest.raises(AssertionError, match=says):
        search()


def test_the_module_names_what_it_exports() -> None:
    assert set(object_life.__all__) <= set(dir(object_life))
