"""Compensations (part of issue 3): ``ctx.compensate`` registers an undo; when the run fails
or is cancelled (also by its timeout) they run newest first, each as a durable step, and
the run ends as it would have. A crash during compensation resumes it.

The ``trip`` workflow (``tests/workers/compensations.py``) books a hotel and a flight and
pays; every effect is a line in a file, so each test counts what happened. Run the file
also with ``FUSEE_ALWAYS_REPLAY=1``: the run is then replayed after every step, also in
the middle of its compensations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.runtime.records import StepCompleted, StepFailed, StepRetrying
from tests.workers import compensations
from tests.workers.procs import wait_until

pytestmark = pytest.mark.timeout(60)

BOOKED = ["book-hotel", "book-flight", "pay"]
TRIP_STEPS = ["tool:book-hotel", "tool:book-flight", "tool:pay"]
UNDO_STEPS = ["compensate:tool:cancel-flight", "compensate:tool:cancel-hotel"]


def effects(log: Path) -> list[str]:
    """The effects that happened, in order (``<effect> <key> <attempt>`` lines)."""
    if not log.exists():
        return []
    return [line.split()[0] for line in log.read_text().splitlines() if line.strip()]


def trip_input(log: Path, pay: str, **more: Any) -> dict[str, Any]:
    return {"log": str(log), "pay": pay, **more}


async def outcomes(run: fusee.Run) -> list[tuple[int, str, str]]:
    """``(pos, name, kind)`` of every step outcome in the journal, in journal order."""
    out = []
    for _, r in await run.journal():
        if isinstance(r, StepCompleted):
            out.append((r.pos, r.name, "completed"))
        elif isinstance(r, StepFailed):
            out.append((r.pos, r.name, "failed"))
    return out


def started(log: Path, effect: str) -> Any:
    return lambda: effect in effects(log)


async def test_undo_on_failure_runs_newest_first_each_once(
    engine: fusee.Engine, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    async with engine.worker():
        run = await engine.start(compensations.trip, "trip-fail", trip_input(log, "fail"))
        with pytest.raises(fusee.RunFailed) as err:
            await run.result(timeout=20)
    # the run ends with the error that failed it, not with anything its undo did
    assert err.value.error_type == "fusee.FatalError"
    assert err.value.message == "card declined"
    assert effects(log) == [*BOOKED, "cancel-flight", "cancel-hotel"]
    assert await outcomes(run) == [
        (1, "tool:book-hotel", "completed"),
        (2, "tool:book-flight", "completed"),
        (3, "tool:pay", "failed"),
        (4, "compensate:tool:cancel-flight", "completed"),
        (5, "compensate:tool:cancel-hotel", "completed"),
    ]
    info = await run.describe()
    assert info.status == "failed"


async def test_a_cancel_runs_the_compensations_and_does_not_cut_them_short(
    engine: fusee.Engine, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    async with engine.worker():
        arg = trip_input(log, "hold", undo_delay=0.3)
        run = await engine.start(compensations.trip, "trip-cancel", arg)
        await wait_until(started(log, "pay"), timeout=15, what="the payment to start")
        assert await run.cancel("user left") is True
        with pytest.raises(fusee.RunCancelled) as err:
            await run.result(timeout=20)
    assert err.value.reason == "user left"
    assert effects(log) == [*BOOKED, "cancel-flight", "cancel-hotel"]
    # the cancelled payment has no outcome; the compensations come after its position
    assert await outcomes(run) == [
        (1, "tool:book-hotel", "completed"),
        (2, "tool:book-flight", "completed"),
        (4, "compensate:tool:cancel-flight", "completed"),
        (5, "compensate:tool:cancel-hotel", "completed"),
    ]
    assert (await run.describe()).status == "cancelled"


async def test_the_workflow_timeout_runs_the_compensations(
    engine: fusee.Engine, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    async with engine.worker():
        # each undo takes 0.4 s, and they start when the 1.5 s of the run are over
        arg = trip_input(log, "hold", undo_delay=0.4)
        run = await engine.start(compensations.trip, "trip-timeout", arg, timeout=1.5)
        with pytest.raises(fusee.RunCancelled) as err:
            await run.result(timeout=20)
    assert err.value.reason == "timeout: the run took longer than 1.5s"
    assert effects(log) == [*BOOKED, "cancel-flight", "cancel-hotel"]
    assert [name for _, name, _ in await outcomes(run)] == TRIP_STEPS[:2] + UNDO_STEPS


async def test_a_compensation_that_fails_is_journaled_and_the_others_still_run(
    engine: fusee.Engine, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    async with engine.worker():
        arg = trip_input(log, "fail", bad_undo="cancel-flight")
        run = await engine.start(compensations.trip, "trip-bad-undo", arg)
        with pytest.raises(fusee.RunFailed) as err:
            await run.result(timeout=20)
    assert (err.value.error_type, err.value.message) == ("fusee.FatalError", "card declined")
    # two attempts (its own retry policy), then the older compensation still runs
    assert effects(log) == [*BOOKED, "cancel-flight-failed", "cancel-flight-failed", "cancel-hotel"]
    journal = [r for _, r in await run.journal()]
    retrying = [r for r in journal if isinstance(r, StepRetrying)]
    assert [(r.pos, r.name, r.attempt) for r in retrying] == [
        (4, "compensate:tool:cancel-flight", 1)
    ]
    failed = [r for r in journal if isinstance(r, StepFailed)]
    assert [(r.pos, r.name, r.attempt, r.message) for r in failed] == [
        (3, "tool:pay", 1, "card declined"),
        (4, "compensate:tool:cancel-flight", 2, "F1 cannot be cancelled"),
    ]
    assert await outcomes(run) == [
        (1, "tool:book-hotel", "completed"),
        (2, "tool:book-flight", "completed"),
        (3, "tool:pay", "failed"),
        (4, "compensate:tool:cancel-flight", "failed"),
        (5, "compensate:tool:cancel-hotel", "completed"),
    ]


async def test_a_completed_run_does_not_compensate(engine: fusee.Engine, tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    async with engine.worker():
        run = await engine.start(compensations.trip, "trip-ok", trip_input(log, "ok"))
        assert await run.result(timeout=20) == {"hotel": "H1", "flight": "F1", "paid": "paid"}
    assert effects(log) == BOOKED
    assert [name for _, name, _ in await outcomes(run)] == TRIP_STEPS


undone: list[str] = []


def _declined() -> None:
    raise fusee.FatalError("declined")


@fusee.workflow("comp_caught")
async def caught(ctx: fusee.Context) -> str:
    await ctx.step("book", lambda: "b1")
    ctx.compensate("unbook", lambda: undone.append("b1"))
    try:
        await ctx.step("charge", _declined, retry=fusee.Retry(attempts=1))
    except fusee.StepFailedError:
        return "paid another way"
    return "paid"


@fusee.workflow("comp_prefix")
async def prefixed(ctx: fusee.Context) -> None:
    await ctx.step("compensate:x", lambda: None)


async def test_a_failure_caught_by_the_workflow_does_not_compensate(
    engine: fusee.Engine,
) -> None:
    async with engine.worker():
        run = await engine.start(caught, "comp-caught", None)
        assert await run.result(timeout=20) == "paid another way"
    assert undone == []


async def test_a_step_name_cannot_take_the_compensation_prefix(engine: fusee.Engine) -> None:
    async with engine.worker():
        run = await engine.start(prefixed, "comp-prefix", None)
        with pytest.raises(fusee.RunFailed, match="kept for compensations"):
            await run.result(timeout=20)


async def test_a_crash_during_compensation_resumes_it(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs()
    workers.module = Path(compensations.__file__)
    first = await workers.start()
    log = tmp_path / "effects.log"
    # the second undo waits for `release` before its effect: the kill lands inside it
    release = tmp_path / "release"
    arg = trip_input(log, "fail", undo_hold={"name": "cancel-hotel", "until": str(release)})
    run = await engine.start("trip", "trip-crash", arg)
    await first.wait_for("step.completed", run_id="trip-crash", step=UNDO_STEPS[0], timeout=20)
    await first.wait_for("run.compensating", run_id="trip-crash", timeout=10)
    first.kill()
    assert "cancel-hotel" not in effects(log)
    release.touch()
    second = await workers.start()
    with pytest.raises(fusee.RunFailed, match="card declined"):
        await run.result(timeout=30)
    # every effect happened once: nothing journaled ran again, the rest ran on the new worker
    assert effects(log) == [*BOOKED, "cancel-flight", "cancel-hotel"]
    assert [name for _, name, _ in await outcomes(run)] == TRIP_STEPS + UNDO_STEPS
    assert second.find("step.completed", run_id="trip-crash", step=UNDO_STEPS[1])
    assert not second.find("step.completed", run_id="trip-crash", step=UNDO_STEPS[0])
    assert first.find("run.compensating", run_id="trip-crash")


async def test_a_cancel_sent_while_no_worker_lives_compensates_on_the_next(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs()
    workers.module = Path(compensations.__file__)
    first = await workers.start()
    log = tmp_path / "effects.log"
    run = await engine.start("trip", "trip-orphan", trip_input(log, "hold"))
    await wait_until(started(log, "pay"), timeout=15, what="the payment to start")
    first.kill()  # mid payment
    assert await run.cancel("user left") is True
    await workers.start()
    with pytest.raises(fusee.RunCancelled, match="user left"):
        await run.result(timeout=30)
    # the new worker replays the trip up to the payment, and undoes the bookings
    assert effects(log) == [*BOOKED, "cancel-flight", "cancel-hotel"]
    assert await outcomes(run) == [
        (1, "tool:book-hotel", "completed"),
        (2, "tool:book-flight", "completed"),
        (4, "compensate:tool:cancel-flight", "completed"),
        (5, "compensate:tool:cancel-hotel", "completed"),
    ]
