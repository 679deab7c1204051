"""fusee's cost per turn of an OpenAI Agents SDK agent: ``python -m bench.openai_agents``.

An agent (``fusee.ai.openai.run``) of 10 turns, each one model request and one call of
an async no-op function tool, then its answer, against a model that answers at once
(a ``Model`` of the SDK's, in process): what is measured is fusee's two steps a turn and
the adapter's code, plus the SDK's own. Beside it, in the same run and alternating with
it: W1 (100 sequential no-op steps: ms a step), the same agent run by the plain
``Runner.run`` (the SDK's own cost a turn, no fusee), and the floor (a block of fenced
publishes before each timed run).

``marginal_ms_per_turn`` is what a turn adds: the 10-turn run less a 1-turn run of the
same agent, over the 9 turns between them (the run's start, its answer and the wait for
its result cancel out); ``fusee_ms_per_turn`` is that less the plain SDK's turn: what
the durability costs (two steps' worth is the design's floor).

One in-process worker on a fresh embedded server (``sync_interval: always``). Prints
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.testing import assistant_message, function_call
from agents.usage import Usage

import fusee
from bench.__main__ import NEAR, Floor
from bench.workflows import noop_steps as steps
from fusee.adapters.jetstream.server import EmbeddedServer
from fusee.ai.openai import run

TURNS = 10
set_tracing_disabled(True)


class Instant(Model):
    """A model that calls ``ping`` until ``turns`` calls are answered, then answers."""

    def __init__(self, turns: int) -> None:
        self.turns = turns

    async def get_response(self, *args: Any, **kw: Any) -> ModelResponse:
        items = kw["input"] if "input" in kw else args[1]
        done = sum(
            1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
        )
        if done < self.turns:
            out = [function_call("ping", {"n": done}, call_id=f"call_{done}")]
        else:
            out = [assistant_message("done")]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError


@function_tool
async def ping(n: int) -> int:
    """Answers n."""
    return n


def make_agent(turns: int) -> Agent[Any]:
    return Agent(name="bench", tools=[ping], model=Instant(turns))


@fusee.workflow("bench.openai_agent")
async def agent(ctx: fusee.Context, turns: int) -> str:
    result = await run(ctx, make_agent(turns), f"ping {turns} times", max_turns=turns + 2)
    return str(result.final_output)


async def main(repeats: int, w1_steps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            engine = await fusee.connect(server.url, namespace="oaagents")
            probe = await Floor.open(server.url, "FLOOR_OAAGENTS")
            kinds = ["turn", "step", "one", "plain", "plain_one"]
            per: dict[str, list[float]] = {k: [] for k in kinds}
            floors: list[float] = []
            async with engine.worker():
                await (await engine.start(agent, "warm-agent", TURNS)).result(timeout=120)
                await (await engine.start(steps, "warm-steps", w1_steps)).result(timeout=120)
                for r in range(repeats):
                    for kind in kinds[r % 5 :] + kinds[: r % 5]:
                        floors.append(statistics.median(await probe.block(NEAR)))
                        t0 = time.perf_counter()
                        if kind == "step":
                            await (await engine.start(steps, f"s-{r}", w1_steps)).result(
                                timeout=120
                            )
                            per[kind].append((time.perf_counter() - t0) * 1000 / w1_steps)
                            continue
                        if kind.startswith("plain"):
                            n = TURNS if kind == "plain" else 1
                            plain_run = await Runner.run(make_agent(n), "go", max_turns=n + 2)
                            assert plain_run.final_output == "done"
                        else:
                            n = TURNS if kind == "turn" else 1
                            r_ = await engine.start(agent, f"{kind}-{r}", n)
                            assert await r_.result(timeout=120) == "done"
                        per[kind].append((time.perf_counter() - t0) * 1000)
            await probe.close()
            await engine.close()
        finally:
            server.stop()
    med = {k: statistics.median(v) for k, v in per.items()}
    step = med["step"]
    marginal = (med["turn"] - med["one"]) / (TURNS - 1)
    plain = (med["plain"] - med["plain_one"]) / (TURNS - 1)
    floor = statistics.median(floors)
    out = {
        "bench": "openai_agents",
        "turns": TURNS,
        "marginal_ms_per_turn": round(marginal, 3),
        "plain_sdk_ms_per_turn": round(plain, 3),
        "fusee_ms_per_turn": round(marginal - plain, 3),
        "w1_ms_per_step": round(step, 3),
        "marginal_turn_over_step": round(marginal / step, 2),
        "fusee_turn_over_step": round((marginal - plain) / step, 2),
        "ms_per_turn_whole_run": round(med["turn"] / TURNS, 3),
        "turn_ratio_to_floor": round(marginal / floor, 2),
        "step_ratio_to_floor": round(step / floor, 2),
        "floor_p50_ms": round(floor, 3),
        "goal_turn_over_step": 2.0,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--w1-steps", type=int, default=100)
    a = parser.parse_args()
    anyio.run(main, a.repeats, a.w1_steps)
