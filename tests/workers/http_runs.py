"""Workflows for the HTTP API's run routes (tests/e2e/test_http_runs.py): one that ends
at once, one that waits for a signal, one that fails."""

from __future__ import annotations

from typing import Any

import fusee


@fusee.workflow("hr-echo")
async def echo(ctx: fusee.Context, text: str) -> dict[str, str]:
    upper = await ctx.step("upper", lambda: text.upper())
    return {"echo": upper}


@fusee.workflow("hr-wait")
async def wait(ctx: fusee.Context, arg: Any) -> Any:
    """Parks until the signal ``go`` comes; returns its payload."""
    return await ctx.wait_for("go")


def _boom() -> None:
    raise ValueError("no good")


@fusee.workflow("hr-fail")
async def fail(ctx: fusee.Context, arg: Any) -> None:
    await ctx.step("boom", _boom, retry=fusee.Retry(attempts=1))
