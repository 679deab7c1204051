"""Workflows with child runs (orchestrator and workers), side effects counted like chain's."""

from __future__ import annotations

from typing import Any

import fusee
from tests.workers.effects import record


@fusee.workflow("writer")
async def writer(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    def write(s: fusee.StepInfo) -> str:
        record(arg["log"], f"write:{arg['part']}", s.key, s.attempt)
        return f"<{arg['part']}>"

    text = await ctx.step("write", write)
    if arg.get("sleep"):
        await ctx.sleep(arg["sleep"])
    return str(text)


@fusee.workflow("orchestrator")
async def orchestrator(ctx: fusee.Context, arg: dict[str, Any]) -> list[str]:
    def plan(s: fusee.StepInfo) -> list[str]:
        record(arg["log"], "plan", s.key, s.attempt)
        return list(arg["parts"])

    parts = await ctx.step("plan", plan)
    out = []
    for i, p in enumerate(parts):
        child = {"log": arg["log"], "part": p, "sleep": arg.get("sleep")}
        out.append(await ctx.child(writer, f"{ctx.run_id}/part-{i}", child))
    return out
