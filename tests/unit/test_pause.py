"""The pure parts of pausing and resuming: what a step's pause and a resume do to the
history (``runtime/history.py``), the retry policy's ``on_exhausted``, and the
workflow's ``retry=`` / ``max_steps=`` checks."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fusee
from fusee.errors import ConfigError, JournalGap
from fusee.runtime.history import Execute, History, Replayer, load_journal
from fusee.runtime.records import (
    AnyRecord,
    RunPaused,
    RunResumed,
    RunStarted,
    StepCompleted,
    StepRetrying,
    encode_record,
)
from fusee.runtime.retry import Retry
from tests.machines import machine_settings

START = RunStarted(workflow="wf", input=msgspec.Raw(b"null"), started_at=1.0)


def _journal(records: list[AnyRecord]) -> list[tuple[int, bytes]]:
    """``records`` linked as a writer links them: ``(seq, data)``."""
    out: list[tuple[int, bytes]] = []
    history = History("r")
    for seq, record in enumerate(records, 1):
        prev, prev_hash = history.link()
        linked = msgspec.structs.replace(record, prev=prev, prev_hash=prev_hash)
        data = encode_record(linked)
        history.add(seq, linked, data)
        out.append((seq, data))
    return out


def _pause(pos: int, attempts: int) -> RunPaused:
    return RunPaused(reason="out", cause="retries", pos=pos, step="s", attempts=attempts)


def _retry(pos: int, attempt: int) -> StepRetrying:
    return StepRetrying(
        pos=pos, name="s", attempt=attempt, error_type="E", message="m", retry_in=0.1
    )


@given(budgets=st.lists(st.integers(1, 4), min_size=1, max_size=4), tail=st.integers(0, 3))
@machine_settings(examples=200, steps=1)
def test_each_resume_gives_the_step_a_fresh_budget(budgets: list[int], tail: int) -> None:
    """A step that paused after each of ``budgets`` (its attempts per budget), resumed
    each time, then failed ``tail`` more attempts: the next attempt is numbered after
    all of them, and only the ``tail`` ones count against the policy."""
    records: list[AnyRecord] = [START]
    attempt = 0
    for n in budgets:
        for _ in range(n - 1):
            attempt += 1
            records.append(_retry(1, attempt))
        attempt += 1
        records.append(_pause(1, n))
        records.append(RunResumed(paused=len(records)))  # names the pause just appended
    for _ in range(tail):
        attempt += 1
        records.append(_retry(1, attempt))
    history = History("r")
    load_journal(history, _journal(records))
    assert history.paused is None
    decision = Replayer(history).begin_step("s", "here")
    assert isinstance(decision, Execute)
    assert decision.attempt == attempt + 1  # s.attempt goes on counting
    assert decision.attempt - decision.base == tail + 1  # the policy's count: this budget
    # the journaled wait is only the fresh budget's (a resume does not wait out the last)
    assert (decision.last_retry is None) == (tail == 0)


def test_a_stale_resume_changes_nothing() -> None:
    records: list[AnyRecord] = [START, _pause(1, 3), RunResumed(paused=1)]  # not the pause
    history = History("r")
    load_journal(history, _journal(records))
    assert history.paused is not None
    assert history.paused_seq == 2
    decision = Replayer(history).begin_step("s", "here")
    assert isinstance(decision, Execute)
    assert decision.base == 0


def test_a_paused_step_named_otherwise_is_a_determinism_error() -> None:
    """A step that paused at its first attempt (no step.retrying) still names its
    position: code that calls another step there is caught."""
    history = History("r")
    load_journal(history, _journal([START, _pause(1, 1), RunResumed(paused=2)]))
    with pytest.raises(fusee.DeterminismError, match="'s' in the journal"):
        Replayer(history).begin_step("other", "here")


def test_a_forced_resume_accepts_the_break_it_names() -> None:
    good = _journal([START, StepCompleted(pos=1, name="a", result=msgspec.Raw(b"1"))])
    forged = StepCompleted(pos=2, name="b", result=msgspec.Raw(b"2"), prev=9, prev_hash="x")
    broken = [*good, (3, encode_record(forged))]
    with pytest.raises(JournalGap) as gap:
        load_journal(History("r"), broken)
    assert gap.value.seq == 3
    # the forced resume, linked to the forged record (as the worker appends it)
    history = History("r")
    history.forgive = 3
    load_journal(history, broken)
    prev, prev_hash = history.link()
    resumed = RunResumed(force=True, gap=3, prev=prev, prev_hash=prev_hash)
    later = [*broken, (4, encode_record(resumed))]
    again = History("r")
    load_journal(again, later)  # read back: the break is accepted from the journal
    assert again.forgiven == 3
    assert set(again.outcomes) == {1, 2}
    # one that names an earlier break does not accept a later one
    short = RunResumed(force=True, gap=2, prev=prev, prev_hash=prev_hash)
    with pytest.raises(JournalGap):
        load_journal(History("r"), [*broken, (4, encode_record(short))])


def test_retry_on_exhausted_is_checked() -> None:
    with pytest.raises(ConfigError, match="on_exhausted='sometimes'"):
        Retry(on_exhausted="sometimes")  # type: ignore[arg-type]
    policy = Retry(attempts=2, on_exhausted="pause")
    assert not policy.pauses_on(1, ValueError())
    assert policy.pauses_on(2, ValueError())
    assert not policy.pauses_on(2, fusee.FatalError("no"))  # fails the step either way
    assert not Retry(attempts=2).pauses_on(2, ValueError())
    assert not Retry(attempts=2, non_retryable=[KeyError], on_exhausted="pause").pauses_on(
        2, KeyError()
    )


@pytest.mark.parametrize("bad", [0, -1, 2.5, "3", True])
def test_max_steps_is_checked(bad: object) -> None:
    with pytest.raises(ConfigError, match=f"max_steps={bad!r}"):
        fusee.workflow("pz_bad", max_steps=bad)  # type: ignore[arg-type]


def test_a_workflow_retry_must_be_a_retry() -> None:
    with pytest.raises(ConfigError, match=r"must be a fusee\.Retry"):
        fusee.workflow("pz_bad", retry={"attempts": 3})  # type: ignore[arg-type]
