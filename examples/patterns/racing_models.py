"""Racing models: ask two models and take the first answer; the slower call is cancelled.

    fusee dev examples/patterns/racing_models.py

``ctx.race`` runs both model calls at once, each its own step. The first to end wins;
the other's task is cancelled (its ``s.signal`` set first, so its request is aborted)
and its cancellation journaled (``call.cancelled``), so a replay returns the same
winner whatever the timings.

The models are scripted (one fast, one slow), so this runs offline; pass two
``openai_model(...)`` as ``fast`` and ``large`` and neither the workflow nor ``main``
changes (``main`` prints whichever answered first).
"""

from __future__ import annotations

import time

import anyio

import fusee
import fusee.dev
from fusee.ai import Generation, ModelRequest, ModelResponse, generate
from fusee.testing import ScriptedModel


class SlowModel(ScriptedModel):
    """A scripted model that takes ``seconds`` to answer, as a large model does."""

    def __init__(self, reply: str, *, name: str, seconds: float) -> None:
        super().__init__(lambda request, n: reply, name=name)
        self.seconds = seconds

    async def complete(self, request: ModelRequest) -> ModelResponse:
        await anyio.sleep(self.seconds)
        return await super().complete(request)


fast = SlowModel("Paris.", name="fast", seconds=0.1)
large = SlowModel("The capital of France is Paris, since 987.", name="large", seconds=30)


@fusee.workflow("race-answer")
async def race_answer(ctx: fusee.Context, prompt: str) -> dict[str, str]:
    winner: Generation[None] = await ctx.race(
        [
            generate(ctx, "model:fast", model=fast, prompt=prompt),
            generate(ctx, "model:large", model=large, prompt=prompt),
        ]
    )
    return {"model": winner.model, "text": winner.text}


async def main(engine: fusee.Engine) -> None:
    run = await engine.start(
        race_answer, f"race-{time.strftime('%m%d-%H%M%S')}", "Capital of France?"
    )
    result = await run.result(timeout="30s")
    print(f"\n  {result}\n")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
    print(f"\n{result['model']} won the race: the other call was cancelled and journaled so.\n")
