"""The replay core's part in ctx.all / ctx.race: cancelled calls and position hooks."""

from __future__ import annotations

import msgspec
import pytest

from fusee.errors import DeterminismError
from fusee.runtime.history import History, ReplayedCancel, Replayer
from fusee.runtime.records import (
    AnyRecord,
    CallCancelled,
    RunStarted,
    StepCompleted,
    WaitStarted,
    decode_record,
    encode_record,
    record_hash,
)


def _history(*records: AnyRecord) -> History:
    history = History("r")
    prev, prev_hash = 0, ""
    for seq, rec in enumerate(
        (RunStarted(workflow="w", input=msgspec.Raw(b"null"), started_at=0.0), *records),
        start=1,
    ):
        data = encode_record(msgspec.structs.replace(rec, prev=prev, prev_hash=prev_hash))
        history.feed(seq, data)
        prev, prev_hash = seq, record_hash(data)
    return history


def test_call_cancelled_round_trips_with_defaults() -> None:
    rec = CallCancelled(pos=2, name="model:large")
    assert decode_record(encode_record(rec)) == rec
    assert (rec.call, rec.reason) == ("step", "")


def test_a_cancelled_step_or_wait_is_cancelled_again_on_replay() -> None:
    history = _history(
        StepCompleted(pos=1, name="fast", result=msgspec.Raw(b'"A"')),
        WaitStarted(pos=3, name="limit", wait="sleep", until=5.0),
        CallCancelled(pos=2, name="large", reason="lost ctx.race to 'fast'"),
        CallCancelled(pos=3, name="limit", call="sleep"),
    )
    assert history.ends == {1: 2, 2: 4, 3: 5}
    replayer = Replayer(history)
    replayer.begin_step("fast", "here")
    with pytest.raises(ReplayedCancel) as lost:
        replayer.begin_step("large", "here")
    assert lost.value.record.pos == 2
    with pytest.raises(ReplayedCancel):
        replayer.begin_wait("limit", "sleep", "here")
    assert replayer.next_pos == 4


def test_a_cancelled_position_still_checks_the_name() -> None:
    history = _history(CallCancelled(pos=1, name="large"))
    with pytest.raises(DeterminismError):
        Replayer(history).begin_step("other", "here")
    with pytest.raises(DeterminismError):
        Replayer(history).begin_wait("large", "signal", "here")


def test_a_refused_position_is_not_taken() -> None:
    replayer = Replayer(_history())
    seen: list[tuple[int, str, str]] = []

    def hook(pos: int, call: str, name: str) -> None:
        if name == "no":
            raise RuntimeError("refused")
        seen.append((pos, call, name))

    replayer.on_position = hook
    replayer.begin_step("a", "here")
    with pytest.raises(RuntimeError):
        replayer.begin_wait("no", "signal", "here")
    replayer.begin_wait("b", "sleep", "here")
    assert seen == [(1, "step", "a"), (2, "sleep", "b")]
