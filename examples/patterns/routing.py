"""Routing: classify the input, then hand it to the workflow that handles its class.

    fusee dev examples/patterns/routing.py

``route`` is a structured ``generate`` (its answer is parsed into ``Route``, and an
answer that does not parse is re-asked); the follow-up is a child run,
``<run id>/handle``, of the workflow ``support.<queue>``, with its own steps and
journal. A replay attaches to the same child instead of starting another.
"""

from __future__ import annotations

import time
from typing import Literal

import msgspec

import fusee
import fusee.dev
from fusee.ai import ModelRequest, generate
from fusee.testing import ScriptedModel

Queue = Literal["billing", "technical", "general"]


class Route(msgspec.Struct):
    queue: Queue


def scripted(request: ModelRequest, n: int) -> str | dict[str, str]:
    """The stand-in model: a router (structured answers) and the queues' writers."""
    prompt = request.messages[-1].content
    if request.output is not None:  # the router
        if "charged" in prompt or "invoice" in prompt:
            return {"queue": "billing"}
        return {"queue": "technical" if "crash" in prompt else "general"}
    return f"[{prompt.split(':')[0]}] We are on it: {prompt.split(': ', 1)[1]}"


model = ScriptedModel(scripted)


@fusee.workflow("routing")
async def routing(ctx: fusee.Context, subject: str) -> dict[str, str]:
    route = await generate(
        ctx, "route", model=model, prompt=f"Which queue handles: {subject}", output=Route, reask=2
    )
    queue = route.output.queue
    reply = await ctx.child(f"support.{queue}", f"{ctx.run_id}/handle", subject)
    return {"queue": queue, "reply": reply}


def queue_workflow(queue: Queue, voice: str) -> fusee.Workflow[str]:
    """The workflow that handles one queue: a model call with that queue's prompt."""

    async def handle(ctx: fusee.Context, subject: str) -> str:
        answer = await generate(ctx, "answer", model=model, prompt=f"{voice}: {subject}")
        return answer.text

    return fusee.workflow(f"support.{queue}")(handle)


billing = queue_workflow("billing", "Billing team")
technical = queue_workflow("technical", "Engineering on call")
general = queue_workflow("general", "Support desk")


async def main(engine: fusee.Engine) -> None:
    stamp = time.strftime("%m%d-%H%M%S")
    for i, subject in enumerate(["I was charged twice", "The app crashes on login"]):
        run = await engine.start(routing, f"routing-{stamp}-{i}", subject)
        result = await run.result(timeout="30s")
        print(f"\n  {subject!r} -> {result['queue']}: {result['reply']}\n")
        print("\n".join(fusee.dev.format_journal(await run.journal())))
