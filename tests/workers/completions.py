"""A workflow that asks for approval by callback URL (ctx.await_completion), with side
effects counted like chain's: the test reads the token from the ``asked`` file."""

from __future__ import annotations

import os
from typing import Any

import fusee


def record(log: str, name: str, key: str, attempt: int) -> None:
    """One line per execution, in one O_APPEND write (as in waits.py)."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{name} {key} {attempt}\n".encode())
    finally:
        os.close(fd)


@fusee.workflow("refunder")
async def refunder(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    def post(cb: fusee.Completion) -> None:
        record(arg["log"], "ask", cb.token, 1)
        with open(arg["asked"], "a") as f:
            f.write(f"Refund? {cb.url}\n")

    approval = await ctx.await_completion("refund-ok", ask=post, timeout=arg.get("timeout"))

    def refund(s: fusee.StepInfo) -> str:
        record(arg["log"], "refund", s.key, s.attempt)
        return "refunded"

    if approval.get("approved"):
        return {"approval": approval, "did": await ctx.step("tool:refund", refund)}
    return {"approval": approval, "did": None}
