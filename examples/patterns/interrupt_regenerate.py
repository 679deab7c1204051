"""Interrupt and regenerate: the user presses "stop" while the answer streams, then
"regenerate".

    fusee dev examples/patterns/interrupt_regenerate.py

Each turn of a chat is its own run, so it can be stopped. Cancelling it cancels the
model call's task (its step's ``s.signal`` is set first): the request to the provider is
aborted. The regenerated turn is a new run started ``from_run=`` the stopped one: the
calls that finished there (here the search for context) are copied into its journal and
not run again; the model is asked again from the history as it was.

The model is scripted (and slow, so there is time to press stop), so this runs offline;
pass ``openai_model(...)`` as ``model`` and neither the workflow nor ``main`` changes
(a fast model may finish before stop lands: ``main`` says so, and the regenerated turn
then copies the model's answer too).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio

import fusee
import fusee.dev
from fusee.ai import ModelRequest, StreamItem, SystemMessage, generate
from fusee.testing import ScriptedModel

DOCS = {"refund": "Refunds are paid back within 3 days to the card that paid."}


class SlowModel(ScriptedModel):
    """A scripted model that writes its answer a word at a time, as a large model does."""

    def __init__(self, script: Any, *, per_word: float) -> None:
        super().__init__(script, name="slow")
        self.per_word = per_word

    async def pace(self, words: int) -> None:
        """Before each word (``words`` written so far): the time a large model takes."""
        await anyio.sleep(self.per_word)

    async def stream(self, request: ModelRequest, prefill: str = "") -> AsyncIterator[StreamItem]:
        words = 0
        async for item in super().stream(request, prefill):
            if isinstance(item, str):
                await self.pace(words)
                words += 1
            yield item


def reply(request: ModelRequest, n: int) -> str:
    """The model's answer: it reads the context the turn found."""
    system = next(m.content for m in request.messages if isinstance(m, SystemMessage))
    return f"{system.removeprefix('Context: ')} Your refund should arrive by Friday."


model = SlowModel(reply, per_word=0.05)


def search_docs(question: str) -> str:
    """The context for the answer (a search index, standing in)."""
    return next((text for word, text in DOCS.items() if word in question.lower()), "")


@fusee.workflow("chat-turn")
async def turn(ctx: fusee.Context, history: list[dict[str, str]]) -> str:
    question = history[-1]["content"]
    context = await ctx.step("search", lambda: search_docs(question))
    answer = await generate(
        ctx,
        "model",
        model=model,
        messages=[{"role": "system", "content": f"Context: {context}"}, *history],
        stream=True,  # the tokens are the run's stream "model", readable while it runs
    )
    return answer.text


async def main(engine: fusee.Engine) -> None:
    chat = f"chat-7-{time.strftime('%m%d-%H%M%S')}"
    history = [{"role": "user", "content": "When does my refund arrive?"}]

    first = await engine.start(turn, f"{chat}/turn-3", history)
    seen = []
    async for token in first.stream("model"):  # the chat UI shows the tokens as they come
        seen.append(token)
        if len(seen) == 4:
            break
    print(f"\n  the user reads {''.join(seen)!r}... and presses stop")
    await first.cancel("interrupted")
    try:
        await first.result(timeout="30s")
        # a fast model (an openai_model(...) passed as model) may end before stop lands
        print(f"  {first.run_id}: the answer had ended before stop (the run completed)")
    except fusee.RunCancelled as e:
        print(f"  {first.run_id}: cancelled ({e.reason})")

    again = await engine.start(turn, f"{chat}/turn-3b", history, from_run=first.run_id)
    print(f"  regenerate -> {await again.result(timeout='30s')}\n")
    print(f"Journal of {again.run_id} (the search was copied from {first.run_id}):")
    print("\n".join(fusee.dev.format_journal(await again.journal())))
    print(f"\n  {fusee.dev.hint('runs', 'show', first.run_id)}\n")
