"""Evaluator-optimizer: one call writes, another judges and feeds back, until it passes.

    fusee dev examples/patterns/evaluator_optimizer.py

Two ways, each durable:

- ``summary``: ``generate``'s re-ask. ``validate`` is the evaluator; an answer it
  refuses is asked again with the reason, each re-ask its own step (``summary``,
  ``summary#reask-1``, ...), at most ``reask`` times.
- ``refine``: a free-form write/critique cycle. Each turn the writer drafts and calls
  ``critique`` (a judge model, in the tool's step); ``stop`` ends the loop once the
  judge's score is over the bar, and ``max_iterations`` bounds the rounds.
"""

from __future__ import annotations

import time

import msgspec

import fusee
import fusee.dev
from fusee.ai import (
    AssistantMessage,
    LoopState,
    ModelRequest,
    ModelResponse,
    UserMessage,
    generate,
    loop,
)
from fusee.testing import Reply, ScriptedModel, tool_call

DOC = (
    "fusee journals every step of a run in NATS JetStream. When a worker crashes, another "
    "worker takes the run over and replays its journal: the steps that finished return their "
    "journaled results, and the run goes on at the step that was running."
)

# -- generate with validate and reask ----------------------------------------------------


class Summary(msgspec.Struct):
    text: str


def under_40_words(summary: Summary) -> str | None:
    words = len(summary.text.split())
    return None if words <= 40 else f"{words} words: too long, tighten it to 40 at most"


def writer_script(request: ModelRequest, n: int) -> Reply:
    """The stand-in writer: too long at first; shorter once told (a re-ask says why)."""
    if request.output is not None:  # generate's structured summary
        if len(request.messages) == 1:
            return {"text": DOC}
        return {"text": "fusee journals each step in NATS; after a crash, a replay resumes it."}
    turn = sum(isinstance(m, AssistantMessage) for m in request.messages)  # the refine loop
    draft = ["Durable runs.", "Durable runs: steps journaled.", "Crash-proof steps, journaled."]
    return ModelResponse(
        text=draft[turn],
        tool_calls=[tool_call("critique", f"critique-{turn}", draft=draft[turn])],
        finish_reason="tool_calls",
    )


writer = ScriptedModel(writer_script)
judge = ScriptedModel(
    lambda request, n: "0.9" if "Crash-proof" in request.messages[-1].content else "0.4"
)


@fusee.workflow("evaluator-reask")
async def summarize(ctx: fusee.Context, doc: str) -> str:
    summary = await generate(
        ctx,
        "summary",
        model=writer,
        prompt=f"Summarize in under 40 words: {doc}",
        output=Summary,
        validate=under_40_words,
        reask=3,
    )
    return summary.output.text


# -- loop with a critique tool and stop ---------------------------------------------------


async def critique(draft: str) -> float:
    """Scores a tagline draft from 0 to 1; over 0.8 is good.

    Args:
        draft: the tagline to score.
    """
    answer = await judge.complete(ModelRequest(messages=[UserMessage(f"Score: {draft}")]))
    return float(answer.text)


@fusee.workflow("evaluator-loop")
async def tagline(ctx: fusee.Context, product: str) -> dict[str, object]:
    def good_enough(state: LoopState, i: int) -> bool:
        return float(state.results[0].content) >= 0.8  # the judge's score, journaled

    result = await loop(
        ctx,
        "refine",
        model=writer,
        prompt=f"Write a tagline for {product}; call critique on each draft and improve it.",
        tools={"critique": critique},
        stop=good_enough,
        max_iterations=5,
    )
    return {"tagline": result.text, "rounds": result.iterations, "stopped": result.stopped}


async def main(engine: fusee.Engine) -> None:
    stamp = time.strftime("%m%d-%H%M%S")
    run = await engine.start(summarize, f"evaluator-reask-{stamp}", DOC)
    print(f"\n  summary: {await run.result(timeout='30s')}\n")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
    run = await engine.start(tagline, f"evaluator-loop-{stamp}", "fusee")
    print(f"\n  tagline: {await run.result(timeout='30s')}\n")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
