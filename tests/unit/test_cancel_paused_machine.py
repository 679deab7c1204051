"""Review repros (fix/pause3), pure machine: a pause the cancel's own carrying-out
made was skipped at once, ending the run ``cancelled`` without its compensations; a
death between a cancel's forced resume and its end replayed the code; a forced resume
of a step's pause whose chain broke was ignored as stale. Each fails without its fix."""

from __future__ import annotations

import msgspec

from fusee.runtime.history import History
from fusee.runtime.life_events import (
    Broken,
    Command,
    Commit,
    Committed,
    CompensationsBroken,
    Execute,
    Finish,
    Load,
    Loaded,
    RunCompensations,
    Stopped,
    StopWatch,
    WatchStopped,
)
from fusee.runtime.records import (
    AnyRecord,
    RunCancelled,
    RunPaused,
    RunStarted,
    StepCompleted,
    encode_record,
)
from fusee.runtime.run_life import RunLife


def _history(*extra: object) -> History:
    h = History("r")
    records = [
        RunStarted(workflow="wf", input=msgspec.Raw(b"null"), started_at=1.0),
        StepCompleted(pos=1, name="book", result=msgspec.Raw(b"1")),
        *extra,
    ]
    for seq, rec in enumerate(records, 1):
        h.add(seq, rec, encode_record(rec))  # type: ignore[arg-type]
    return h


def _drive(life: RunLife, out: list[Command], journal: list[AnyRecord]) -> list[AnyRecord]:
    """Answer commits by appending to ``journal``; loads by the journal so far."""
    committed: list[AnyRecord] = []
    for _ in range(30):
        last = out[-1]
        if isinstance(last, Finish):
            return committed
        if isinstance(last, Commit):
            journal.append(last.record)
            committed.append(last.record)
            out = life.feed(Committed(), 10.0)
        elif isinstance(last, Load):
            out = life.feed(Loaded(_history(*journal), cancel="stop"), 10.0)
        elif isinstance(last, StopWatch):
            out = life.feed(WatchStopped(), 10.0)
        else:
            raise AssertionError(f"unexpected {last}")
    raise AssertionError("did not settle")


def test_compensations_that_break_while_cancelling_leave_the_run_paused() -> None:
    """Cancelled: the code is replayed to its compensations, and the compensations'
    replay meets a DeterminismError (code changed under the run). Before fix/pause3
    the run paused, so an operator could deploy matching code and resume to finish the
    compensations; now the pause is followed at once by run.cancelled: the saga's
    undo is skipped (a log line says 'not run: paused')."""
    life = RunLife()
    life.begin()
    out = life.feed(Loaded(_history(), cancel="stop"), 10.0)
    assert isinstance(out[-1], Execute)
    assert out[-1].cancelled
    out = life.feed(Stopped(), 10.0)
    assert isinstance(out[-1], StopWatch)
    out = life.feed(WatchStopped(), 10.0)
    assert isinstance(out[-1], RunCompensations)
    journal: list[AnyRecord] = []
    out = life.feed(CompensationsBroken("compensation 'refund' does not match"), 10.0)
    committed = _drive(life, out, journal)
    assert not any(isinstance(r, RunCancelled) for r in committed), committed
    assert isinstance(committed[-1], RunPaused)


def test_a_determinism_break_in_a_cancel_replay_leaves_the_run_paused() -> None:
    """The same with the replay to find the compensations itself broken."""
    life = RunLife()
    life.begin()
    out = life.feed(Loaded(_history(), cancel="stop"), 10.0)
    assert isinstance(out[-1], Execute)
    out = life.feed(Broken("DeterminismError: step 'book' is now 'reserve'"), 10.0)
    out = life.feed(WatchStopped(), 10.0)
    journal: list[AnyRecord] = []
    committed = _drive(life, out, journal)
    assert not any(isinstance(r, RunCancelled) for r in committed), committed


def test_a_death_between_the_cancels_forced_resume_and_its_end_replays_the_code() -> None:
    """A cancel of a run paused on a broken chain journals a forced run.resumed, then
    run.cancelled (two writes). A worker dying between them: the next activation reads
    the break as accepted (forgive == forgiven), the cancel again, and replays the
    workflow's code over the broken journal to find its compensations: what the docs
    and _cancel_paused say never happens ('no code runs either: records are
    missing'). test_run_life's property only looks at forgive > forgiven, so it
    cannot see this window."""
    from fusee.runtime.records import RunResumed

    life = RunLife()
    life.begin()
    # as journaled by the first activation (gap: the journal's last sequence then)
    forced = RunResumed(paused=0, force=True, gap=2)
    history = _history(forced)
    assert history.forgive == history.forgiven == 2
    out = life.feed(Loaded(history, cancel="given up"), 10.0)
    assert not any(isinstance(c, Execute) for c in out), out


def test_a_forced_resume_of_a_step_paused_run_whose_chain_broke_resumes_it() -> None:
    """A run paused at a step (run.paused journaled), whose chain then broke before
    the pause. resume() without force: NotPausedError asking for force (the client's
    read stops at the break). resume(force=True): Resume(force, paused=0, gap=last).
    The worker forgives the break, finds the step's pause, and _resumes() compares
    msg.paused (0) with the pause's sequence: stale, ignored; the run stays paused,
    and every retry is the same deduplicated message: no way to resume it."""
    from fusee.runtime.inbox import Resume
    from fusee.runtime.records import RunResumed

    pause = RunPaused(reason="step ran out", cause="retries", pos=2, step="down", attempts=2)
    history = _history(pause)
    history.forgive = 3  # (the actor's reload, taking the break up to the message's gap)
    life = RunLife()
    life.begin()
    out = life.feed(Loaded(history, resume=(100, Resume(force=True, gap=3))), 10.0)
    assert any(isinstance(c, Commit) and isinstance(c.record, RunResumed) for c in out), out
