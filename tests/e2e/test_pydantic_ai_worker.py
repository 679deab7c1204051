"""A Pydantic AI agent in a real worker subprocess (``tests/workers/pydantic_agents.py``):
Pydantic AI's OpenAI Chat model over the real ``openai`` client against the fake server,
a multi-turn agent with two tools; a provider outage pauses the run, and
``fusee runs bulk resume`` (the CLI, a subprocess) finishes it without re-running the
steps journaled before the pause."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

import fusee
from fusee.runtime.records import RunPaused, RunResumed, StepCompleted
from tests.fakes.agent_openai import AgentFake
from tests.fakes.openai_server import Reply
from tests.helpers import run_cli
from tests.workers import procs as worker_lib
from tests.workers.procs import wait_until

worker_procs = worker_lib.worker_procs

AGENTS = Path(worker_lib.__file__).resolve().parent / "pydantic_agents.py"
FINAL = "Refunded 30 EUR on o-1."
NAMES = [
    "support__model.request",
    "support__function_toolset__<agent>.call_tool:lookup_order",
    "support__model.request",
    "support__function_toolset__<agent>.call_tool:refund",
    "support__model.request",
]


def script(key: str, turn: int) -> Reply:
    """Turn 0 looks the order up, turn 1 refunds, turn 2 answers."""
    if turn == 0:
        return Reply(tool_calls=[("c1", "lookup_order", json.dumps({"order": "o-1"}))])
    if turn == 1:
        return Reply(tool_calls=[("c2", "refund", json.dumps({"order": "o-1", "amount": 30}))])
    return Reply(FINAL)


@pytest.fixture
def fake() -> Iterator[AgentFake]:
    with AgentFake(script, delay=0.0) as f:
        yield f


def deps(tmp_path: Path, prompt: str, **extra: Any) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "effects": str(tmp_path / "effects.log"),
        "store": str(tmp_path / "store"),
        "killed": str(tmp_path / "killed"),
        **extra,
    }


def effects(arg: dict[str, Any]) -> collections.Counter[str]:
    path = Path(arg["effects"])
    lines = path.read_text().split("\n") if path.exists() else []
    return collections.Counter(line.split()[0] for line in lines if line)


async def test_a_two_tool_agent_in_a_worker_and_a_pause_resumed_from_the_cli(
    nats_server: Any, namespace: str, worker_procs: Any, fake: AgentFake, tmp_path: Path
) -> None:
    workers = worker_procs(partitions=2)
    workers.module = AGENTS
    env = {"FUSEE_TEST_OPENAI_URL": fake.base_url}
    await workers.start(extra_env=env)
    async with await fusee.connect(nats_server.url, namespace=namespace, partitions=2) as engine:
        ok = deps(tmp_path / "ok", "refund o-1 (ok)")
        (tmp_path / "ok").mkdir()
        run = await engine.start("pyd_support", "ok", ok)
        assert await run.result(timeout=30) == FINAL
        assert [r.name for _, r in await run.journal() if isinstance(r, StepCompleted)] == NAMES
        assert [fake.asked[(ok["prompt"], t)] for t in range(3)] == [1, 1, 1]
        assert effects(ok) == {"lookup_order": 1, "refund": 1}

        # the provider fails the second turn: its attempts run out and the run pauses
        fake.down = 1
        down = deps(tmp_path / "down", "refund o-1 (down)")
        (tmp_path / "down").mkdir()
        paused = await engine.start("pyd_support", "down", down)

        async def listed() -> bool:
            return bool(await engine.list_runs(status="paused", workflow="pyd_support"))

        await wait_until(listed, timeout=30, what="the paused listing")
        pause = [r for _, r in await paused.journal() if isinstance(r, RunPaused)]
        assert len(pause) == 1, pause
        assert pause[0].step == "support__model.request", pause
        # the step's budget: 2 attempts, the openai client's own retries off inside them
        # (its default of 2 would have asked 6 times)
        assert fake.asked[(down["prompt"], 1)] == 2
        fake.down = None  # the provider is back
        done = await run_cli(
            "runs", "bulk", "resume", "--workflow", "pyd_support",
            "--nats", nats_server.url, "--namespace", namespace,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert await paused.result(timeout=30) == FINAL
        journal = await paused.journal()
        assert sum(isinstance(r, RunResumed) for _, r in journal) == 1
        assert [r.name for _, r in journal if isinstance(r, StepCompleted)] == NAMES
        # what was journaled before the pause did not run again
        assert fake.asked[(down["prompt"], 0)] == 1
        assert fake.asked[(down["prompt"], 1)] == 3
        assert fake.asked[(down["prompt"], 2)] == 1
        assert effects(down) == {"lookup_order": 1, "refund": 1}
