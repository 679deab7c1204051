"""The run drivers' life cycle, explored: a parent and its children, a cancel at any
point, and a process dying at any write, run by a worker that is emulated here.

The actors, their contexts, ``ctx.child``, the child's notice to its parent, the
parent's cancel of the children it leaves, the index projection and the worker's
marker handling run as they do in a worker; only the storage is in memory
(``tests/memory_store.py``, with JetStream's fencing rule and message-ID dedupe). The
worker is reduced to what it decides: which marked actor it activates, that a parked
actor comes back when its inbox has something past where it left, that an ended or
paused run's marker is cleared, and that a process which dies forgets everything in
memory (its parked actors, the actor it ran) while the store keeps what landed.

Hypothesis draws which actor runs next, where the process dies (before or after any
write: an append, an index entry, a marker, a message to another inbox, a timer), and
when a client cancels the parent. Whatever it draws, the properties users rely on hold
once the crashes are over:

- every run ends (nothing waits silently), and no worker activation is left that would
  change anything: the system settles;
- a step whose result was stored never runs again;
- a parent that completed has every child's result; a cancelled parent's children all
  ended, none left running;
- each run's index entry says how its journal ended, and no ended run keeps its marker.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
from hypothesis import given
from hypothesis import strategies as st

import fusee
from fusee.actors.context import ObjectContext
from fusee.actors.core import ActorCore, Driver
from fusee.actors.object_actor import ObjectActor
from fusee.actors.object_state import read_object
from fusee.actors.registry import Handler, ObjectSpec, Registry, Workflow
from fusee.actors.run_actor import RunActor
from fusee.actors.starts import start_or_attach
from fusee.errors import Evicted
from fusee.runtime.ids import escape, partition_of, unescape
from fusee.runtime.inbox import Cancel, Invoke, encode_message, signal_message
from fusee.runtime.index import decode_info
from fusee.runtime.objects import decode_state, object_id, parse_object_id
from fusee.runtime.records import (
    TERMINAL,
    ObjectDone,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    StepCompleted,
    decode_record,
)
from tests.machines import machine_settings
from tests.memory_store import Crash, MemoryStore

PARTITIONS = 4
PARENT = "parent"


class DyingStore(MemoryStore):
    """A store under a process that dies at chosen writes: the ``n``-th write of a
    kind (``"run.started"`` and the other record kinds for appends, ``"index"``,
    ``"mark"``, ``"clear"``, ``"inbox"``, ``"timer"``) raises :class:`Crash` before it
    lands (``"before"``) or once it landed, unanswered (``"after"``)."""

    deaths: dict[tuple[str, int], str]
    counts: dict[str, int]
    stored_steps: set[str]  # "<eid>:<step>" of every stored step.completed
    pushed: set[str]  # actors a message or a hint was sent to (the worker's pokes)
    trace: list[str]  # each write and death, for a failure's report

    def _write(self, when: str, kind: str, what: str = "") -> None:
        if when == "before":
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.trace.append(f"{kind} #{self.counts[kind]}: {what}")
        at = (kind, self.counts[kind])
        if self.deaths.get(at) == when:
            del self.deaths[at]
            self.trace.append(f"   the process dies {when} it")
            raise Crash

    async def append(self, eid: str, kind: str, data: bytes, **options: Any) -> int:
        # (options: MemoryStore.append's, passed on as they came)
        self._write("before", kind, f"append to {eid}")
        seq = await super().append(eid, kind, data, **options)
        record = decode_record(data)
        if isinstance(record, StepCompleted):
            self.stored_steps.add(f"{eid}:{record.name}")
        self._write("after", kind)
        return seq

    async def put_index(self, eid: str, value: bytes, *, journal_seq: int, last: int) -> int | None:
        self._write("before", "index", f"index {eid}: {decode_info(value).status}")
        revision = await super().put_index(eid, value, journal_seq=journal_seq, last=last)
        self._write("after", "index")
        return revision

    async def start_run(
        self, eid: str, kind: str, data: bytes, *, partition: int, marker: bytes, msg_id: str
    ) -> int:
        # the record and its marker, one atomic batch: both land or neither
        self._write("before", kind, f"start {eid} with its marker")
        seq = await super().start_run(
            eid, kind, data, partition=partition, marker=marker, msg_id=msg_id
        )
        self._write("after", kind)
        return seq

    async def end_run(
        self, partition: int, eid: str, value: bytes, *, journal_seq: int, fresh: bool = False
    ) -> None:
        # the end's index entry and the marker's removal, one atomic batch
        self._write("before", "index", f"index {eid}: {decode_info(value).status}, unmark")
        await super().end_run(partition, eid, value, journal_seq=journal_seq, fresh=fresh)
        self._write("after", "index")

    async def mark_run_active(self, partition: int, eid: str, marker: bytes) -> None:
        self._write("before", "mark", f"mark {eid}")
        await super().mark_run_active(partition, eid, marker)
        self._write("after", "mark")

    async def clear_run_active(
        self, partition: int, eid: str, *, listed: bytes | None = None, seen: int | None = None
    ) -> bool:
        self._write("before", "clear", f"clear {eid}")
        cleared = await super().clear_run_active(partition, eid, listed=listed, seen=seen)
        self._write("after", "clear")
        return cleared

    async def clear_unstarted(self, partition: int, eid: str) -> None:
        self._write("before", "clear", f"clear {eid} unless started")
        await super().clear_unstarted(partition, eid)
        self._write("after", "clear")

    async def mark_active(self, partition: int, eid: str) -> None:
        self._write("before", "mark", f"mark {eid}")
        await super().mark_active(partition, eid)
        self._write("after", "mark")

    async def clear_active(self, partition: int, eid: str) -> None:
        self._write("before", "clear", f"clear {eid}")
        await super().clear_active(partition, eid)
        self._write("after", "clear")

    async def send_inbox(
        self, partition: int, eid: str, kind: str, body: bytes, *, msg_id: str | None = None
    ) -> int:
        self._write("before", "inbox", f"{kind} to {eid}'s inbox")
        before = self.last_seq
        seq = await super().send_inbox(partition, eid, kind, body, msg_id=msg_id)
        if self.last_seq != before:  # stored (a duplicate is not): the consumer's push
            self.pushed.add(eid)
        self._write("after", "inbox")
        return seq

    async def wake(self, partition: int, eid: str) -> None:
        await super().wake(partition, eid)
        self.pushed.add(eid)  # a wake hint on core NATS

    async def mark_idle(self, partition: int, eid: str, ttl: float) -> None:
        self._write("before", "idle", f"idle marker {eid}")
        await super().mark_idle(partition, eid, ttl)
        self._write("after", "idle")

    async def put_state(
        self, object_type: str, key: str, data: bytes, *, journal_seq: int, cursor: int, last: int
    ) -> int | None:
        self._write("before", "state", f"state of {object_type}/{key}")
        revision = await super().put_state(
            object_type, key, data, journal_seq=journal_seq, cursor=cursor, last=last
        )
        self._write("after", "state")
        return revision

    async def schedule_timer(
        self, eid: str, partition: int, pos: int, until: float, *, start: int = 0
    ) -> None:
        self._write("before", "timer", f"timer of {eid}")
        await super().schedule_timer(eid, partition, pos, until, start=start)
        self._write("after", "timer")


class EmulatedWorker:
    """What a worker decides, over a :class:`DyingStore`: which actors it may activate,
    parking, markers at an actor's end, and forgetting everything when it dies."""

    def __init__(self, *, always_replay: bool) -> None:
        self.always_replay = always_replay
        self.store = DyingStore()
        self.store.deaths, self.store.counts, self.store.stored_steps = {}, {}, set()
        self.store.pushed, self.store.trace = set(), []
        self.runs_after_stored: list[str] = []  # steps whose function ran once stored
        self.time = 1_800_000_000.0
        self.parked: dict[str, int] = {}  # the worker's parked actors: where each left
        self.registry = Registry()

    def clock(self) -> float:
        self.time += 0.001
        return self.time

    def _ran(self, run_id: str, step: str, value: int) -> int:
        if f"{escape(run_id)}:{step}" in self.store.stored_steps:
            self.runs_after_stored.append(f"{run_id}:{step}")
        return value

    # -- the emulated worker ------------------------------------------------------------

    def runnable(self) -> list[str]:
        """What a worker would activate now: marked actors it has not parked, parked
        ones whose inbox holds something past where they left, and those it was poked
        for (a message pushed by the inbox consumer, a wake hint) since it started."""
        marked = sorted({eid for (_, eid) in [*self.store.active, *self.store.run_markers]})
        out = sorted(self.store.pushed - set(marked))
        for eid in marked:
            seen = self.parked.get(eid)
            if seen is None:
                out.append(eid)
                continue
            p = partition_of(unescape(eid), PARTITIONS)
            if any(m.seq > seen for m in self.store.inboxes.get((p, eid), [])):
                out.append(eid)
        return out

    async def activate(self, eid: str) -> None:
        """One activation, as ``Worker._actor_task`` performs it."""
        self.store.trace.append(f"-- {unescape(eid)} activated")
        self.parked.pop(eid, None)
        self.store.pushed.discard(eid)
        run_id = unescape(eid)
        p = partition_of(run_id, PARTITIONS)
        core = ActorCore(
            store=self.store,
            namespace="t",
            eid=eid,
            run_id=run_id,
            partition=p,
            clock=self.clock,
            always_replay=self.always_replay,
            park_after=0.0,
            partitions=PARTITIONS,
        )
        named = parse_object_id(run_id)
        actor: Driver
        if named is not None:
            actor = ObjectActor(
                object_type=named[0], key=named[1], registry=self.registry, core=core
            )
        else:
            actor = RunActor(registry=self.registry, core=core)
        try:
            with anyio.fail_after(10):
                outcome = await actor.run()
            if outcome == "idle":  # an idle marker the server removes after a while
                await self.store.mark_idle(p, eid, 600.0)
        except Crash:
            self.died()
            return
        except Evicted:
            return
        if outcome in ("parked", "idle"):
            self.parked[eid] = core.left_at
        elif outcome in ("ended", "paused"):
            if named is None:
                return  # a run's driver removed its marker itself
            try:
                await self.store.clear_active(p, eid)
            except Crash:
                self.died()
        else:  # pragma: no cover - nothing here is unrunnable
            raise AssertionError(f"{run_id}: unexpected outcome {outcome!r}")

    def died(self) -> None:
        """The process died: what it held in memory is gone (its parked actors, the
        pokes it had not acted on: a new process's inbox consumer delivers only new
        messages), what landed in the store stays."""
        self.parked.clear()
        self.store.pushed.clear()


class Life(EmulatedWorker):
    """One scenario of runs: a parent, its children, the client's cancel."""

    def __init__(
        self, *, children: int, together: bool, always_replay: bool, kinds: list[str]
    ) -> None:
        super().__init__(always_replay=always_replay)
        self.children = children
        # what child i does before its step: "", "signal", "sleep", "continue" (as new)
        self.kinds = kinds
        self.together = together
        self.registry.add(Workflow("parent", self._parent, int, True))
        self.registry.add(Workflow("child", self._child, int, True))

    # -- the workflows ------------------------------------------------------------------

    async def _parent(self, ctx: fusee.Context, n: int) -> list[int]:
        ids = [f"c{i}" for i in range(n)]
        if self.together:
            results = await ctx.all([ctx.child("child", c, i, type=int) for i, c in enumerate(ids)])
        else:
            results = [await ctx.child("child", c, i, type=int) for i, c in enumerate(ids)]
        await ctx.step("after", lambda: self._ran(PARENT, "after", 0))
        return results

    async def _child(self, ctx: fusee.Context, i: int) -> int:
        kind = self.kinds[i % 100]
        if kind == "signal":
            await ctx.wait_for("go")
        elif kind == "sleep":
            await ctx.sleep(60)
        elif kind == "continue" and i < 100:  # its first generation: a step, then the next
            await ctx.step("first", lambda: self._ran(ctx.run_id, "first", 0))
            ctx.continue_as_new(i + 100)
        step = "work" if i < 100 else "work-2"  # (step names are per run, not generation)
        value = (i % 100) * 10
        return int(await ctx.step(step, lambda: self._ran(ctx.run_id, step, value)))

    async def start_parent(self) -> None:
        record = RunStarted(
            workflow="parent",
            input=msgspec.Raw(msgspec.json.encode(self.children)),
            started_at=self.time,
            partition=partition_of(PARENT, PARTITIONS),
        )

        async def attach() -> None:  # pragma: no cover - started once
            raise AssertionError("started twice")

        assert await start_or_attach(self.store, PARENT, record, now=self.time, attach=attach)

    async def cancel_parent(self) -> None:
        p, eid = partition_of(PARENT, PARTITIONS), escape(PARENT)
        body = encode_message(Cancel(reason="by the test"))
        await self.store.send_inbox(p, eid, "cancel", body, msg_id=f"{eid}:cancel:test")

    async def signal_child(self, i: int) -> None:
        child = f"c{i}"
        p, eid = partition_of(child, PARTITIONS), escape(child)
        body = signal_message("go", None, what="the signal", limit=1 << 20)
        await self.store.send_inbox(p, eid, "signal", body, msg_id=f"{eid}:signal:test")

    def fire_timers(self) -> None:
        """Every timer set so far fires (the server's schedules: no worker needed)."""
        for eid, pos in sorted(self.store.timers):
            self.store.fire_timer(eid, pos)
            self.store.pushed.add(eid)  # the inbox consumer's push

    # -- what must hold -----------------------------------------------------------------

    def end_of(self, run_id: str) -> Any:
        journal = self.store.journals.get(escape(run_id), [])
        ends = [r for r in (decode_record(m.data) for m in journal) if isinstance(r, TERMINAL)]
        assert len(ends) <= 1, f"{run_id} ended {len(ends)} times"
        return ends[0] if ends else None

    def check_settled(self, cancelled: bool) -> None:
        assert not self.runs_after_stored, f"stored steps ran again: {self.runs_after_stored}"
        started = sorted(unescape(eid) for eid, j in self.store.journals.items() if j)
        for run_id in started:
            end = self.end_of(run_id)
            assert end is not None, f"run {run_id!r} never ended ({self.store.journals})"
            assert isinstance(end, RunCompleted | RunCancelled), f"{run_id}: {end}"
            eid = escape(run_id)
            entry = self.store.index_entry(eid)
            assert entry is not None, f"run {run_id!r} has no index entry"
            assert entry[0], f"run {run_id!r} has an empty index entry"
            status = decode_info(entry[0]).status
            expect = "completed" if isinstance(end, RunCompleted) else "cancelled"
            assert status == expect, f"{run_id}: indexed {status!r}, journal {expect!r}"
            at = (partition_of(run_id, PARTITIONS), eid)
            assert at not in self.store.active, f"ended run {run_id!r} kept its active marker"
            assert at not in self.store.run_markers, f"ended run {run_id!r} kept its marker"
        parent = self.end_of(PARENT)
        if isinstance(parent, RunCompleted):
            assert msgspec.json.decode(bytes(parent.result)) == [
                i * 10 for i in range(self.children)
            ]
            for i in range(self.children):
                assert isinstance(self.end_of(f"c{i}"), RunCompleted)
        else:
            assert cancelled, f"the parent ended {parent} without a cancel"
        assert not isinstance(parent, RunFailed)


@given(
    children=st.integers(min_value=1, max_value=3),
    kinds=st.lists(st.sampled_from(["", "signal", "sleep", "continue"]), min_size=3, max_size=3),
    together=st.booleans(),
    always_replay=st.booleans(),
    deaths=st.dictionaries(
        st.tuples(
            st.sampled_from(
                [
                    "run.started",
                    "wait.started",
                    "wait.done",
                    "step.completed",
                    "run.completed",
                    "run.cancelled",
                    "index",
                    "mark",
                    "clear",
                    "inbox",
                    "timer",
                ]
            ),
            st.integers(min_value=1, max_value=3),
        ),
        st.sampled_from(["before", "after"]),
        max_size=3,
    ),
    cancel_at=st.none() | st.integers(min_value=0, max_value=12),
    kills=st.integers(min_value=0, max_value=2),
    data=st.data(),
)
@machine_settings(examples=1000, steps=1)
def test_every_run_of_a_family_ends_whatever_dies_when(
    children: int,
    kinds: list[str],
    together: bool,
    always_replay: bool,
    deaths: dict[tuple[str, int], str],
    cancel_at: int | None,
    kills: int,
    data: st.DataObject,
) -> None:
    life = Life(children=children, together=together, always_replay=always_replay, kinds=kinds)
    pick = lambda actions: data.draw(st.sampled_from(actions), label="next")  # noqa: E731
    anyio.run(functools.partial(play_family, life, deaths, cancel_at, pick, kills=kills))


async def play_family(
    life: Life,
    deaths: dict[tuple[str, int], str],
    cancel_at: int | None,
    pick: Callable[[list[str]], str],
    *,
    kills: int = 0,
) -> None:
    """Start the parent, then let ``pick`` choose each next action (run an actor, send
    a child its signal, fire the timers, kill the worker between two activations, at
    most ``kills`` times) until nothing is left to do; then check."""
    await life.start_parent()
    life.store.deaths = dict(deaths)  # from here on the process may die
    turn = 0
    signalled: set[int] = set()
    while True:
        if turn == cancel_at:
            while True:  # a client's process dying: it tries again (same message ID)
                try:
                    await life.cancel_parent()
                    break
                except Crash:
                    continue
        runnable = life.runnable()
        waiting = [
            i for i in range(life.children) if life.kinds[i] == "signal" and i not in signalled
        ]
        actions = [f"run {eid}" for eid in runnable]
        actions += [f"signal {i}" for i in waiting]
        actions += ["timers"] if life.store.timers else []
        if not actions:
            break
        actions += ["kill"] if kills else []
        assert turn < 300, f"no end after {turn} turns: {actions} still to do"
        action = pick(actions)
        if action == "kill":
            kills -= 1
            life.store.trace.append("   the worker is killed")
            life.died()
        elif action.startswith("run "):
            await life.activate(action[4:])
        elif action.startswith("signal "):
            i = int(action[7:])
            while True:
                try:
                    await life.signal_child(i)
                    break
                except Crash:
                    continue
            signalled.add(i)
        else:
            life.fire_timers()
        turn += 1
    if cancel_at is not None and turn < cancel_at:
        return  # everything ended before the cancel would have come
    try:
        life.check_settled(cancelled=cancel_at is not None)
    except AssertionError as exc:
        exc.add_note("\n".join(life.store.trace))
        raise


def test_a_child_that_ended_unheard_is_brought_back() -> None:
    """The child's start loses its marker (its parent dies after ``run.started``); a
    signal runs it to its end, and its worker dies before the notice to the parent.
    The parent, activated again, attaches to the ended child it has not heard from: it
    must restore the child's marker, or it waits for ever. (The machine above finds
    this only with some seeds: it needs both deaths and this order.)"""
    life = Life(children=1, together=False, always_replay=False, kinds=["signal", "", ""])
    deaths = {("run.started", 2): "after", ("run.completed", 1): "after"}
    pick = scripted("run parent", "signal 0", "run c0", "run parent")
    anyio.run(play_family, life, deaths, None, pick)


def scripted(*wanted: str) -> Callable[[list[str]], str]:
    """A ``pick`` that takes ``wanted`` in turn, then the first action left."""
    script = iter(wanted)

    def pick(actions: list[str]) -> str:
        want = next(script, None)
        if want is None:
            return actions[0]
        assert want in actions, (want, actions)
        return want

    return pick


def test_a_cancelled_parent_marks_the_child_it_cancels() -> None:
    """The child's start loses its marker (its parent dies after ``run.started``),
    then the parent is cancelled: its replay does not start the child again, so it
    does not repair the marker; it cancels the child, and the worker dies right after
    the parent ended, before it acted on the child's push. Nothing but a marker the
    cancel wrote brings the child back."""
    life = Life(children=1, together=False, always_replay=False, kinds=["", "", ""])
    deaths = {("run.started", 2): "after"}
    pick = scripted("run parent", "run parent", "kill")
    anyio.run(functools.partial(play_family, life, deaths, 1, pick, kills=1))


# -- keyed objects ----------------------------------------------------------------------

COUNTER = object_id("counter", "k")


class Counter(EmulatedWorker):
    """One scenario of an object: callers queue calls of a counter's handlers (``add``
    changes the state; ``add_step`` runs a step first), may cancel one queued, and
    give the key its active marker as ``ObjectKey`` does (``ensure_active``)."""

    def __init__(self, *, always_replay: bool) -> None:
        super().__init__(always_replay=always_replay)
        handlers = {
            "add": Handler("add", self._add, input_type=int),
            "add_step": Handler("add_step", self._add_step, input_type=int),
        }
        self.registry.add_object(ObjectSpec("counter", handlers, timeout=3600.0))
        self.calls: dict[int, tuple[str, int, str]] = {}  # inbox seq: handler, n, reply
        self.cancelled: set[int] = set()  # inbox seqs a caller cancelled

    # a call's input is 10 * its index + the number it adds (a step's name per call)

    async def _add(self, ctx: ObjectContext, v: int) -> int:
        total = int(ctx.state.get("n", 0)) + v % 10
        ctx.state.set("n", total)
        return total

    async def _add_step(self, ctx: ObjectContext, v: int) -> int:
        step = f"bump-{v // 10}"
        return await self._add(ctx, int(await ctx.step(step, lambda: self._ran(COUNTER, step, v))))

    async def call(self, i: int, handler: str, n: int, *, ensure: bool) -> None:
        """A caller queues a call (its own process: it retries what did not land, with
        the same message ID) and, unless it died first, ensures the key's marker."""
        p, eid = partition_of(COUNTER, PARTITIONS), escape(COUNTER)
        reply = f"reply.{i}"
        data = b"%d" % (10 * i + n)
        body = encode_message(Invoke(handler=handler, input=msgspec.Raw(data), reply=reply))
        while True:
            try:
                seq = await self.store.send_inbox(p, eid, "invoke", body, msg_id=f"call-{i}")
                break
            except Crash:
                continue
        self.calls[seq] = (handler, n, reply)
        if ensure:  # ``ensure_active``: an active marker unless it has one
            if self.store.active.get((p, eid)) != b"{}":
                await MemoryStore.mark_active(self.store, p, eid)
            else:
                self.store.pushed.add(eid)  # its wake hint

    async def cancel(self, seq: int) -> None:
        p, eid = partition_of(COUNTER, PARTITIONS), escape(COUNTER)
        body = encode_message(Cancel(reason="by the test", target=seq))
        await MemoryStore.send_inbox(self.store, p, eid, "cancel", body, msg_id=f"cancel-{seq}")
        self.store.pushed.add(eid)
        self.cancelled.add(seq)
        if self.store.active.get((p, eid)) != b"{}":
            await MemoryStore.mark_active(self.store, p, eid)

    def expire_idle(self) -> None:
        """Idle markers time out (the server removes them)."""
        for key, value in list(self.store.active.items()):
            if value != b"{}":
                del self.store.active[key]

    async def check_settled(self) -> None:
        assert not self.runs_after_stored, f"stored steps ran again: {self.runs_after_stored}"
        eid = escape(COUNTER)
        dones = [
            r
            for r in (decode_record(m.data) for m in self.store.journal(eid))
            if isinstance(r, ObjectDone)
        ]
        seqs = [d.inbox_seq for d in dones]
        assert seqs == sorted(self.calls), f"calls {sorted(self.calls)} ended as {seqs}"
        total = 0
        for done in dones:
            handler, n, _ = self.calls[done.inbox_seq]
            if done.ok:
                total += n
                assert isinstance(done.result, msgspec.Raw)
                assert msgspec.json.decode(bytes(done.result)) == total, (handler, done)
            else:
                assert done.error_type == "fusee.Cancelled", done
                assert done.inbox_seq in self.cancelled, done
        replies = {
            subject: msgspec.json.decode(body)
            for subject, body in self.store.published
            if subject.startswith("reply.")
        }
        for done in dones:
            body = replies.get(self.calls[done.inbox_seq][2])
            assert body is not None, f"the call at {done.inbox_seq} got no reply"
            assert body["seq"] == done.inbox_seq
        snap = await read_object(self.store, "counter", "k")
        assert snap.state == ({"n": b"%d" % total} if total else snap.state), snap.state
        stored = self.store.states.get(("counter", "k"))
        projected = decode_state(stored[0]) if stored else {}
        assert projected.get("n", b"0") == b"%d" % total, f"projection {projected}, total {total}"


@given(
    always_replay=st.booleans(),
    calls=st.lists(
        st.tuples(st.sampled_from(["add", "add_step"]), st.integers(1, 9), st.booleans()),
        min_size=1,
        max_size=4,
    ),
    deaths=st.dictionaries(
        st.tuples(
            st.sampled_from(
                ["obj.started", "step.completed", "obj.done", "state", "idle", "mark", "inbox"]
            ),
            st.integers(min_value=1, max_value=3),
        ),
        st.sampled_from(["before", "after"]),
        max_size=3,
    ),
    kills=st.integers(min_value=0, max_value=2),
    data=st.data(),
)
@machine_settings(examples=1000, steps=1)
def test_every_call_to_a_key_ends_once_whatever_dies_when(
    always_replay: bool,
    calls: list[tuple[str, int, bool]],
    deaths: dict[tuple[str, int], str],
    kills: int,
    data: st.DataObject,
) -> None:
    counter = Counter(always_replay=always_replay)

    async def scenario() -> None:
        nonlocal kills
        counter.store.deaths = dict(deaths)
        made = 0
        turn = 0
        while True:
            runnable = counter.runnable()
            actions = [f"run {eid}" for eid in runnable]
            actions += ["call"] if made < len(calls) else []
            done = {
                r.inbox_seq
                for r in (decode_record(m.data) for m in counter.store.journal(escape(COUNTER)))
                if isinstance(r, ObjectDone)
            }
            queued = [s for s in sorted(counter.calls) if s not in done | counter.cancelled]
            actions += [f"cancel {s}" for s in queued]
            actions += ["expire"] if any(v != b"{}" for v in counter.store.active.values()) else []
            if not runnable and made == len(calls):
                break
            actions += ["kill"] if kills else []
            assert turn < 300, f"no end after {turn} turns: {actions} still to do"
            action = data.draw(st.sampled_from(actions), label="next")
            if action == "kill":
                kills -= 1
                counter.store.trace.append("   the worker is killed")
                counter.died()
            elif action.startswith("run "):
                await counter.activate(action[4:])
            elif action == "call":
                handler, n, ensure = calls[made]
                await counter.call(made, handler, n, ensure=ensure or made == len(calls) - 1)
                made += 1
            elif action.startswith("cancel "):
                await counter.cancel(int(action[7:]))
            else:
                counter.expire_idle()
            turn += 1
        try:
            await counter.check_settled()
        except AssertionError as exc:
            exc.add_note("\n".join(counter.store.trace))
            raise

    anyio.run(scenario)
