"""Workflows for the CLI tests of ``tests/e2e/test_cli_complete.py``.

``cc_echo`` returns its input upper-cased after one step. ``cc_fail`` fails. ``cc_wait``
waits for the signal ``go`` and returns its payload. ``cc_pause`` runs a step that fails
until the file ``arg["flag"]`` exists, pausing when its 2 attempts run out. ``cc_talk``
streams the token ``"hello "`` as stream ``model-0``, then waits until the file
``arg["flag"]`` exists (the test opens that window), then streams ``"world"`` and ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

import fusee
from fusee.ai import model_call

POLL = 0.02  # how often the workflow looks for the test's flag file


@fusee.workflow("cc_echo")
async def cc_echo(ctx: fusee.Context, text: Any) -> Any:
    return await ctx.step("upper", lambda: str(text).upper())


def _boom() -> None:
    raise ValueError("no good")


@fusee.workflow("cc_fail")
async def cc_fail(ctx: fusee.Context, arg: Any) -> None:
    await ctx.step("boom", _boom, retry=fusee.Retry(attempts=1))


@fusee.workflow("cc_wait")
async def cc_wait(ctx: fusee.Context, arg: Any) -> Any:
    return await ctx.wait_for("go")


def _provider(flag: str) -> str:
    if not Path(flag).exists():
        raise ConnectionError("the provider is down")
    return "answered"


@fusee.workflow("cc_pause")
async def cc_pause(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    return str(
        await ctx.step(
            "model",
            lambda: _provider(arg["flag"]),
            retry=fusee.Retry(attempts=2, initial="1ms", max="2ms", on_exhausted="pause"),
        )
    )


@fusee.workflow("cc_talk")
async def cc_talk(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    async def source(resume: str) -> AsyncIterator[str]:
        yield "hello "
        while not Path(arg["flag"]).exists():
            await anyio.sleep(POLL)
        yield "world"

    return await model_call(ctx, "model-0", source, prefill=False)
