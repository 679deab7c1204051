"""Generations (continue-as-new) in History, and which records a regenerated run reuses."""

from __future__ import annotations

import msgspec

from fusee.runtime.history import History
from fusee.runtime.records import (
    AnyRecord,
    RunCancelled,
    RunContinued,
    RunStarted,
    StepCompleted,
    StepRetrying,
    Value,
    WaitDone,
    WaitStarted,
    decode_record,
    encode_record,
)
from fusee.runtime.reuse import reusable, reusable_prefix

RAW = msgspec.Raw(b"1")


def _started() -> RunStarted:
    return RunStarted(workflow="w", input=RAW, started_at=1.0)


def _step(pos: int, name: str = "s", values: list[Value] | None = None) -> StepCompleted:
    extra = {"values": values} if values else {}
    return StepCompleted(pos=pos, name=name, result=RAW, **extra)  # type: ignore[arg-type]


def _feed(records: list[AnyRecord]) -> History:
    history = History("r")
    for seq, record in enumerate(records, start=1):
        prev, prev_hash = history.link()
        data = encode_record(msgspec.structs.replace(record, prev=prev, prev_hash=prev_hash))
        history.feed(seq, data)
    return history


def test_run_continued_round_trips_and_is_a_start() -> None:
    record = RunContinued(workflow="w", input=RAW, started_at=1.0, generation=3)
    again = decode_record(encode_record(record))
    assert isinstance(again, RunContinued)
    assert isinstance(again, RunStarted)
    assert again.generation == 3
    assert b'"kind":"run.continued"' in encode_record(record)


def test_history_folds_only_the_last_generation() -> None:
    v = Value("random", 0.5)
    history = _feed(
        [
            _started(),
            _step(1, values=[v]),
            _step(2),
            RunContinued(workflow="w", input=msgspec.Raw(b"2"), started_at=1.0),
            _step(1, "t"),
        ]
    )
    assert history.generation == 2
    assert history.started_seq == 4
    assert bytes(history.started.input) == b"2"  # type: ignore[union-attr]
    assert set(history.outcomes) == {1}
    assert history.outcomes[1].name == "t"
    assert history.values == []
    assert (history.size, history.generation_size) == (5, 2)
    assert history.size_at == {1: 2}
    assert not history.ended


def test_reuse_takes_the_finished_prefix_and_moves_values() -> None:
    v1, v2 = Value("now", 1.0), Value("uuid", "x")
    records: list[AnyRecord] = [
        _started(),
        _step(1),
        WaitStarted(pos=2, name="approval", wait="signal"),
        WaitDone(pos=2, name="approval", wait="signal", inbox_seq=9),
        StepRetrying(
            pos=3, name="model", attempt=1, error_type="E", message="m", retry_in=1, values=[v1]
        ),
        _step(4, values=[v2]),  # finished after a call that did not: not reused
        RunCancelled(reason="interrupted"),
    ]
    assert reusable_prefix(records) == 2
    out = reusable(records)
    assert [type(r).__name__ for r in out] == ["StepCompleted", "WaitStarted", "WaitDone"]
    assert isinstance(out[2], WaitDone)
    assert out[2].inbox_seq == 0
    assert reusable_prefix(records, upto=1) == 1
    # values on a record left out (a parallel branch's) move to the next copied one
    parallel: list[AnyRecord] = [
        _started(),
        _step(1),
        StepRetrying(
            pos=3, name="b", attempt=1, error_type="E", message="m", retry_in=1, values=[v1]
        ),
        _step(2, values=[v2]),
        RunCancelled(reason="interrupted", values=[Value("now", 2.0)]),
    ]
    out = reusable(parallel)
    assert [r.values for r in out] == [msgspec.UNSET, [v1, v2]]


def test_reuse_stops_at_a_compensation_and_reads_the_last_generation() -> None:
    records: list[AnyRecord] = [
        _started(),
        _step(1, "old"),
        RunContinued(workflow="w", input=RAW, started_at=1.0),
        _step(1, "a", values=[Value("random", 0.1)]),
        _step(2, "compensate:undo"),
        RunCancelled(reason="x"),
    ]
    out = reusable(records)
    assert [r.name for r in out if isinstance(r, StepCompleted)] == ["a"]
