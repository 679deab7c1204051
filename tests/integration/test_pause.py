"""Pausing a run whose step ran out of attempts, and resuming it (in-process worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

import fusee
from fusee.runtime.records import RunPaused, RunResumed, StepCompleted
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
        await run.resume()  # twice: resumed once
        assert await run.result(timeout=20) == ["planned", "answered at attempt 6"]
    journal = [r for _, r in await run.journal()]
    assert sum(isinstance(r, RunResumed) for r in journal) == 1
    assert [r.name for r in journal if isinstance(r, StepCompleted)] == ["plan", "model"]
    assert CALLS["before"] == 1
    with pytest.raises(fusee.NotPausedError) as err:
        await run.resume()
    assert err.value.status == "completed"
