"""Cancelling a run: the running step is told (``s.signal``) and cancelled, the run ends
``cancelled`` with the reason, and a cancel outlives the worker that should act on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from fusee.actors.registry import Registry, Workflow
from fusee.runtime.records import RunCancelled, StepCompleted
from tests.workers.procs import chain_input, executions, wait_until

pytestmark = pytest.mark.timeout(60)


def _registry(seen: dict[str, Any]) -> Registry:
    async def interruptible(ctx: fusee.Context, _arg: Any) -> str:
        await ctx.step("plan", lambda: "plan")

        async def answer(s: fusee.StepInfo) -> str:
            seen["started"].set()
            try:
                await anyio.sleep(60)
            finally:
                seen["signal_set"] = s.signal.is_set()
            return "never"

        return await ctx.step("answer", answer, type=str)

    registry = Registry()
    registry.add(Workflow("interruptible", interruptible, Any, True))
    return registry


async def test_cancel_stops_the_running_step_and_ends_the_run(engine: fusee.Engine) -> None:
    seen: dict[str, Any] = {"started": anyio.Event()}
    async with engine.worker(registry=_registry(seen)):
        run = await engine.start("interruptible", "chat-7/turn-3", None)
        with anyio.fail_after(10):
            await seen["started"].wait()
        assert await run.cancel("interrupted") is True
        with pytest.raises(fusee.RunCancelled) as err:
            await run.result(timeout=10)
        assert err.value.reason == "interrupted"
    assert seen["signal_set"] is True  # the step was told before its task was cancelled
    info = await run.describe()
    assert info.status == "cancelled"
    assert info.reason == "interrupted"
    records = [r for _, r in await run.journal()]
    assert isinstance(records[-1], RunCancelled)
    assert [r.name for r in records if isinstance(r, StepCompleted)] == ["plan"]
    assert await run.cancel("again") is False  # an ended run stays as it ended


async def test_cancel_of_an_unknown_run(engine: fusee.Engine) -> None:
    with pytest.raises(fusee.RunNotFound):
        await engine.run("no-such-run").cancel("x")


async def test_a_run_no_worker_can_run_can_be_cancelled(engine: fusee.Engine) -> None:
    async with engine.worker(registry=Registry()):
        run = await engine.start("not-registered-anywhere", "orphan", 1)

        async def noted() -> bool:
            return (await run.describe()).reason is not None

        await wait_until(noted, timeout=10, what="the worker to note it cannot run it")
        assert await run.cancel("nobody runs this") is True
        with pytest.raises(fusee.RunCancelled, match="nobody runs this"):
            await run.result(timeout=10)


async def test_a_cancel_sent_while_no_worker_lives_is_carried_out_by_the_next(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs(partitions=4)
    first = await workers.start()
    log = tmp_path / "effects.log"
    arg = chain_input(log, steps=3, delay=0.05)
    arg["hold"] = {"step": "s2", "until": str(tmp_path / "never")}  # only a cancel ends it
    run = await engine.start("chain", "r-cancel", arg)
    await first.wait_for("step.completed", run_id="r-cancel", timeout=15)
    first.kill()  # mid step 2: held open, it cannot have ended
    assert await run.cancel("user left") is True
    await workers.start()
    with pytest.raises(fusee.RunCancelled, match="user left"):
        await run.result(timeout=20)
    completed = [r.name for _, r in await run.journal() if isinstance(r, StepCompleted)]
    assert completed == ["s1"]
    assert "s3" not in {line.split()[0] for line in log.read_text().splitlines()}
    assert executions(log)  # the steps before the cancel did run
