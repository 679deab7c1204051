"""A state machine that interleaves steps, crashes and replays, against the real actor.

The run actor, its context and the replay core run as they do in a worker; only the
storage under them is in memory (``tests/memory_store.py``), with the same fencing rule
as JetStream (the integration tests run the same code against a real nats-server). Crashes land
before an append, after an append (stored, but the actor never heard back), and inside
a step's function. The invariants are the ones users rely on: a step whose result was
stored never runs again, every run ends with the right result, and the journal is one
unbroken chain with one outcome per position.

Some steps wait for a signal first (``ctx.wait_for``), sent by a rule at any point. A
wait's end rides on the next record instead of its own, so a crash between its
resolution and that record loses it, and the replay resolves it again: the machine
checks that no step's function ever runs on a wait outcome the journal does not hold
yet (one a replay could still change).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import fusee
from fusee.actors.core import ActorCore
from fusee.actors.registry import Registry, Workflow
from fusee.runtime.history import History
from fusee.runtime.inbox import Signal, encode_message
from fusee.runtime.records import (
    RunCompleted,
    RunStarted,
    StepCompleted,
    decode_record,
    encode_record,
)
from tests.memory_store import Crash, MemoryStore, run_actor


class ReplayMachine(RuleBasedStateMachine):
    @initialize(
        steps=st.integers(min_value=1, max_value=6),
        failures=st.lists(st.integers(min_value=0, max_value=2), min_size=6, max_size=6),
        always_replay=st.booleans(),
        waits=st.lists(st.booleans(), min_size=6, max_size=6),
    )
    def setup(
        self, steps: int, failures: list[int], always_replay: bool, waits: list[bool]
    ) -> None:
        self.steps = steps
        self.waits = waits  # step i waits for signal go-i first
        self.signals: dict[int, int] = {}  # signals go-i sent so far (payloads 1, 2, ...)
        self.waited: dict[int, list[int]] = {}  # what each execution's wait i returned
        self.unjournaled: list[str] = []
        self.failures = failures  # attempts that raise before the step succeeds, per step
        self.always_replay = always_replay
        self.started_calls: dict[int, int] = {}
        self.finished_calls: dict[int, int] = {}
        self.calls_when_stored: dict[int, int] = {}
        self.crash_in_step: int | None = None
        self.keys: dict[int, set[str]] = {}
        self.ended = False
        self.seen: dict[int, list[tuple[Any, ...]]] = {}  # ctx.now/random/uuid before step i
        self.time = 1_800_000_000.0
        self.store = MemoryStore(on_stored=self._stored)
        start = RunStarted(workflow="machine", input=msgspec.Raw(b"0"), started_at=0.0)
        self.store.seed("r", encode_record(start))
        self.registry = Registry()
        self.registry.add(Workflow("machine", self._workflow, Any, True))

    def _stored(self, record: object) -> None:
        if isinstance(record, StepCompleted):  # step-i (a wait takes a position too)
            i = int(record.name.removeprefix("step-"))
            self.calls_when_stored[i] = self.started_calls.get(i, 0)

    async def _workflow(self, ctx: fusee.Context, _arg: Any) -> int:
        total = 0
        for i in range(1, self.steps + 1):
            got = 0
            if self.waits[i - 1]:
                got = await ctx.wait_for(f"go-{i}")
                self.waited.setdefault(i, []).append(got)
                total += got

            async def body(s: fusee.StepInfo, i: int = i, got: int = got) -> int:
                journaled = self._journaled_wait(i) if self.waits[i - 1] else got
                if journaled != got:  # (an assert here would be the step's error, retried)
                    self.unjournaled.append(f"step {i} ran on go-{i} = {got}, journal: {journaled}")
                n = self.started_calls.get(i, 0) + 1
                self.started_calls[i] = n
                self.keys.setdefault(i, set()).add(s.key)
                if self.crash_in_step == n and self._crash_pos == i:
                    raise Crash
                if s.attempt <= self.failures[i - 1]:
                    raise RuntimeError(f"attempt {s.attempt} of step {i} fails")
                self.finished_calls[i] = self.finished_calls.get(i, 0) + 1
                return i * 10

            self.seen.setdefault(i, []).append((ctx.now(), ctx.random(), ctx.uuid()))
            total += await ctx.step(
                f"step-{i}", body, retry=fusee.Retry(attempts=10, initial=0, max=0)
            )
        return total

    _crash_pos = 0

    def _journaled_wait(self, i: int) -> int | None:
        history = History("r")
        for m in self.store.journal("r"):
            history.feed(m.seq, m.data)
        for done in history.waited.values():
            if done.name == f"go-{i}":
                return int(msgspec.json.decode(bytes(done.value)))
        return None

    def _segment(self) -> None:
        actor = run_actor(
            self.store,
            self.registry,
            clock=self._clock,
            always_replay=self.always_replay,
            park_after=0.0,  # a wait without its signal parks the run at once
        )

        async def go() -> None:
            try:
                with anyio.fail_after(2):  # a replay loop that never ends is a failure
                    outcome = await actor.run()
                self.ended = outcome == "ended"
            except Crash:
                pass

        anyio.run(go)
        self.store.appends = 0
        self.store.crash_before_append = self.store.crash_after_append = None
        self.crash_in_step = None

    def _clock(self) -> float:
        self.time += 0.001
        return self.time

    @rule(n=st.integers(min_value=1, max_value=8))
    def crash_before_an_append(self, n: int) -> None:
        self.store.crash_before_append = n
        self._segment()

    @rule(n=st.integers(min_value=1, max_value=8))
    def crash_after_an_append(self, n: int) -> None:
        self.store.crash_after_append = n
        self._segment()

    @rule(pos=st.integers(min_value=1, max_value=6), call=st.integers(min_value=1, max_value=3))
    def crash_inside_a_step(self, pos: int, call: int) -> None:
        self._crash_pos = pos
        self.crash_in_step = self.started_calls.get(pos, 0) + call
        self._segment()

    @rule(i=st.integers(min_value=1, max_value=6))
    def send_a_signal(self, i: int) -> None:
        n = self.signals[i] = self.signals.get(i, 0) + 1
        body = encode_message(Signal(name=f"go-{i}", payload=msgspec.Raw(str(n).encode())))
        self.store._to_inbox(0, "r", body)

    @rule()
    def run_without_crash(self) -> None:
        for i in range(1, self.steps + 1):
            if self.waits[i - 1] and i not in self.signals:
                self.send_a_signal(i)
        self._segment()
        assert self.ended, "a run without crashes must reach its end"

    @invariant()
    def a_stored_step_never_runs_again(self) -> None:
        for pos, calls in self.calls_when_stored.items():
            assert self.started_calls[pos] == calls, f"step {pos} ran after its result was stored"

    @invariant()
    def the_journal_is_one_chain_with_one_outcome_per_position(self) -> None:
        history = History("r")
        for m in self.store.journal("r"):
            history.feed(m.seq, m.data)  # raises JournalGap on a broken link
        positions: list[int] = [
            decode_record(m.data).pos  # type: ignore[union-attr,misc]
            for m in self.store.journal("r")
            if isinstance(decode_record(m.data), StepCompleted)
        ]
        assert len(positions) == len(set(positions))
        assert positions == sorted(positions)

    @invariant()
    def values_are_the_journaled_ones_once_journaled(self) -> None:
        # A value lost before any commit carried it may differ; from the one journaled
        # on, every replay returns exactly it.
        history = History("r")
        for m in self.store.journal("r"):
            history.feed(m.seq, m.data)
        flat = [v.value for v in history.values]
        for i in range(len(flat) // 3):
            now, rnd, uid = flat[3 * i : 3 * i + 3]
            journaled = (datetime.fromtimestamp(float(now), UTC), rnd, UUID(str(uid)))
            seen = self.seen[i + 1]
            assert journaled in seen, f"values before step {i + 1} were never handed out"
            after = seen[seen.index(journaled) :]
            assert all(v == journaled for v in after), f"values before step {i + 1}: {seen}"

    @invariant()
    def no_step_runs_on_a_wait_a_replay_could_change(self) -> None:
        # what the code decided on is durable before anything it does
        assert not self.unjournaled, self.unjournaled

    @invariant()
    def each_wait_takes_the_first_signal_of_its_name(self) -> None:
        # signals are kept in order: every execution of wait i took the first one
        for i, seen in self.waited.items():
            assert set(seen) == {1}, f"wait go-{i} returned {seen}"

    @invariant()
    def each_step_keeps_one_key(self) -> None:
        for pos, keys in self.keys.items():
            assert len(keys) == 1, f"step {pos} saw keys {keys}"

    @invariant()
    def an_ended_run_has_the_right_result(self) -> None:
        last = decode_record(self.store.journal("r")[-1].data)
        if isinstance(last, RunCompleted):
            expected = sum(i * 10 + self.waits[i - 1] for i in range(1, self.steps + 1))
            assert msgspec.json.decode(bytes(last.result)) == expected
            for pos in range(1, self.steps + 1):
                assert self.finished_calls.get(pos, 0) >= 1


TestReplayMachine = ReplayMachine.TestCase


def test_the_machine_finds_a_wait_left_unjournaled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put back a missing flush (a step's function runs with a wait's end not
    journaled yet): the machine must find it."""
    original = ActorCore.before_step

    async def without_flush(self: ActorCore) -> None:
        saved, self.history.resolved = self.history.resolved, []
        try:
            await original(self)
        finally:
            self.history.resolved[:0] = saved

    monkeypatch.setattr(ActorCore, "before_step", without_flush)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            ReplayMachine,
            settings=settings(
                max_examples=300,
                derandomize=True,
                database=None,
                phases=[Phase.generate],
                deadline=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
