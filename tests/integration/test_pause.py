"""Pausing a run whose step ran out of attempts, and resuming it (in-process worker)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import fusee
from fusee.actors.registry import Registry
from fusee.runtime.ids import escape
from fusee.runtime.inbox import Cancel, encode_message
from fusee.runtime.records import RunPaused, RunResumed, StepCompleted, encode_record
from tests.helpers import hold_index_write, hold_store_call, poked_at
from tests.workers.procs import wait_until

FLAG: dict[str, Path] = {}
CALLS: dict[str, int] = {}


def _provider(s: fusee.StepInfo) -> str:
    CALLS["model"] = CALLS.get("model", 0) + 1
    if not FLAG["fixed"].exists():
        raise ConnectionError(f"the provider is down (attempt {s.attempt})")
    return f"answered at attempt {s.attempt}"


def _before() -> str:
    CALLS["before"] = CALLS.get("before", 0) + 1
    return "planned"


@fusee.workflow("pz_agent")
async def pz_agent(ctx: fusee.Context) -> list[str]:
    plan = await ctx.step("plan", _before)
    answer = await ctx.step(
        "model",
        _provider,
        retry=fusee.Retry(attempts=5, initial="1ms", max="5ms", on_exhausted="pause"),
    )
    return [plan, answer]


async def _paused(run: fusee.Run) -> bool:
    return (await run.describe()).status == "paused"


async def test_a_step_that_runs_out_pauses_and_resume_completes_it(
    engine: fusee.Engine, tmp_path: Path
) -> None:
    FLAG["fixed"] = tmp_path / "fixed"
    CALLS.clear()
    run = await engine.start(pz_agent, "pz-1")
    async with engine.worker():
        await wait_until(lambda: _paused(run), timeout=20, what="the run to pause")
        info = await run.describe()
        assert (info.step, info.error_type, info.attempts) == ("model", "ConnectionError", 5)
        assert "attempt 5" in (info.message or "")
        journal = [r for _, r in await run.journal()]
        paused = [r for r in journal if isinstance(r, RunPaused)]
        assert len(paused) == 1
        assert paused[0].attempts == 5
        assert paused[0].step == "model"
        assert CALLS["model"] == 5
        FLAG["fixed"].touch()
        await run.resume()
        assert await run.result(timeout=20) == ["planned", "answered at attempt 6"]
    journal = [r for _, r in await run.journal()]
    assert sum(isinstance(r, RunResumed) for r in journal) == 1
    assert [r.name for r in journal if isinstance(r, StepCompleted)] == ["plan", "model"]
    assert CALLS["before"] == 1
    with pytest.raises(fusee.NotPausedError) as err:
        await run.resume()
    assert err.value.status == "completed"


@fusee.workflow(
    "pz_defaults", retry=fusee.Retry(attempts=2, initial="1ms", max="2ms", on_exhausted="pause")
)
async def pz_defaults(ctx: fusee.Context, own: bool) -> str:
    def down(s: fusee.StepInfo) -> str:
        CALLS["down"] = CALLS.get("down", 0) + 1
        raise ConnectionError("down")

    if own:  # the step's own retry wins over the workflow's
        return str(await ctx.step("down", down, retry=fusee.Retry(attempts=3, initial="1ms")))
    return str(await ctx.step("down", down))


async def test_a_workflow_retry_is_every_steps_default_and_a_steps_own_wins(
    engine: fusee.Engine,
) -> None:
    CALLS.clear()
    by_default = await engine.start(pz_defaults, "pz-default", False)
    own = await engine.start(pz_defaults, "pz-own", True)
    async with engine.worker():
        await wait_until(lambda: _paused(by_default), timeout=20, what="the run to pause")
        assert (await by_default.describe()).attempts == 2
        with pytest.raises(fusee.RunFailed, match="ConnectionError: down"):
            await own.result(timeout=20)
    assert CALLS["down"] == 5


@fusee.workflow("pz_budget", max_steps=3)
async def pz_budget(ctx: fusee.Context, generation: int) -> int:
    await ctx.step("a", lambda: 1)
    await ctx.step("b", lambda: 2)
    if generation == 1:
        return ctx.continue_as_new(2)
    return 0


@fusee.workflow("pz_budget_all", max_steps=2)
async def pz_budget_all(ctx: fusee.Context) -> list[int]:
    def one() -> int:
        CALLS["budget"] = CALLS.get("budget", 0) + 1
        return 1

    first = await ctx.step("first", one)
    rest = await ctx.all([ctx.step("second", one), ctx.step("third", one)])
    return [first, *rest]


async def test_a_step_beyond_max_steps_fails_the_run_across_generations(
    engine: fusee.Engine,
) -> None:
    """Two steps a generation, a budget of 3: the second generation's second step
    would be the fourth; in a ctx.all the branch over the budget fails it too."""
    CALLS.clear()
    run = await engine.start(pz_budget, "pz-budget", 1)
    parallel = await engine.start(pz_budget_all, "pz-budget-all")
    async with engine.worker():
        with pytest.raises(fusee.RunFailed) as failed:
            await run.result(timeout=20)
        with pytest.raises(fusee.RunFailed) as failed_all:
            await parallel.result(timeout=20)
    assert failed.value.error_type == "fusee.StepBudgetExceeded"
    assert "step 'b' would be step 4" in failed.value.message
    assert "max_steps=3" in failed.value.message
    assert failed_all.value.error_type == "fusee.StepBudgetExceeded"
    assert "would be step 3" in failed_all.value.message
    assert CALLS["budget"] <= 2  # the first, and at most one branch: never all three


async def test_an_object_step_cannot_pause(engine: fusee.Engine) -> None:
    """An object's invocation holds its key's queue: pausing one would wedge the key,
    so the step says so at once and the invocation fails (the key moves on)."""

    async def call(ctx: Any) -> str:
        return str(await ctx.step("x", lambda: "x", retry=fusee.Retry(on_exhausted="pause")))

    async def ok(ctx: Any) -> int:
        return 1

    registry = Registry()
    kind = fusee.object("pz_obj", {"call": call, "ok": ok})
    registry.add_object(kind)
    async with engine.worker(registry=registry):
        key = kind.key("k", engine=engine)
        with pytest.raises(fusee.HandlerFailed, match="cannot pause") as failed:
            await key.call("call", timeout=20)
        assert failed.value.error_type == "fusee.ConfigError"
        assert await key.call("ok", timeout=20) == 1


@fusee.workflow("pz_undo")
async def pz_undo(ctx: fusee.Context) -> str:
    def book() -> str:
        CALLS["book"] = CALLS.get("book", 0) + 1
        return "B-1"

    def unbook() -> None:
        CALLS["unbook"] = CALLS.get("unbook", 0) + 1

    def down(s: fusee.StepInfo) -> str:
        CALLS["down"] = CALLS.get("down", 0) + 1
        raise ConnectionError("down")

    await ctx.step("book", book)
    ctx.compensate("unbook", unbook)
    policy = fusee.Retry(attempts=2, initial="1ms", max="2ms", on_exhausted="pause")
    return str(await ctx.step("down", down, retry=policy))


async def test_cancelling_a_run_paused_at_a_step_ends_it_with_its_compensations(
    engine: fusee.Engine,
) -> None:
    CALLS.clear()
    run = await engine.start(pz_undo, "pz-undo")
    async with engine.worker():
        await wait_until(lambda: _paused(run), timeout=20, what="the run to pause")
        assert await run.cancel("the user gave up")
        with pytest.raises(fusee.RunCancelled, match="the user gave up"):
            await run.result(timeout=20)
    assert CALLS == {"book": 1, "down": 2, "unbook": 1}  # the step is not run again
    journal = [r for _, r in await run.journal()]
    assert sum(isinstance(r, RunResumed) for r in journal) == 1


async def test_paused_run_with_signal_is_not_reactivated_in_a_loop(
    engine: fusee.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal to a run paused at a step reactivates it once, not in a loop.

    The run actor records what it read when it pauses (`left_at`); without that
    its worker sees the signal as unread for ever and reloads the run in a loop
    (507 journal reads in 3 s in review). This counts reads over a bounded
    window as a ceiling; it orders nothing by sleeping.
    """
    from fusee.adapters.jetstream.store import NatsStore

    FLAG["fixed"] = tmp_path / "fixed"
    CALLS.clear()
    reads: dict[str, int] = {}
    original = NatsStore.read_journal

    async def counting(self: NatsStore, eid: str, *args: Any, **kwargs: Any) -> Any:
        reads[eid] = reads.get(eid, 0) + 1
        return await original(self, eid, *args, **kwargs)

    monkeypatch.setattr(NatsStore, "read_journal", counting)
    run = await engine.start(pz_agent, "pz-signal-loop")
    async with engine.worker():
        await wait_until(lambda: _paused(run), timeout=20, what="the run to pause at its step")
        await run.signal("poke")
        before = reads.get(run.eid, 0)
        end = time.monotonic() + 3
        while time.monotonic() < end:
            await anyio.sleep(0.25)
        assert reads.get(run.eid, 0) - before < 10


async def test_a_cancel_stored_before_the_steps_pause_landed_ends_the_run(
    engine: fusee.Engine,
) -> None:
    """The step's last attempt failed and its ``run.paused`` is on its way when the
    cancel is stored (held there by a hook on the store): ``cancel()`` finds no pause
    to resume, and the run must not be left paused once the pause lands."""
    CALLS.clear()
    eid = escape("pz-late-cancel")
    entered, release = hold_store_call(
        engine, "append", lambda e, kind, *_, **__: e == eid and kind == "run.paused"
    )
    async with engine.worker():
        run = await engine.start(pz_undo, "pz-late-cancel")
        await entered.wait()  # its attempts ran out; the pause is not journaled yet
        assert await run.cancel("the user gave up")
        release.set()
        with pytest.raises(fusee.RunCancelled, match="the user gave up"):
            await run.result(timeout=20)
    assert CALLS == {"book": 1, "down": 2, "unbook": 1}  # the step is not run again
    journal = [r for _, r in await run.journal()]
    assert sum(isinstance(r, RunResumed) for r in journal) == 1


async def test_a_cancel_alone_ends_a_run_paused_at_a_step(engine: fusee.Engine) -> None:
    """What a client that died right after storing its cancel leaves: the cancel in
    the inbox, nothing else (no resume, no marker). The run reads it and ends."""
    CALLS.clear()
    run = await engine.start(pz_undo, "pz-cancel-alone")
    async with engine.worker():
        await wait_until(lambda: _paused(run), timeout=20, what="the run to pause")
        body = encode_message(Cancel(reason="the client died"))
        stored = await engine.store.send_unless_ended(run.partition, run.eid, "cancel", body)
        assert stored is not None
        with pytest.raises(fusee.RunCancelled, match="the client died"):
            await run.result(timeout=20)
    assert CALLS == {"book": 1, "down": 2, "unbook": 1}


async def test_a_cancel_stored_while_the_paused_run_leaves_memory(engine: fusee.Engine) -> None:
    """The cancel comes while the paused activation is leaving (its index entry held
    on its way, its inbox no longer watched): the worker hands it to the leaving actor,
    and the pause's marker removal follows the marker ``cancel()`` wrote. Its worker
    keeps the paused run in its parking lot, which reads the inbox again."""
    CALLS.clear()
    eid = escape("pz-leaving")
    entered, release = hold_index_write(engine, eid, "paused")
    async with engine.worker() as worker:
        poked = poked_at(worker, eid)
        run = await engine.start(pz_undo, "pz-leaving")
        await entered.wait()  # paused and leaving
        assert await run.cancel("the user gave up")
        await poked.wait()  # the worker delivered the cancel, to the leaving actor
        release.set()
        with pytest.raises(fusee.RunCancelled, match="the user gave up"):
            await run.result(timeout=20)
    assert CALLS == {"book": 1, "down": 2, "unbook": 1}


async def test_describe_shows_a_run_whose_chain_broke_before_any_worker_met_it(
    engine: fusee.Engine,
) -> None:
    """No worker has read the journal since a record was replaced (the run has no index
    entry yet: it never parked): describe() says paused, naming the break, as the
    worker's note will, and resume() asks for force."""
    run = await engine.start(pz_agent, "pz-broken")  # (no worker: it stays as started)
    forged = StepCompleted(
        pos=1, name="plan", result=msgspec.Raw(b'"x"'), prev=7, prev_hash="0123456789abcdef"
    )
    last = await engine.store.last_in_journal(run.eid)
    assert last is not None
    seq = await engine.store.append(
        run.eid, "step.completed", encode_record(forged), fence=last.seq, msg_id="forged"
    )
    assert await engine.store.get_index(run.eid) is None
    info = await run.describe()
    assert (info.status, info.workflow) == ("paused", "pz_agent")
    assert f"sequence {seq}" in (info.reason or "")
    with pytest.raises(fusee.NotPausedError, match="force=True"):
        await run.resume()
