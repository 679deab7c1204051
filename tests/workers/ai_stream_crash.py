"""Workflows for the test of a streamed model step whose worker dies between the token
stream's end marker and the step's commit (``tests/integration/test_generate_replay.py``).

The hook is the test's own: ``TokenWriter.end`` is wrapped so that, when the env var
``AI_DIE_AFTER_END`` names a file that does not exist yet, the process creates it and
exits right after the end marker is stored (the step's result is not journaled).
With ``AI_END_WITHOUT_FINAL`` set too, that marker is stored without its payload, as a
worker of an earlier version stored it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import fusee
from fusee.adapters.jetstream import tokens as _tokens
from fusee.ai import generate, loop
from fusee.ai.types import ModelResponse, Usage
from fusee.testing import ScriptedModel, tool_call

_end = _tokens.TokenWriter.end


async def _end_then_die(self: _tokens.TokenWriter, final: bytes = b"") -> None:
    marker = os.environ.get("AI_DIE_AFTER_END")
    dying = bool(marker) and not Path(str(marker)).exists()
    if dying and os.environ.get("AI_END_WITHOUT_FINAL"):
        final = b""
    await (_end(self, final) if final else _end(self))
    if dying:
        Path(str(marker)).write_text("died")
        os._exit(9)  # the end marker is stored; the step's result is not


_tokens.TokenWriter.end = _end_then_die  # type: ignore[method-assign]


def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


@fusee.workflow("ai_stream_loop")
async def stream_loop(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    ask = tool_call("lookup", "call_1", q="x")
    # asked twice when the first answer is lost with its worker (arg "again")
    script = [ask, ask] if arg.get("again") else [ask]
    model = ScriptedModel([*script, "the answer is: found x"], log=arg["log"])
    result = await loop(
        ctx, "agent", model=model, prompt="go", tools={"lookup": lookup}, stream=True
    )
    return {"text": result.text, "iterations": result.iterations}


@fusee.workflow("ai_stream_generate")
async def stream_generate(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    cut = ModelResponse(
        text="cut", usage=Usage(input_tokens=7, output_tokens=300), finish_reason="length"
    )
    model = ScriptedModel([cut, cut], log=arg["log"])
    g = await generate(ctx, "answer", model=model, prompt="go", stream=True)
    return {"text": g.text, "finish": g.response.finish_reason, "out": g.usage.output_tokens}
