"""ctx.now(), ctx.random(), ctx.uuid(): journaled values, handed out in call order.

History/Replayer level first (pure), then the real actor over the in-memory store
(``tests/memory_store.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import anyio
import msgspec
import pytest

import fusee
from fusee.actors.registry import Registry, Workflow
from fusee.actors.run_actor import RunActor
from fusee.errors import DeterminismError
from fusee.runtime.history import History, Replayer
from fusee.runtime.records import (
    RunCompleted,
    RunFailed,
    RunStarted,
    StepCompleted,
    Value,
    decode_record,
    encode_record,
)
from tests.memory_store import MemoryStore, run_actor
from tests.unit.test_history import START, done, journal, load


def never() -> float:
    raise AssertionError("a replayed value must not be made again")


def test_live_values_wait_in_pending_until_a_record_carries_them() -> None:
    history = load(journal(START))
    replayer = Replayer(history)
    assert replayer.take_value("now", lambda: 12.5, "here") == 12.5
    assert replayer.take_value("uuid", lambda: "u-1", "here") == "u-1"
    assert history.pending == [Value("now", 12.5), Value("uuid", "u-1")]
    assert history.take_pending() == [Value("now", 12.5), Value("uuid", "u-1")]
    assert history.pending == []


def test_replay_returns_the_journaled_values_in_order_then_makes_new_ones() -> None:
    values = [Value("now", 12.5), Value("random", 0.25), Value("uuid", "u-1")]
    history = load(journal(START, msgspec.structs.replace(done(1, "a"), values=values)))
    assert history.values == values
    replayer = Replayer(history)
    assert replayer.take_value("now", never, "here") == 12.5
    assert replayer.take_value("random", never, "here") == 0.25
    assert replayer.take_value("uuid", never, "here") == "u-1"
    replayer.begin_step("a", "here")
    assert replayer.take_value("now", lambda: 99.0, "here") == 99.0  # past the journal: live
    assert history.pending == [Value("now", 99.0)]
    replayer.check_finished("the end")


def test_another_kind_of_value_at_the_same_index_is_a_determinism_error() -> None:
    history = load(
        journal(START, msgspec.structs.replace(done(1, "a"), values=[Value("uuid", "u")]))
    )
    replayer = Replayer(history)
    with pytest.raises(
        DeterminismError, match=r"value 1 is ctx\.uuid\(\).*calls ctx\.now\(\) at wf\.py:3"
    ):
        replayer.take_value("now", never, "wf.py:3")
    with pytest.raises(DeterminismError):  # stays broken
        replayer.begin_step("a", "wf.py:4")


def test_journaled_values_the_code_no_longer_takes_are_a_determinism_error() -> None:
    values = [Value("now", 1.0), Value("random", 0.5)]
    history = load(journal(START, msgspec.structs.replace(done(1, "a"), values=values)))
    replayer = Replayer(history)
    replayer.begin_step("a", "wf.py:1")
    replayer.take_value("now", never, "wf.py:2")
    with pytest.raises(DeterminismError, match=r"value 2 \(ctx\.random\(\)\).*after taking 1"):
        replayer.check_finished("the end")


def test_a_record_without_values_keeps_its_bytes_and_one_with_values_round_trips() -> None:
    rec = StepCompleted(pos=1, name="a", result=msgspec.Raw(b"1"))
    assert b"values" not in encode_record(rec)
    with_values = msgspec.structs.replace(rec, values=[Value("now", 1.5), Value("uuid", "x")])
    data = encode_record(with_values)
    assert data.endswith(b',"values":[["now",1.5],["uuid","x"]]}')
    back = decode_record(data)
    assert back.values == [Value("now", 1.5), Value("uuid", "x")]
    assert encode_record(back) == data


# -- the real actor ---------------------------------------------------------------


def _actor(store: MemoryStore, fn: Any, *, always_replay: bool, clock: Any) -> RunActor:
    registry = Registry()
    registry.add(Workflow("values", fn, Any, True))
    return run_actor(store, registry, clock=clock, always_replay=always_replay)


def _store() -> MemoryStore:
    store = MemoryStore()
    start = RunStarted(workflow="values", input=msgspec.Raw(b"0"), started_at=0.0)
    store.seed("r", encode_record(start))
    return store


@pytest.mark.parametrize("always_replay", [False, True])
def test_the_actor_returns_the_same_values_on_replay(always_replay: bool) -> None:
    seen: list[tuple[datetime, float, UUID]] = []
    ticks = iter(range(1_800_000_000, 1_900_000_000))

    async def wf(ctx: fusee.Context, _arg: Any) -> str:
        first = (ctx.now(), ctx.random(), ctx.uuid())
        seen.append(first)
        await ctx.step("a", lambda: 1)
        await ctx.step("b", lambda: 2)
        later = ctx.now()
        return f"{first[2]} {later.isoformat()}"

    store = _store()
    outcome = anyio.run(
        _actor(store, wf, always_replay=always_replay, clock=lambda: next(ticks) + 0.25).run
    )
    assert outcome == "ended"
    records = [decode_record(m.data) for m in store.journal("r")]
    assert len(set(seen)) == 1  # replays (always_replay) saw the first values again
    now, rnd, uid = seen[0]
    assert now.tzinfo is UTC
    assert now.microsecond == 250_000
    assert 0.0 <= rnd < 1.0
    assert uid.version == 4
    first_step = records[1]
    assert isinstance(first_step, StepCompleted)
    assert first_step.values == [
        Value("now", now.timestamp()),
        Value("random", rnd),
        Value("uuid", str(uid)),
    ]
    end = records[-1]
    assert isinstance(end, RunCompleted)
    assert isinstance(end.values, list)
    assert [v.kind for v in end.values] == ["now"]
    later = datetime.fromtimestamp(float(end.values[0].value), UTC)
    assert msgspec.json.decode(bytes(end.result)) == f"{uid} {later.isoformat()}"


def test_a_value_taken_inside_a_step_fails_the_step_at_once() -> None:
    async def wf(ctx: fusee.Context, _arg: Any) -> Any:
        return await ctx.step("inner", lambda: ctx.uuid(), retry=fusee.Retry(attempts=5))

    store = _store()
    assert anyio.run(_actor(store, wf, always_replay=False, clock=lambda: 1.0).run) == "ended"
    end = decode_record(store.journal("r")[-1].data)
    assert isinstance(end, RunFailed)
    assert "ctx.uuid() was called inside step 'inner'" in end.message
    assert len(store.journal("r")) == 3  # step.failed after one attempt, then run.failed


def test_history_folds_values_from_any_record() -> None:
    history = History("r")
    for seq, data in journal(
        START, RunCompleted(result=msgspec.Raw(b"1"), values=[Value("random", 0.5)])
    ):
        history.feed(seq, data)
    assert history.values == [Value("random", 0.5)]


def test_runs_show_lists_the_values_a_record_carries() -> None:
    from fusee.adapters.cli.render import format_record

    rec = StepCompleted(
        pos=1,
        name="book",
        result=msgspec.Raw(b'"ok"'),
        values=[Value("now", 1796090000.5), Value("random", 0.25), Value("uuid", "5f0c")],
    )
    assert format_record(rec).endswith(
        '-> "ok"  [took now 2026-12-01 01:53:20.500000 UTC, random 0.25, uuid 5f0c]'
    )
    assert "took" not in format_record(msgspec.structs.replace(rec, values=msgspec.UNSET))
