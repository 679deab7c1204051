"""fusee's own cost per agent turn: ``python -m bench.agent_loop``.

A ``fusee.ai.loop`` of 10 turns, each calling one tool (an async no-op), then a final
answer, against a scripted model that answers at once: what is measured is fusee's
(two steps a turn: the model's and the tool's, and the loop's own code). Beside it, in
the same run and alternating with it, W1 (100 sequential no-op steps: ms a step) and
the floor (a block of fenced publishes before each timed run). The goal: a turn costs
at most two steps (fusee adds no more than a second step's cost per tool call).

``ms_per_turn`` is the whole 10-turn run (its start, its final answer, the wait for
its result included) over 10. ``loop_over_same_steps`` sets the loop beside a plain
workflow of as many steps (21: 11 turns, 10 tool calls), timed the same way: what the
loop's own code adds to its steps, free of the run's start and end.
``marginal_turn_over_step`` is what a turn adds: the 10-turn run less a 1-turn run of
the same loop (also timed alternating), over the 9 turns between them, beside W1's step:
the run's start, its final answer and the wait for its result cancel out.

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

import fusee
from bench.__main__ import NEAR, Floor
from bench.workflows import noop_steps as steps
from fusee.adapters.jetstream.server import EmbeddedServer
from fusee.ai import AssistantMessage, ModelRequest, ToolCall, loop
from fusee.testing import ScriptedModel

TURNS = 10


def _script(turns: int) -> Any:
    def reply(request: ModelRequest, n: int) -> Any:
        i = sum(1 for m in request.messages if isinstance(m, AssistantMessage))
        if i < turns:
            return ToolCall(id=f"call_{i}", name="ping", arguments=f'{{"n": {i}}}')
        return "done"

    return reply


async def ping(n: int) -> int:
    """Answers n."""
    return n


@fusee.workflow("bench.agent")
async def agent(ctx: fusee.Context, turns: int) -> int:
    result = await loop(
        ctx,
        "agent",
        model=ScriptedModel(_script(turns)),
        prompt=f"ping {turns} times",
        tools={"ping": ping},
        max_iterations=turns + 1,
    )
    return result.iterations


async def main(repeats: int, w1_steps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            engine = await fusee.connect(server.url, namespace="agentloop")
            probe = await Floor.open(server.url, "FLOOR_AGENT")
            per: dict[str, list[float]] = {"turn": [], "step": [], "same": [], "one": []}
            floors: dict[str, list[float]] = {"turn": [], "step": [], "same": [], "one": []}
            async with engine.worker():
                await (await engine.start(agent, "warm-agent", TURNS)).result(timeout=120)
                await (await engine.start(steps, "warm-steps", w1_steps)).result(timeout=120)
                kinds = ["turn", "step", "same", "one"]
                for r in range(repeats):
                    for kind in kinds[r % 4 :] + kinds[: r % 4]:
                        floors[kind].append(statistics.median(await probe.block(NEAR)))
                        t0 = time.perf_counter()
                        if kind == "step":
                            run = await engine.start(steps, f"steps-{r}", w1_steps)
                            await run.result(timeout=120)
                            per[kind].append((time.perf_counter() - t0) * 1000 / w1_steps)
                            continue
                        if kind == "same":
                            run = await engine.start(steps, f"same-{r}", 2 * TURNS + 1)
                            await run.result(timeout=120)
                        elif kind == "one":
                            run = await engine.start(agent, f"one-{r}", 1)
                            assert await run.result(timeout=120) == 2
                        else:
                            run = await engine.start(agent, f"agent-{r}", TURNS)
                            assert await run.result(timeout=120) == TURNS + 1
                        per[kind].append((time.perf_counter() - t0) * 1000)
            await probe.close()
            await engine.close()
        finally:
            server.stop()
    whole = [t / TURNS for t in per["turn"]]
    turn, step = statistics.median(whole), statistics.median(per["step"])
    same = sorted(t / s for t, s in zip(per["turn"], per["same"], strict=True))
    floor = statistics.median(floors["turn"] + floors["step"] + floors["same"] + floors["one"])
    marginal = (statistics.median(per["turn"]) - statistics.median(per["one"])) / (TURNS - 1)
    out = {
        "bench": "agent_loop",
        "turns": TURNS,
        "ms_per_turn": round(turn, 3),
        "ms_per_turn_spread": [round(min(whole), 3), round(max(whole), 3)],
        "w1_ms_per_step": round(step, 3),
        "turn_over_step": round(turn / step, 2),
        "marginal_ms_per_turn": round(marginal, 3),
        "marginal_turn_over_step": round(marginal / step, 2),
        "loop_over_same_steps": round(statistics.median(same), 2),
        "loop_over_same_steps_spread": [round(same[0], 2), round(same[-1], 2)],
        "turn_ratio_to_floor": round(turn / floor, 2),
        "step_ratio_to_floor": round(step / floor, 2),
        "floor_p50_ms": round(floor, 3),
        "goal_turn_over_step": 2.0,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--w1-steps", type=int, default=100)
    a = parser.parse_args()
    anyio.run(main, a.repeats, a.w1_steps)
