"""fusee's cost per Pydantic AI agent turn: ``python -m bench.pydantic_ai``.

An agent (``FuseeDurability``, run with ``fusee.ai.pydantic.run``) of 10 turns, each a
model request that calls one tool (an async no-op), then a final answer, against
Pydantic AI's ``FunctionModel`` answering at once: what is measured is fusee's two steps
a turn and the adapter's code around them, with Pydantic AI's own. Beside it, in the
same run and alternating with it: W1 (100 sequential no-op steps: ms a step), a plain
workflow of as many steps as the agent journals (21), a 1-turn run of the agent (so a
turn's marginal cost is the 10-turn run less it, over 9), the same agent run outside a
workflow (Pydantic AI alone: no steps), and the floor (a block of fenced publishes
before each timed run).

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

import anyio
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import fusee
from bench.__main__ import NEAR, Floor
from bench.workflows import noop_steps as steps
from fusee.adapters.jetstream.server import EmbeddedServer
from fusee.ai.pydantic import FuseeDurability, run

TURNS = 10


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = sum(
        isinstance(p, ToolReturnPart) for m in messages if isinstance(m, ModelRequest)
        for p in m.parts
    )  # fmt: skip
    prompt = next(
        p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
        if isinstance(p, UserPromptPart)
    )  # fmt: skip
    turns = int(str(prompt).split()[1])
    if done < turns:
        return ModelResponse(parts=[ToolCallPart("ping", {"n": done}, tool_call_id=f"c{done}")])
    return ModelResponse(parts=[TextPart("done")])


async def ping(n: int) -> int:
    """Answers n."""
    return n


bench_agent = Agent(
    FunctionModel(_model),
    name="bench",
    tools=[ping],
    capabilities=[FuseeDurability()],
)


@fusee.workflow("bench.pydantic_ai")
async def agent(ctx: fusee.Context, turns: int) -> str:
    result = await run(ctx, lambda: bench_agent.run(f"ping {turns} times"))
    return result.output


async def main(repeats: int, w1_steps: int) -> None:
    kinds = ["turn", "step", "same", "one", "plain"]
    per: dict[str, list[float]] = {k: [] for k in kinds}
    floors: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            engine = await fusee.connect(server.url, namespace="pydai")
            probe = await Floor.open(server.url, "FLOOR_PYDAI")
            async with engine.worker():
                await (await engine.start(agent, "warm-agent", TURNS)).result(timeout=120)
                await (await engine.start(steps, "warm-steps", w1_steps)).result(timeout=120)
                for r in range(repeats):
                    for kind in kinds[r % 5 :] + kinds[: r % 5]:
                        floors.append(statistics.median(await probe.block(NEAR)))
                        t0 = time.perf_counter()
                        if kind == "step":
                            run_ = await engine.start(steps, f"steps-{r}", w1_steps)
                            await run_.result(timeout=120)
                            per[kind].append((time.perf_counter() - t0) * 1000 / w1_steps)
                            continue
                        if kind == "same":
                            await (await engine.start(steps, f"same-{r}", 2 * TURNS + 1)).result(
                                timeout=120
                            )
                        elif kind == "one":
                            run_ = await engine.start(agent, f"one-{r}", 1)
                            assert await run_.result(timeout=120) == "done"
                        elif kind == "plain":
                            assert (await bench_agent.run(f"ping {TURNS} times")).output == "done"
                        else:
                            run_ = await engine.start(agent, f"agent-{r}", TURNS)
                            assert await run_.result(timeout=120) == "done"
                        per[kind].append((time.perf_counter() - t0) * 1000)
            await probe.close()
            await engine.close()
        finally:
            server.stop()
    whole = [t / TURNS for t in per["turn"]]
    turn, step = statistics.median(whole), statistics.median(per["step"])
    marginal = (statistics.median(per["turn"]) - statistics.median(per["one"])) / (TURNS - 1)
    same = sorted(t / s for t, s in zip(per["turn"], per["same"], strict=True))
    floor = statistics.median(floors)
    alone = statistics.median(per["plain"]) / TURNS
    out = {
        "bench": "pydantic_ai",
        "turns": TURNS,
        "ms_per_turn": round(turn, 3),
        "ms_per_turn_spread": [round(min(whole), 3), round(max(whole), 3)],
        "w1_ms_per_step": round(step, 3),
        "turn_over_step": round(turn / step, 2),
        "marginal_ms_per_turn": round(marginal, 3),
        "marginal_turn_over_step": round(marginal / step, 2),
        "agent_over_same_steps": round(statistics.median(same), 2),
        "pydantic_ai_alone_ms_per_turn": round(alone, 3),
        # what fusee adds to a turn: its marginal cost less Pydantic AI's own
        "fusee_ms_per_turn": round(marginal - alone, 3),
        "fusee_turn_over_step": round((marginal - alone) / step, 2),
        "turn_ratio_to_floor": round(turn / floor, 2),
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
