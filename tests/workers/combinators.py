"""Workflows with ctx.race, for crash tests: side effects counted like chain's.

``racer``'s input: ``log`` (the side-effect file) and ``until``, a file the step after
the race waits for (the test creates it), so a kill lands in that step by construction."""

from __future__ import annotations

from typing import Any

import anyio

import fusee
from tests.workers.effects import record, wait_for_file


@fusee.workflow("racer")
async def racer(ctx: fusee.Context, arg: dict[str, Any]) -> list[Any]:
    def model(name: str, seconds: float) -> Any:
        async def call(s: fusee.StepInfo) -> str:
            record(arg["log"], name, s.key, s.attempt)
            with anyio.move_on_after(seconds):
                await s.signal.wait()
                return "stopped"
            return f"{name} answer"

        return call

    answer = await ctx.race(
        [ctx.step("model:fast", model("fast", 0.3)), ctx.step("model:large", model("large", 30))]
    )

    async def after(s: fusee.StepInfo) -> str:
        record(arg["log"], "after", s.key, s.attempt)
        await wait_for_file(arg["until"])
        return "after"

    return [answer, await ctx.step("after", after)]
