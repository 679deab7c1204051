"""Parallelization: independent calls at once (sectioning), or one call several times
with the answers combined (voting).

    fusee dev examples/patterns/parallelization.py

``ctx.all`` runs the calls at once; each is its own durable step (``safety``,
``topic``, ``sentiment``; ``vote-1`` to ``vote-3``) and the run goes on when all have
committed. A crash keeps the calls that finished: only the others are asked again.
"""

from __future__ import annotations

import collections
import time

import fusee
import fusee.dev
from fusee.ai import ModelRequest, generate
from fusee.testing import ScriptedModel


def scripted(request: ModelRequest, n: int) -> str:
    """The stand-in model: each question answered by its first words."""
    prompt = request.messages[-1].content
    if prompt.startswith("Unsafe?"):
        return "safe"
    if prompt.startswith("Topic of:"):
        return "billing"
    if prompt.startswith("Sentiment of:"):
        return "negative"
    return "no" if "Reviewer 2 " in prompt else "yes"  # the voters: two of three say yes


model = ScriptedModel(scripted)


@fusee.workflow("sectioning")
async def sectioning(ctx: fusee.Context, text: str) -> dict[str, str]:
    safety, topic, sentiment = await ctx.all(
        [
            generate(ctx, "safety", model=model, prompt=f"Unsafe? {text}"),
            generate(ctx, "topic", model=model, prompt=f"Topic of: {text}"),
            generate(ctx, "sentiment", model=model, prompt=f"Sentiment of: {text}"),
        ]
    )
    return {"safety": safety.text, "topic": topic.text, "sentiment": sentiment.text}


@fusee.workflow("voting")
async def voting(ctx: fusee.Context, question: str) -> dict[str, object]:
    votes = await ctx.all(
        [
            generate(ctx, f"vote-{i}", model=model, prompt=f"{question}\n(Reviewer {i} of 3.)")
            for i in (1, 2, 3)
        ]
    )
    answers = [v.text for v in votes]
    winner, count = collections.Counter(answers).most_common(1)[0]
    return {"answer": winner, "votes": answers, "agreed": count}


async def main(engine: fusee.Engine) -> None:
    stamp = time.strftime("%m%d-%H%M%S")
    text = "I was charged twice and nobody answers my emails."
    run = await engine.start(sectioning, f"sectioning-{stamp}", text)
    print(f"\n  sectioning: {await run.result(timeout='30s')}\n")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
    question = "Does this change need a database migration? Answer yes or no."
    run = await engine.start(voting, f"voting-{stamp}", question)
    print(f"\n  voting: {await run.result(timeout='30s')}\n")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
