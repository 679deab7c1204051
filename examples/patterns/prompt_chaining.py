"""Prompt chaining: a fixed sequence of model calls, each reading the one before.

    fusee dev examples/patterns/prompt_chaining.py

Each call is its own step (``outline``, ``draft``, ``edit``), so a failure in the
third resumes from the saved output of the second: the model is not asked again for
what it already answered. The model is scripted so this runs offline; pass
``openai_model("gpt-5")`` as ``model`` instead and nothing else changes.
"""

from __future__ import annotations

import time

import fusee
import fusee.dev
from fusee.ai import ModelRequest, generate
from fusee.testing import ScriptedModel


def scripted(request: ModelRequest, n: int) -> str:
    """The stand-in model: it answers each link of the chain by the prompt's first word."""
    prompt = request.messages[-1].content
    if prompt.startswith("Outline:"):
        return "1. Steps are journaled. 2. A crash resumes at the running step."
    if prompt.startswith("Expand:"):
        return (
            "Every step's result is journaled in NATS, really. So when a worker crashes, "
            "the run resumes at the step that was running, and nothing that finished runs again."
        )
    return "Each step is journaled: a crash resumes at the running step, nothing runs twice."


model = ScriptedModel(scripted)


@fusee.workflow("prompt-chaining")
async def chaining(ctx: fusee.Context, topic: str) -> str:
    outline = await generate(ctx, "outline", model=model, prompt=f"Outline: {topic}")
    draft = await generate(ctx, "draft", model=model, prompt=f"Expand:\n{outline.text}")
    final = await generate(ctx, "edit", model=model, prompt=f"Edit:\n{draft.text}")
    return final.text


async def main(engine: fusee.Engine) -> None:
    run = await engine.start(chaining, f"chaining-{time.strftime('%m%d-%H%M%S')}", "durable steps")
    print(f"\n  {await run.result(timeout='30s')}\n")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
