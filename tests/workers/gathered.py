"""A workflow that gathers four steps with ``asyncio.gather`` (outside ctx.all), for
crash tests: side effects counted like chain's.

``fanout``'s input: ``log`` (the side-effect file) and ``until``, a file step ``s0``
waits for (the test creates it), so a kill lands in ``s0`` by construction while
``s1``..``s3`` have ended."""

from __future__ import annotations

import asyncio
from typing import Any

import fusee
from tests.workers.effects import record, wait_for_file


@fusee.workflow("fanout")
async def fanout(ctx: fusee.Context, arg: dict[str, Any]) -> list[Any]:
    def step(i: int) -> Any:
        async def call(s: fusee.StepInfo) -> str:
            record(arg["log"], f"s{i}", s.key, s.attempt)
            if i == 0:
                await wait_for_file(arg["until"])
            return f"S{i}"

        return call

    results = list(await asyncio.gather(*(ctx.step(f"s{i}", step(i)) for i in range(4))))

    def after(s: fusee.StepInfo) -> str:
        record(arg["log"], "after", s.key, s.attempt)
        return "+".join(results)

    return [*results, await ctx.step("after", after)]
