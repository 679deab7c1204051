"""Parallel tool calls: calls that do not depend on each other run at once.

    fusee dev examples/patterns/parallel_tools.py

Each call is its own step, so a crash keeps the ones that finished, and a call that
fails is retried alone. Two ways to write it:

- ``trip``: the workflow calls both tools itself, with ``ctx.all``;
- ``trip-agent``: the model asks for both tools in one turn, and ``fusee.ai.loop`` runs
  the calls of a turn at once (each the step ``agent/tool-<turn>-<tool>``).

The model is scripted and the APIs are functions, so this runs offline.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

import fusee
import fusee.dev
from fusee.ai import ModelRequest, ToolResultMessage, generate, loop, tool
from fusee.testing import ScriptedModel, tool_call

_answered: set[str] = set()  # the flights API's memory of the keys it has seen


async def weather_api(city: str) -> dict[str, Any]:
    await anyio.sleep(0.2)
    return {"city": city, "forecast": "sunny", "high_c": 24}


async def flights_api(city: str, date: str, key: str) -> list[dict[str, Any]]:
    """A flaky service: its first answer to each key is lost."""
    await anyio.sleep(0.2)
    if key not in _answered:
        _answered.add(key)
        raise TimeoutError("flights API did not answer")
    return [{"flight": "LH 1234", "to": city, "date": date, "eur": 129}]


def answer(request: ModelRequest, n: int) -> Any:
    """The model: with no tool results yet, it asks for both tools; then it answers."""
    results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
    if request.tools and not results:
        return [  # a provider's call IDs are new each time
            tool_call("weather", f"call_{n}_weather", city="Lisbon"),
            tool_call("flights", f"call_{n}_flights", city="Lisbon", date="2026-06-01"),
        ]
    return "Lisbon will be sunny (24 C); LH 1234 leaves on June 1st for 129 EUR."


model = ScriptedModel(answer)


@fusee.workflow("trip")
async def trip(ctx: fusee.Context, city: str) -> str:
    date = "2026-06-01"
    weather, flights = await ctx.all(
        [
            ctx.step("tool:weather", lambda: weather_api(city)),
            ctx.step(
                "tool:flights",
                lambda s: flights_api(city, date, s.key),
                retry=fusee.Retry(attempts=3, initial="100ms"),
            ),
        ]
    )
    reply = await generate(ctx, "model", model=model, prompt=f"Plan a trip: {weather} {flights}")
    return reply.text


async def weather(city: str) -> dict[str, Any]:
    """The weather forecast of a city.

    Args:
        city: the city's name.
    """
    return await weather_api(city)


async def flights(city: str, date: str, s: fusee.StepInfo) -> list[dict[str, Any]]:
    """Flights to a city on a date.

    Args:
        city: where to.
        date: the day, as YYYY-MM-DD.
    """
    return await flights_api(city, date, s.key)  # s.key: the step key and the call ID


@fusee.workflow("trip-agent")
async def trip_agent(ctx: fusee.Context, question: str) -> str:
    result = await loop(
        ctx,
        "agent",
        model=model,
        prompt=question,
        tools={
            "weather": weather,
            "flights": tool(flights, retry=fusee.Retry(attempts=3, initial="100ms")),
        },
        max_iterations=4,
    )
    return result.text


async def main(engine: fusee.Engine) -> None:
    stamp = time.strftime("%m%d-%H%M%S")
    for workflow, arg in ((trip, "Lisbon"), (trip_agent, "A weekend in Lisbon on June 1st?")):
        run = await engine.start(workflow, f"{workflow.name}-{stamp}", arg)
        print(f"\n  {workflow.name}: {await run.result(timeout='30s')}")
        print("\n".join(fusee.dev.format_journal(await run.journal())))
    print("\nBoth tools ran at once; the flights call was retried alone.\n")
