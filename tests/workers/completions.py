"""A workflow that asks for approval by callback URL (ctx.await_completion), with side
effects counted like chain's: the test reads the token from the ``asked`` file."""

from __future__ import annotations

from typing import Any

import fusee
from tests.workers.effects import record


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
