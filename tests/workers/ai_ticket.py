"""A workflow for worker-process tests of ``fusee.ai.generate`` with the scripted model:
classify a ticket (structured output), wait for the signal ``go``, draft a reply.

A run's input is a dict: ``log`` (the scripted model's request file, shared by every
worker process and read by the test) and ``stream`` (whether the calls stream tokens).
The result has the category, the reply and the re-asks the classification took.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

import fusee
from fusee.ai import generate
from fusee.testing import Reply, ScriptedModel

SCRIPT: list[Reply] = [
    "It is about billing, I think.",  # not JSON: re-asked
    {"category": "billing", "priority": "high"},
    "We are refunding you today.",
]


class Triage(msgspec.Struct):
    category: str
    priority: Literal["low", "high"]


@fusee.workflow("ai_ticket")
async def ticket(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    model = ScriptedModel(SCRIPT, log=arg["log"])  # the position in the script is the file's
    triage = await generate(
        ctx, "classify", model=model, prompt="Classify: refund", output=Triage, reask=1,
        stream=arg["stream"],
    )  # fmt: skip
    await ctx.wait_for("go")
    reply = await generate(ctx, "draft-reply", model=model, prompt="Reply", stream=arg["stream"])
    return {"category": triage.output.category, "reply": reply.text, "reasks": triage.reasks}
