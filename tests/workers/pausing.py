"""Workflows for the pause/resume tests (tests/integration/test_pause_workers.py).

``pz_provider``: a step ``plan``, then ``model``, which fails while the "provider" is
down (the file ``arg["fixed"]`` does not exist) under ``Retry(attempts=5,
on_exhausted="pause")``, then ``after``. Every attempt of every step appends a line
``<step> <attempt>`` to ``arg["log"]``.

``pz_code``: steps ``one``, then ``two`` (``FUSEE_TEST_CODE=new`` renames it ``TWO``:
code that no longer matches the journal), a wait for signal ``go``, then ``three``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import fusee

PAUSE = fusee.Retry(attempts=5, initial="1ms", max="5ms", on_exhausted="pause")


def _note(log: str, line: str) -> None:
    with Path(log).open("a") as f:
        f.write(line + "\n")


@fusee.workflow("pz_provider")
async def pz_provider(ctx: fusee.Context, arg: dict[str, Any]) -> list[str]:
    log, fixed = arg["log"], Path(arg["fixed"])

    def plan(s: fusee.StepInfo) -> str:
        _note(log, f"plan {s.attempt}")
        return "planned"

    def model(s: fusee.StepInfo) -> str:
        _note(log, f"model {s.attempt}")
        if not fixed.exists():
            raise ConnectionError(f"the provider is down (attempt {s.attempt})")
        return f"answered at attempt {s.attempt}"

    def after(s: fusee.StepInfo) -> str:
        _note(log, f"after {s.attempt}")
        return "done"

    return [
        await ctx.step("plan", plan),
        await ctx.step("model", model, retry=PAUSE),
        await ctx.step("after", after),
    ]


@fusee.workflow("pz_code")
async def pz_code(ctx: fusee.Context, arg: dict[str, Any]) -> list[str]:
    log = arg["log"]

    def step(name: str) -> Any:
        def run(s: fusee.StepInfo) -> str:
            _note(log, f"{name} {s.attempt}")
            return name

        return run

    second = "TWO" if os.environ.get("FUSEE_TEST_CODE") == "new" else "two"
    out = [await ctx.step("one", step("one")), await ctx.step(second, step(second))]
    await ctx.wait_for("go")
    out.append(await ctx.step("three", step("three")))
    return out
