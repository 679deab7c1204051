"""A workflow for worker-process tests of token streams: one ``model_call`` over a slow,
scripted token source.

A run's input is a dict: ``tokens`` (how many), ``delay`` (seconds before each token),
``prefill`` (whether the source continues from ``resume`` or starts over) and ``log`` (a
file path). Token ``i`` is ``"w<i> "``. Every call of the source appends
``<run id> <len(resume)>`` to ``log``, so a test sees what each attempt resumed from.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio

import fusee
from fusee.ai import model_call
from tests.workers.effects import record_line


def token(i: int) -> str:
    return f"w{i} "


def full_text(n: int) -> str:
    return "".join(token(i) for i in range(n))


@fusee.workflow("tok_slow")
async def tok_slow(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    prefill = bool(arg["prefill"])

    async def source(resume: str) -> AsyncIterator[str]:
        record_line(arg["log"], f"{ctx.run_id} {len(resume)}")
        first = len(resume.split()) if prefill else 0
        for i in range(first, arg["tokens"]):
            await anyio.sleep(arg["delay"])
            yield token(i)

    return await model_call(ctx, "model-0", source, prefill=prefill)
