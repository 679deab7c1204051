"""Workflows that wait: durable sleeps and signals, with side effects counted like chain's."""

from __future__ import annotations

import os
from typing import Any

import fusee


def record(log: str, name: str, key: str, attempt: int) -> None:
    """One line per execution, in one O_APPEND write (as in chain.py: launched as a
    script, this module cannot import its sibling)."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{name} {key} {attempt}\n".encode())
    finally:
        os.close(fd)


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
