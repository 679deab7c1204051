"""Review repros of fix/pause3 (issue 12), each failing without its fix: real
nats-server, in-process workers."""

from __future__ import annotations

import pytest

import fusee
from fusee.runtime.ids import escape
from fusee.runtime.records import RunPaused, RunResumed, StepRetrying, WaitStarted
from tests.helpers import forge_last, hold_index_write, hold_store_call, poked_at
from tests.integration.test_pause import CALLS, pz_undo
from tests.workers.procs import wait_until

pytestmark = pytest.mark.timeout(90)


async def test_a_worker_dying_after_the_pause_unmarked_strands_the_cancel(
    engine: fusee.Engine,
) -> None:
    """cancel() writes the paused run's marker so that an owner reads the cancel also
    after a restart or once a worker that read it died. The cancel (and its marker)
    lands while the paused activation is leaving, and the worker dies before its
    parking lot's read of the inbox: the leaving activation's unmark must not remove
    the cancel's marker (it was conditional on nothing newer), so the next worker
    finds the run and cancels it (before the fix: the marker went, the run stayed
    paused for good though cancel() returned True)."""
    CALLS.clear()
    eid = escape("pz-strand")
    entered, release = hold_index_write(engine, eid, "paused")
    async with engine.worker() as worker:
        poked = poked_at(worker, eid)
        run = await engine.start(pz_undo, "pz-strand")
        await entered.wait()  # paused and leaving, its inbox no longer watched
        assert await run.cancel("the user gave up")  # cancel stored, marker written
        await poked.wait()  # handed to the leaving actor
        # the parking lot's look at the inbox, held: the worker dies there
        looking, _never = hold_store_call(
            engine, "read_inbox", lambda p, e, *a, limit=0, **_: e == eid and limit == 1
        )
        release.set()  # the paused entry and the marker's removal go out
        await looking.wait()
    # (the worker is gone; a new one owns the partition)
    assert (await run.describe()).status == "paused"
    assert await engine.store.has_run_marker(run.partition, eid)  # the cancel's, kept
    async with engine.worker():
        with pytest.raises(fusee.RunCancelled, match="the user gave up"):
            await run.result(timeout=20)


async def test_a_cancelled_paused_run_leaves_the_paused_listing(engine: fusee.Engine) -> None:
    """The cancel's run.resumed (RunLife._cancel_paused) removes the paused listing
    entry in its write, as an operator's resume does (before the fix it had no
    ``unlist=``: the entry outlived the run's end, and bulk resume's total counted it)."""
    CALLS.clear()
    run = await engine.start(pz_undo, "pz-listed")
    async with engine.worker():

        async def paused() -> bool:
            return (await run.describe()).status == "paused"

        await wait_until(paused, timeout=20, what="the run to pause")
        assert await engine.store.count_listed("paused", "pz_undo") == 1
        assert await run.cancel("gave up")
        with pytest.raises(fusee.RunCancelled):
            await run.result(timeout=20)

    async def unlisted() -> bool:  # (the removal counts for its second: TTL)
        return await engine.store.count_listed("paused", "pz_undo") == 0

    await wait_until(unlisted, timeout=10, what="the paused listing entry to go")


async def test_a_forced_resume_of_a_step_pause_whose_chain_broke(engine: fusee.Engine) -> None:
    """A run paused at a step; then a record with a broken link is appended (a record
    replaced). resume() asks for force; resume(force=True) is stored, the worker
    forgives the break, finds the step's pause and resumes it (before the fix it
    ignored the message as stale, naming pause 0: no resume could ever reach the run)."""

    CALLS.clear()
    run = await engine.start(pz_undo, "pz-step-gap")
    async with engine.worker():

        async def paused() -> bool:
            return (await run.describe()).status == "paused"

        await wait_until(paused, timeout=20, what="the run to pause")
        # a record whose link names a predecessor the journal does not hold, after the
        # pause (a record replaced)
        await forge_last(engine, run, StepRetrying, "forged")
        with pytest.raises(fusee.NotPausedError, match="force=True"):
            await run.resume()
        await run.resume(force=True)

        async def resumed() -> bool:
            return any(isinstance(r, RunResumed) for _, r in await run.journal())

        await wait_until(resumed, timeout=15, what="the forced resume to be journaled")


GAP_CALLS: dict[str, int] = {}
CODE: dict[str, str] = {"step": "book"}  # the name the deployed code gives its step


@fusee.workflow("rv_undo")
async def rv_undo(ctx: fusee.Context) -> str:
    def book() -> str:
        GAP_CALLS["book"] = GAP_CALLS.get("book", 0) + 1
        return "B-1"

    def unbook() -> None:
        GAP_CALLS["unbook"] = GAP_CALLS.get("unbook", 0) + 1

    await ctx.step(CODE["step"], book)
    ctx.compensate("unbook", unbook)
    return str(await ctx.wait_for("go"))


async def test_a_death_between_a_broken_runs_forced_resume_and_its_cancel(
    engine: fusee.Engine,
) -> None:
    """A cancel of a run paused on a broken chain: no code runs, its compensations not
    run. The worker journals a forced run.resumed, then dies before run.cancelled
    lands: the next worker ends it cancelled, running no code (before the fix it read
    the break as accepted and the cancel, and replayed the code over the broken
    journal: the compensation ran)."""

    GAP_CALLS.clear()
    CODE["step"] = "book"
    eid = escape("rv-gap-death")
    run = await engine.start(rv_undo, "rv-gap-death")
    async with engine.worker():

        async def waiting() -> bool:
            return (await run.describe()).status == "waiting"

        await wait_until(waiting, timeout=20, what="the run to park")
        await forge_last(engine, run, WaitStarted, "forged")
        await run.signal("nudge")

        async def paused() -> bool:
            return (await run.describe()).status == "paused"

        await wait_until(paused, timeout=20, what="the run to pause on the break")
        entered, _never = hold_store_call(
            engine, "append", lambda e, kind, *_, **__: e == eid and kind == "run.cancelled"
        )
        assert await run.cancel("given up")
        await entered.wait()  # the forced run.resumed landed; the worker dies here
    assert any(isinstance(r, RunResumed) and r.force for _, r in await run.journal())
    async with engine.worker():
        with pytest.raises(fusee.RunCancelled, match="given up"):
            await run.result(timeout=20)
    assert GAP_CALLS == {"book": 1}, GAP_CALLS  # no code again, no compensation


async def test_a_cancel_whose_replay_meets_changed_code_waits_for_an_operator(
    engine: fusee.Engine,
) -> None:
    """A waiting run is cancelled while the deployed code no longer matches its journal
    (a bad deploy): the cancel's replay pauses it (a determinism pause made while
    cancelling, which says so). It stays paused (before the fix: run.cancelled came
    right after the pause, the compensation never ran): the operator puts the old code
    back and resumes, and the cancel is carried out, its compensation run."""

    GAP_CALLS.clear()
    CODE["step"] = "book"
    run = await engine.start(rv_undo, "rv-changed")
    async with engine.worker():

        async def waiting() -> bool:
            return (await run.describe()).status == "waiting"

        await wait_until(waiting, timeout=20, what="the run to park")
    assert await run.cancel("bad deploy")  # read by the next worker's first activation
    CODE["step"] = "reserve"  # the bad deploy
    async with engine.worker():

        async def settled() -> bool:
            return (await run.describe()).status in ("paused", "cancelled")

        await wait_until(settled, timeout=20, what="the run to settle")
        assert (await run.describe()).status == "paused", [
            type(r).__name__ for _, r in await run.journal()
        ]
    pauses = [r for _, r in await run.journal() if isinstance(r, RunPaused)]
    assert [p.cancelling for p in pauses] == ["bad deploy"]
    CODE["step"] = "book"  # the old code back
    async with engine.worker():
        await run.resume()
        with pytest.raises(fusee.RunCancelled, match="bad deploy"):
            await run.result(timeout=20)
    assert GAP_CALLS == {"book": 1, "unbook": 1}, GAP_CALLS
