"""Workflows that wait: durable sleeps and signals, with side effects counted like chain's."""

from __future__ import annotations

from typing import Any

import fusee
from tests.workers.effects import record


@fusee.workflow("sleeper")
async def sleeper(ctx: fusee.Context, arg: dict[str, Any]) -> list[str]:
    out = []
    for name in ("before", "nap", "after"):
        if name == "nap":
            await ctx.sleep(arg["sleep"])
            out.append("slept")
            continue

        def effect(s: fusee.StepInfo, name: str = name) -> str:
            record(arg["log"], name, s.key, s.attempt)
            return name

        out.append(await ctx.step(name, effect))
    return out


@fusee.workflow("approver")
async def approver(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    def ask(s: fusee.StepInfo) -> str:
        record(arg["log"], "ask", s.key, s.attempt)
        return "asked"

    await ctx.step("ask", ask)
    try:
        approval = await ctx.wait_for("approval", timeout=arg.get("timeout"))
    except fusee.Timeout:
        return {"approved": None, "timed_out": True}

    def act(s: fusee.StepInfo) -> str:
        record(arg["log"], "act", s.key, s.attempt)
        return "done"

    await ctx.step("act", act)
    return {"approved": approval["approved"], "timed_out": False}


@fusee.workflow("relay")
async def relay(ctx: fusee.Context, arg: dict[str, Any]) -> list[Any]:
    """``rounds`` times a step, then the signal ``go<i>``: each execution recorded as
    ``<run>.s<i> <key> <attempt>``, so a test signals a run as soon as its step ran."""
    got = []
    for i in range(1, arg["rounds"] + 1):

        def step(s: fusee.StepInfo, i: int = i) -> int:
            record(arg["log"], f"{ctx.run_id}.s{i}", s.key, s.attempt)
            return i

        await ctx.step(f"s{i}", step)
        got.append(await ctx.wait_for(f"go{i}"))
    return got
