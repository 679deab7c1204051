"""Rate and cost limits: many runs share a provider's quota, and a runaway agent is
stopped.

    fusee dev examples/patterns/rate_limits.py

- ``engine.limit("openai", per_second=50, concurrent=2)`` sets a limit every worker
  shares (kept in NATS). Each model turn of the loop takes a permit of it
  (``limit="openai"``); a turn over the limit waits its turn instead of failing, and
  ``fairness_key=`` the tenant serves tenants round-robin, so one busy tenant does not
  starve the others.
- ``max_steps=`` on the workflow bounds the steps a run may journal: an agent that
  never stops calling tools fails with ``fusee.StepBudgetExceeded``, whatever its code
  does. ``max_iterations=`` bounds the loop's turns, and a workflow ``timeout`` (given
  at ``engine.start``) its time.

The model is scripted, so this runs offline.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

import fusee
import fusee.dev
from fusee.ai import ModelRequest, ToolResultMessage, loop
from fusee.testing import ScriptedModel, tool_call


def answer(request: ModelRequest, n: int) -> Any:
    """Search once, then answer; asked to "research forever", it never stops searching."""
    question = getattr(request.messages[0], "content", "")
    found = [m for m in request.messages if isinstance(m, ToolResultMessage)]
    if found and "forever" not in question:
        return f"Answer to {question!r}: {found[-1].content}"
    return tool_call("search", f"call_{len(found)}", query=f"{question} ({len(found) + 1})")


model = ScriptedModel(answer)


def search(query: str) -> str:
    """Search the web.

    Args:
        query: what to look for.
    """
    return f"3 pages about {query}"


@fusee.workflow("limited-agent", max_steps=12)
async def agent(ctx: fusee.Context, ask: dict[str, str]) -> str:
    result = await loop(
        ctx,
        "agent",
        model=model,
        prompt=ask["question"],
        tools={"search": search},
        max_iterations=20,
        limit="openai",  # each turn takes a permit of the limit "openai"
        fairness_key=ask["tenant"],  # tenants take turns
    )
    return result.text


async def main(engine: fusee.Engine) -> None:
    await engine.limit("openai", per_second=50, concurrent=2)
    stamp = time.strftime("%m%d-%H%M%S")
    asks = [{"tenant": t, "question": f"question {i} of {t}"} for i in range(3) for t in "AB"]
    runs = [
        await engine.start(agent, f"limited-{stamp}-{i}", ask, timeout="15m")
        for i, ask in enumerate(asks)
    ]
    print()
    async with anyio.create_task_group() as tg:
        for run in runs:
            tg.start_soon(lambda r: r.result(timeout="60s"), run)
    for run in runs:
        print(f"  {run.run_id}: {await run.result()}")
    runaway = await engine.start(
        agent, f"limited-{stamp}-runaway", {"tenant": "A", "question": "research forever"}
    )
    try:
        await runaway.result(timeout="60s")
    except fusee.RunFailed as e:
        print(f"\n  {runaway.run_id}: {e.error_type}: {e.message}\n")
    for info in await engine.limits():
        print(f"  limit {info.name}: {info.per_second}/s, {info.concurrent} at once")
    print(f"  {fusee.dev.hint('limits', 'ls')}\n")
