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

from typing import Any

import anyio
import msgspec
from hypothesis import given
from hypothesis import strategies as st

import fusee
from fusee.actors.core import ActorCore
from fusee.actors.registry import Registry, Workflow
from fusee.actors.run_actor import RunActor
from fusee.actors.starts import start_or_attach
from fusee.errors import Evicted
from fusee.runtime.ids import escape, partition_of, unescape
from fusee.runtime.inbox import Cancel, encode_message, signal_message
from fusee.runtime.index import decode_info
from fusee.runtime.records import (
    TERMINAL,
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

    async def append(self, eid: str, kind: str, data: bytes, *, fence: int, msg_id: str) -> int:
        self._write("before", kind, f"append to {eid}")
        seq = await super().append(eid, kind, data, fence=fence, msg_id=msg_id)
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
        seq = await super().send_inbox(partition, eid, kind, body, msg_id=msg_id)
        self.pushed.add(eid)  # the inbox consumer's push
        self._write("after", "inbox")
        return seq

    async def wake(self, partition: int, eid: str) -> None:
        await super().wake(partition, eid)
        self.pushed.add(eid)  # a wake hint on core NATS

    async def schedule_timer(
        self, eid: str, partition: int, pos: int, until: float, *, start: int = 0
    ) -> None:
        self._write("before", "timer", f"timer of {eid}")
        await super().schedule_timer(eid, partition, pos, until, start=start)
        self._write("after", "timer")


class Life:
    """One scenario: the workflows, the store, the emulated worker, what was seen."""

    def __init__(
        self, *, children: int, together: bool, always_replay: bool, kinds: list[str]
    ) -> None:
        self.children = children
        self.kinds = kinds  # what child i does before its step: "", "signal" or "sleep"
        self.together = together
        self.always_replay = always_replay
        self.store = DyingStore()
        self.store.deaths, self.store.counts, self.store.stored_steps = {}, {}, set()
        self.store.pushed, self.store.trace = set(), []
        self.runs_after_stored: list[str] = []  # steps whose function ran once stored
        self.time = 1_800_000_000.0
        self.parked: dict[str, int] = {}  # the worker's parked actors: where each left
        self.registry = Registry()
        self.registry.add(Workflow("parent", self._parent, int, True))
        self.registry.add(Workflow("child", self._child, int, True))

    def clock(self) -> float:
        self.time += 0.001
        return self.time

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
        if self.kinds[i] == "signal":
            await ctx.wait_for("go")
        elif self.kinds[i] == "sleep":
            await ctx.sleep(60)
        return int(await ctx.step("work", lambda: self._ran(ctx.run_id, "work", i * 10)))

    def _ran(self, run_id: str, step: str, value: int) -> int:
        if f"{escape(run_id)}:{step}" in self.store.stored_steps:
            self.runs_after_stored.append(f"{run_id}:{step}")
        return value

    # -- the emulated worker ------------------------------------------------------------

    def runnable(self) -> list[str]:
        """What a worker would activate now: marked actors it has not parked, parked
        ones whose inbox holds something past where they left, and those it was poked
        for (a message pushed by the inbox consumer, a wake hint) since it started."""
        marked = sorted(eid for (_, eid) in self.store.active)
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
        try:
            with anyio.fail_after(10):
                outcome = await RunActor(registry=self.registry, core=core).run()
        except Crash:
            self.died()
            return
        except Evicted:
            return
        if outcome == "parked":
            self.parked[eid] = core.left_at
        elif outcome in ("ended", "paused"):
            try:
                await self.store.clear_active(p, eid)
            except Crash:
                self.died()
        else:  # pragma: no cover - a run here is never unrunnable nor idle
            raise AssertionError(f"{run_id}: unexpected outcome {outcome!r}")

    def died(self) -> None:
        """The process died: what it held in memory is gone (its parked actors, the
        pokes it had not acted on: a new process's inbox consumer delivers only new
        messages), what landed in the store stays."""
        self.parked.clear()
        self.store.pushed.clear()

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
            entry = self.store.index.get(eid)
            assert entry is not None, f"run {run_id!r} has no index entry"
            assert entry[0], f"run {run_id!r} has an empty index entry"
            status = decode_info(entry[0]).status
            expect = "completed" if isinstance(end, RunCompleted) else "cancelled"
            assert status == expect, f"{run_id}: indexed {status!r}, journal {expect!r}"
            assert (partition_of(run_id, PARTITIONS), eid) not in self.store.active, (
                f"ended run {run_id!r} kept its active marker"
            )
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
    kinds=st.lists(st.sampled_from(["", "signal", "sleep"]), min_size=3, max_size=3),
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
    data=st.data(),
)
@machine_settings(examples=400, steps=1)
def test_every_run_of_a_family_ends_whatever_dies_when(
    children: int,
    kinds: list[str],
    together: bool,
    always_replay: bool,
    deaths: dict[tuple[str, int], str],
    cancel_at: int | None,
    data: st.DataObject,
) -> None:
    life = Life(children=children, together=together, always_replay=always_replay, kinds=kinds)

    async def scenario() -> None:
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
            waiting = [i for i in range(children) if kinds[i] == "signal" and i not in signalled]
            actions = [f"run {eid}" for eid in runnable]
            actions += [f"signal {i}" for i in waiting]
            actions += ["timers"] if life.store.timers else []
            if not actions:
                break
            assert turn < 300, f"no end after {turn} turns: {actions} still to do"
            action = data.draw(st.sampled_from(actions), label="next")
            if action.startswith("run "):
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

    anyio.run(scenario)
