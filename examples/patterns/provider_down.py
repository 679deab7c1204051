"""When the provider is down: the model call pauses its run instead of failing it.

    fusee dev examples/patterns/provider_down.py

The model step retries with ``Retry(..., on_exhausted="pause")``: when its attempts run
out, the run is journaled ``paused`` with the step, its last error and the attempts,
and leaves memory, with everything it has (the search it did is not done again). Once
the provider is back, an operator resumes it, and the step runs again with a fresh
budget:

    fusee runs bulk resume --type steady-support --status paused

(``engine.bulk_resume(workflow=..., status="paused")`` here, or ``run.resume()`` for one.)

The model is scripted: down for its first three requests, then back.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

import fusee
import fusee.dev
from fusee.ai import ModelRequest, generate
from fusee.testing import ScriptedModel

DOWN_FOR = 3  # requests


def provider(request: ModelRequest, n: int) -> Any:
    if n < DOWN_FOR:
        return ConnectionError("api.example.com: 503 Service Unavailable")
    return "Your order 1042 ships on Thursday."


model = ScriptedModel(provider)


@fusee.workflow("steady-support")
async def support(ctx: fusee.Context, question: str) -> str:
    order = await ctx.step("tool:lookup_order", lambda: {"order": "1042", "ships": "Thursday"})
    reply = await generate(
        ctx,
        "model",
        model=model,
        prompt=f"{question} (order: {order})",
        retry=fusee.Retry(attempts=3, initial="200ms", max="30s", on_exhausted="pause"),
    )
    return reply.text


async def main(engine: fusee.Engine) -> None:
    run = await engine.start(support, f"support-{time.strftime('%m%d-%H%M%S')}", "Where is 1042?")
    with anyio.fail_after(30):  # an operator's dashboard: the paused runs of the type
        while not (paused := await engine.list_runs(status="paused", id_prefix=run.run_id)):
            if (await run.describe()).status == "completed":  # a provider that is up
                print(f"\n  the provider answered: {await run.result()}\n")
                return
            await anyio.sleep(0.1)
    (info,) = paused
    print(f"\n  {info.run_id}: {info.status} at step {info.step!r} after {info.attempts} attempts")
    print(f"    {info.error_type}: {info.message}")
    print("  ... the provider is back; the operator resumes every paused run of the type:")
    summary = await engine.bulk_resume(workflow="steady-support", status="paused")
    print(f"  resumed {summary.done}")
    print(f"  {run.run_id} -> {await run.result(timeout='30s')}\n")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
    print()
