"""The pure core: history folding, chain checks and replay decisions."""

from __future__ import annotations

import msgspec
import pytest

from fusee.errors import DeterminismError, JournalGap
from fusee.runtime.history import (
    Execute,
    History,
    Replayed,
    ReplayedFailure,
    Replayer,
    load_journal,
)
from fusee.runtime.records import (
    AnyRecord,
    CallCancelled,
    RunCompleted,
    RunResumed,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepRetrying,
    WaitDone,
    WaitStarted,
    encode_record,
)


def journal(*records: AnyRecord) -> list[tuple[int, bytes]]:
    """Encode records with correct links, at stream sequences 10, 20, 30..."""
    out: list[tuple[int, bytes]] = []
    history = History("r")
    for i, rec in enumerate(records):
        prev, prev_hash = history.link()
        data = encode_record(msgspec.structs.replace(rec, prev=prev, prev_hash=prev_hash))
        seq = (i + 1) * 10
        history.feed(seq, data)
        out.append((seq, data))
    return out


START = RunStarted(workflow="agent", input=msgspec.Raw(b'"q"'), started_at=1.0)


def done(pos: int, name: str, value: bytes = b"1") -> StepCompleted:
    return StepCompleted(pos=pos, name=name, result=msgspec.Raw(value))


def load(entries: list[tuple[int, bytes]]) -> History:
    history = History("r")
    for seq, data in entries:
        history.feed(seq, data)
    return history


def test_replay_returns_journaled_results_then_executes_the_next_step() -> None:
    history = load(journal(START, done(1, "plan", b'"p"'), done(2, "answer", b'"a"')))
    replayer = Replayer(history)
    assert replayer.begin_step("plan", "x.py:1") == Replayed(1, b'"p"')
    assert replayer.begin_step("answer", "x.py:2") == Replayed(2, b'"a"')
    decision = replayer.begin_step("tool", "x.py:3")
    assert decision == Execute(3, 1, None)


def test_failed_attempts_carry_on_after_a_crash() -> None:
    retry = StepRetrying(pos=1, name="plan", attempt=1, error_type="E", message="m", retry_in=0.5)
    retry2 = StepRetrying(pos=1, name="plan", attempt=2, error_type="E", message="m", retry_in=1.0)
    history = load(journal(START, retry, retry2))
    decision = Replayer(history).begin_step("plan", "x.py:1")
    assert isinstance(decision, Execute)
    assert decision.attempt == 3
    assert decision.last_retry is not None
    assert decision.last_retry.retry_in == 1.0


def test_a_journaled_failure_replays_as_a_failure() -> None:
    failed = StepFailed(pos=1, name="plan", attempt=3, error_type="ValueError", message="bad")
    history = load(journal(START, failed))
    decision = Replayer(history).begin_step("plan", "x.py:1")
    assert isinstance(decision, ReplayedFailure)
    assert decision.record.error_type == "ValueError"


def test_a_renamed_step_names_both_calls_and_the_code_location() -> None:
    history = load(journal(START, done(1, "plan"), done(2, "answer")))
    replayer = Replayer(history)
    replayer.begin_step("plan", "agent.py:10")
    with pytest.raises(DeterminismError) as err:
        replayer.begin_step("respond", "agent.py:11")
    message = str(err.value)
    assert "'answer'" in message
    assert "'respond'" in message
    assert "agent.py:11" in message
    assert "step 2" in message


def test_code_that_returns_before_the_journaled_steps_is_a_determinism_error() -> None:
    history = load(journal(START, done(1, "plan"), done(2, "answer")))
    replayer = Replayer(history)
    replayer.begin_step("plan", "agent.py:10")
    with pytest.raises(DeterminismError, match="'answer'"):
        replayer.check_finished("agent.py:12")


@pytest.mark.parametrize(
    ("beyond", "named"),
    [
        (WaitStarted(pos=2, name="approval", wait="signal"), "call 2 (signal 'approval')"),
        (
            WaitDone(pos=2, name="nap", wait="sleep", timed_out=True),
            "call 2 (sleep 'nap')",
        ),
        (WaitStarted(pos=2, name="r/child-1", wait="child"), "call 2 (child 'r/child-1')"),
        (WaitStarted(pos=2, name="ok", wait="completion"), "call 2 (completion 'ok')"),
        (
            CallCancelled(pos=2, name="slow", call="step", reason="lost ctx.race"),
            "call 2 (step 'slow' (cancelled))",
        ),
        (
            StepRetrying(pos=2, name="flaky", attempt=1, error_type="E", message="m", retry_in=1),
            "call 2 (step 'flaky')",
        ),
    ],
    ids=["wait-started", "wait-done", "child", "completion", "cancelled", "retrying"],
)
def test_code_that_returns_before_a_journaled_wait_child_or_cancel_is_a_determinism_error(
    beyond: AnyRecord, named: str
) -> None:
    """Every journaled position counts, not only step outcomes: a run whose journal
    waits (or started a child, or cancelled a call) where the code now returns must
    not complete silently."""
    history = load(journal(START, done(1, "plan"), beyond))
    replayer = Replayer(history)
    replayer.begin_step("plan", "agent.py:10")
    with pytest.raises(DeterminismError) as err:
        replayer.check_finished("agent.py:12")
    message = str(err.value)
    assert named in message
    assert "returns after 1 call(s)" in message
    assert "agent.py:12" in message


def test_code_that_reaches_every_journaled_position_finishes() -> None:
    history = load(
        journal(
            START,
            WaitStarted(pos=1, name="approval", wait="signal"),
            WaitDone(pos=1, name="approval", wait="signal", value=msgspec.Raw(b"1")),
            CallCancelled(pos=2, name="slow", reason="lost"),
            done(3, "fast"),
        )
    )
    replayer = Replayer(history)
    assert isinstance(replayer.begin_wait("approval", "signal", "agent.py:1"), WaitDone)
    replayer.next_pos = 4  # the race's two branches took positions 2 and 3
    replayer.check_finished("agent.py:9")


def test_a_missing_record_is_a_gap() -> None:
    entries = journal(START, done(1, "a"), done(2, "b"))
    with pytest.raises(JournalGap, match="missing or was replaced"):
        load([entries[0], entries[2]])


def test_a_replaced_record_is_a_gap() -> None:
    entries = journal(START, done(1, "a", b"1"), done(2, "b"))
    forged = journal(START, done(1, "a", b"2"))[1]
    with pytest.raises(JournalGap, match="sequence 30"):
        load([entries[0], forged, entries[2]])


def test_a_journal_must_start_with_run_started() -> None:
    entries = journal(START, done(1, "a"))
    with pytest.raises(JournalGap, match=r"not run\.started"):
        load(entries[1:])


def test_an_unreadable_record_is_a_gap() -> None:
    entries = journal(START)
    with pytest.raises(JournalGap, match="cannot be read"):
        load([entries[0], (20, b'{"kind":"no.such.kind"}')])


def test_a_record_a_message_schedule_wrote_is_a_gap_even_when_it_chains() -> None:
    """A client's schedule can make the server write a record that links (the chain is
    unkeyed); the server marks what it wrote so, and fusee never schedules onto a
    journal: forged, and a forced resume that a schedule wrote forgives nothing."""
    entries = journal(START, done(1, "a"), RunCompleted(result=msgspec.Raw(b'"FORGED"')))
    by = {30: "fusee.in.0.x"}
    with pytest.raises(JournalGap, match=r"sequence 30 was written by a message schedule"):
        load_journal(History("r"), entries, scheduled=by)
    assert load_journal(History("r"), entries)  # (the same bytes, not scheduled: taken)
    whole = journal(START, done(1, "a"), done(2, "b"), RunResumed(force=True, gap=1000))
    sneaky = [whole[0], *whole[2:]]  # a break at 30 (20 is missing)...
    with pytest.raises(JournalGap, match="sequence 30"):  # ...not forgiven by a forged resume
        load_journal(History("r"), sneaky, scheduled={40: "fusee.in.0.x"})
    assert load_journal(History("r"), sneaky)  # (a resume of fusee's forgives it)


def test_the_end_is_known() -> None:
    history = load(journal(START, done(1, "a"), RunCompleted(result=msgspec.Raw(b"1"))))
    assert history.ended
    assert history.size == 3


def test_a_determinism_error_cannot_be_caught_and_carried_on_from() -> None:
    history = load(journal(START, done(1, "plan"), done(2, "answer")))
    replayer = Replayer(history)
    with pytest.raises(DeterminismError):
        replayer.begin_step("other", "agent.py:10")
    with pytest.raises(DeterminismError):  # the next call fails the same way
        replayer.begin_step("plan", "agent.py:11")
    assert replayer.broken is not None


def test_a_wait_that_rode_on_a_record_is_folded_as_if_journaled_at_its_sequence() -> None:
    """A wait's end carried by the next record (``waited``) replays like one journaled
    alone at that record's sequence: the wait returns it, its inbox message is taken,
    and it counts as a record of its own in ``journal_size()`` (as it does live while it
    waits to ride, and once journaled alone)."""
    took = WaitDone(pos=1, name="approval", wait="signal", value=msgspec.Raw(b"7"), inbox_seq=15)
    history = load(
        journal(
            START,
            WaitStarted(pos=1, name="approval", wait="signal"),
            msgspec.structs.replace(done(2, "act"), waited=[took]),
        )
    )
    assert history.waited[1] == took
    assert history.ends == {1: 30, 2: 30}
    assert history.consumed == {15}
    assert history.size_at == {1: 3, 2: 4}
    assert history.generation_size == 4
    replayer = Replayer(history)
    assert replayer.begin_wait("approval", "signal", "agent.py:1") == took
    assert isinstance(replayer.begin_step("act", "agent.py:2"), Replayed)


def test_a_wait_resolved_rides_on_the_next_record_and_comes_back_when_it_is_refused() -> None:
    history = History("r")
    took = WaitDone(pos=1, name="go", wait="signal", inbox_seq=4)
    history.resolve(took)
    assert history.is_resolved(1)
    assert not history.is_resolved(2)
    riders = history.take_riders()
    assert riders == {"waited": [took]}
    assert not history.resolved
    history.give_back(riders)  # the record was too large: the next one carries it
    assert history.resolved == [took]
