"""A long conversation that continues as new with a summary once its journal grows.

A run's input is a dict: ``log`` (a file path), ``turns`` (the user's messages),
``limit`` (continue as new once the generation's journal holds more records than
this), ``delay`` (seconds each model call takes), and what a generation hands the next:
``summary`` and ``done`` (turns answered so far); optionally ``hold``:
``{"turn": i, "until": <path>}`` makes the model call of turn ``i`` (0-based) block
until the file exists (the test creates it). Each model call appends
``model:<message> <s.key> <attempt>`` to ``log`` when it returns, so a test counts the
calls that finished across processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

import fusee
from tests.workers.effects import record, wait_for_file


def _model(arg: dict[str, Any], message: str, turn: int) -> Callable[..., Any]:
    hold = arg.get("hold") or {}

    async def call(s: fusee.StepInfo) -> str:
        if hold.get("turn") == turn:
            await wait_for_file(hold["until"])
        await anyio.sleep(arg.get("delay", 0.0))
        record(arg["log"], f"model:{message}", s.key, s.attempt)
        return message.upper()

    return call


@fusee.workflow("long_chat")
async def long_chat(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    summary: str = arg.get("summary", "")
    done: int = arg.get("done", 0)
    turns: list[str] = arg["turns"]
    while done < len(turns):
        reply = await ctx.step("model", _model(arg, turns[done], done))
        summary = f"{summary}|{turns[done]}>{reply}"
        done += 1
        if done < len(turns) and ctx.journal_size() > arg["limit"]:
            return ctx.continue_as_new({**arg, "summary": summary, "done": done})
    return {"summary": summary, "turns": done}
