"""Calls of ``ctx.step`` from concurrent tasks outside ``ctx.all``, over every
interleaving: the real ``History`` and ``Replayer``, tasks emulated.

Live, a task's next call comes when its step ends, in any order the steps end (drawn).
On replay every call is journaled and returns at once, so each task runs through all
its calls before the next task starts (asyncio's order: the tasks' start order). The
property: a replay either raises ``DeterminismError`` or gives every call the result
it had live; never another task's. And a replay that reaches the calls in the live
order replays without an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusee.errors import DeterminismError
from fusee.runtime.history import Execute, History, Replayed, Replayer
from fusee.runtime.lanes import ROOT, Lanes
from fusee.runtime.records import AnyRecord, RunStarted, StepCompleted, encode_record

Call = tuple[int, int]  # (task, index of the call in the task); task -1 is the root


@dataclass
class Tasks:
    """Which task is calling now, and each task's lane (opened at its first call,
    from the root's: the tasks are started by the workflow's own code)."""

    current: int = -1
    lanes: dict[int, int] = field(default_factory=dict)

    def lane(self, lanes: Lanes) -> int:
        if self.current == -1:
            return ROOT
        if self.current not in self.lanes:
            self.lanes[self.current] = lanes.open(ROOT)
        return self.lanes[self.current]


class Journal:
    def __init__(self) -> None:
        self.history = History("r")
        self.messages: list[tuple[int, bytes]] = []
        self.append(RunStarted(workflow="w", input=msgspec.Raw(b"null"), started_at=0.0))

    def append(self, record: AnyRecord) -> None:
        history = self.history
        prev, prev_hash = history.link()
        record = history.stamp(record)
        record = msgspec.structs.replace(record, prev=prev, prev_hash=prev_hash)
        data = encode_record(record)
        seq = len(self.messages) + 1
        history.add(seq, record, data)
        self.messages.append((seq, data))


def _live(programs: list[list[str]], before: int, ends: list[int], lanes: bool) -> Journal:
    """Run the programs live: ``ends`` picks which running step ends next."""
    journal = Journal()
    replayer = Replayer(journal.history)
    tasks = Tasks()
    if lanes:
        replayer.lane = tasks.lane

    def call(task: int, index: int, name: str) -> int:
        tasks.current = task
        decision = replayer.begin_step(name, "here")
        assert isinstance(decision, Execute)
        return decision.pos

    def end(pos: int, name: str, who: Call) -> None:
        result = msgspec.Raw(msgspec.json.encode(list(who)))
        journal.append(StepCompleted(pos=pos, name=name, result=result))

    for i in range(before):
        end(call(-1, i, "root"), "root", (-1, i))
    running: list[tuple[Call, int]] = []
    for t, program in enumerate(programs):  # started in order, each to its first call
        running.append(((t, 0), call(t, 0, program[0])))
    k = 0
    while running:
        (t, i), pos = running.pop(ends[k % len(ends)] % len(running))
        k += 1
        end(pos, programs[t][i], (t, i))
        if i + 1 < len(programs[t]):
            running.append(((t, i + 1), call(t, i + 1, programs[t][i + 1])))
    end(call(-1, before, "root"), "root", (-1, before))
    return journal


def _replay(
    journal: Journal, programs: list[list[str]], before: int, order: list[Call], lanes: bool
) -> None:
    """Replay the journal, the calls made in ``order``; every result must be its own.

    Raises:
        DeterminismError: the replay noticed the calls come in another order.
    """
    history = History("r")
    for seq, data in journal.messages:
        history.feed(seq, data)
    replayer = Replayer(history)
    tasks = Tasks()
    if lanes:
        replayer.lane = tasks.lane
    for who in order:
        task, index = who
        tasks.current = task
        name = "root" if task == -1 else programs[task][index]
        decision = replayer.begin_step(name, "here")
        assert isinstance(decision, Replayed)
        assert msgspec.json.decode(decision.result) == list(who), (
            f"call {who} was given the result of call {msgspec.json.decode(decision.result)}"
        )


def _fifo(programs: list[list[str]], before: int) -> list[Call]:
    """A replay's order: each task through all its calls, in start order."""
    calls: list[Call] = [(-1, i) for i in range(before)]
    for t, program in enumerate(programs):
        calls += [(t, i) for i in range(len(program))]
    return [*calls, (-1, before)]


def _live_order(journal: Journal, programs: list[list[str]], before: int) -> list[Call]:
    """The order the calls took their positions live."""
    by_pos = {}
    for _, data in journal.messages[1:]:
        record = msgspec.json.decode(data)
        by_pos[record["pos"]] = tuple(msgspec.json.decode(msgspec.json.encode(record["result"])))
    return [by_pos[p] for p in sorted(by_pos)]


programs_st = st.lists(
    st.lists(st.sampled_from(["x", "y"]), min_size=1, max_size=3), min_size=2, max_size=3
)


@settings(max_examples=400, deadline=None)
@given(
    programs=programs_st,
    before=st.integers(0, 1),
    ends=st.lists(st.integers(0, 5), min_size=1, max_size=12),
)
def test_a_replay_is_caught_or_gives_each_call_its_own_result(
    programs: list[list[str]], before: int, ends: list[int]
) -> None:
    journal = _live(programs, before, ends, lanes=True)
    caught: DeterminismError | None = None
    try:
        _replay(journal, programs, before, _fifo(programs, before), lanes=True)
    except DeterminismError as exc:
        caught = exc
    assert caught is None or "concurrent tasks outside ctx.all" in str(caught)
    # the order the calls were made live replays without an error
    _replay(journal, programs, before, _live_order(journal, programs, before), lanes=True)


def test_a_task_running_ahead_gets_caught_not_another_tasks_result() -> None:
    # Two tasks of two calls of one name: live x(a), x(b), then a's second (a ended
    # first). On replay a runs through both of its calls first.
    programs = [["x", "x"], ["x", "x"]]
    journal = _live(programs, 0, [0], lanes=True)
    with pytest.raises(DeterminismError, match="position 2"):
        _replay(journal, programs, 0, _fifo(programs, 0), lanes=True)
    # without lanes (positions alone, as before), a's second call gets b's result
    journal = _live(programs, 0, [0], lanes=False)
    with pytest.raises(
        AssertionError, match=r"call \(0, 1\) was given the result of call \[1, 0\]"
    ):
        _replay(journal, programs, 0, _fifo(programs, 0), lanes=False)


def test_calls_in_one_task_after_another_need_no_after() -> None:
    # one task at a time: every call comes after the one before, nothing is written
    journal = _live([["x"], ["y"]], 1, [0], lanes=True)
    afters = [msgspec.json.decode(d).get("after") for _, d in journal.messages]
    assert afters[:2] == [None, None]  # run.started, the root's step
    assert afters[3] == 1  # the second task's first call comes after the root's
