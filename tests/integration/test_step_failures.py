"""A failed step looks the same to the workflow live and replayed from the journal."""

from __future__ import annotations

from typing import Any

import fusee
from fusee.errors import StepError
from fusee.runtime.records import WaitStarted
from tests.workers.procs import wait_until

seen: list[tuple[Any, ...]] = []


def _boom() -> None:
    raise ValueError("bad input")


@fusee.workflow("sf_catches")
async def sf_catches(ctx: fusee.Context) -> list[Any]:
    try:
        await ctx.step("boom", _boom, retry=fusee.Retry(attempts=1))
    except fusee.StepFailedError as exc:
        cause = exc.__cause__
        shape = (
            type(cause).__name__,
            getattr(cause, "error_type", None),
            getattr(cause, "message", None),
            str(cause),
            exc.__context__ is None or exc.__suppress_context__,
        )
        seen.append(shape)
    await ctx.wait_for("go")  # the run leaves memory here: the rest is a replay
    return list(seen[-1])


async def test_a_replayed_step_failure_has_the_same_cause_as_the_live_one(
    engine: fusee.Engine,
) -> None:
    seen.clear()
    run = await engine.start(sf_catches, "r-sf")
    async with engine.worker():

        async def waiting() -> bool:
            return any(isinstance(r, WaitStarted) for _, r in await run.journal())

        await wait_until(waiting, timeout=10, what="the run to wait for its signal")
    live = seen[0]
    async with engine.worker():  # a fresh worker: the run resumes by replay
        await run.signal("go")
        assert await run.result(timeout=10) == list(live)
    assert len(seen) >= 2  # the failure was seen live, then replayed
    assert set(seen) == {live}
    assert live == ("StepError", "ValueError", "bad input", "ValueError: bad input", True)
    assert issubclass(StepError, fusee.FuseeError)
