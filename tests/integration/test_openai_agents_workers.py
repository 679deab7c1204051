"""``fusee.ai.openai`` in a worker process, with the real ``openai`` client (the
Agents SDK's Chat Completions and Responses models) against the fake server
(``tests/fakes/agents_server.py``), which counts what it is asked
(``tests/workers/openai_agents.py``).
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from fusee.runtime.records import RunPaused, RunResumed, StepCompleted
from tests.fakes.agents_server import AgentsFake
from tests.fakes.openai_server import Reply
from tests.helpers import cli_cmd, cli_env
from tests.workers.procs import HERE, execution_lines, wait_until

pytestmark = pytest.mark.timeout(120)

MODULE = HERE / "openai_agents.py"
FINAL = "Refunded 3 on o-1; o-2 has shipped."
SCRIPT = [
    Reply(tool_calls=[("c1", "lookup_order", '{"order":"o-1"}')]),
    Reply(
        tool_calls=[
            ("c2", "refund", '{"order":"o-1","amount":3}'),
            ("c3", "lookup_order", '{"order":"o-2"}'),
        ]
    ),
    Reply(FINAL),
]
STEPS = ["model", "tool:lookup_order", "model", "tool:refund", "tool:lookup_order", "model"]


def agent_arg(tmp_path: Path, fake: AgentsFake, api: str, **extra: Any) -> dict[str, Any]:
    return {
        "base_url": fake.base_url,
        "api": api,
        "question": "Refund 3 on o-1, and where is o-2?",
        "effects": str(tmp_path / "effects.log"),
        "store": str(tmp_path / "store"),
        "killed": str(tmp_path / "killed"),
        **extra,
    }


async def step_names(run: fusee.Run) -> list[str]:
    done = [r for _, r in await run.journal() if isinstance(r, StepCompleted)]
    return [r.name for r in sorted(done, key=lambda r: r.pos)]


def effects_by_call(arg: dict[str, Any]) -> collections.Counter[tuple[str, str]]:
    """Executions per (what, tool-call ID): a key is ``<32 hex step key>-<call id>``."""
    return collections.Counter(
        (what, key.partition("-")[2]) for what, key, _ in execution_lines(Path(arg["effects"]))
    )


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_multi_turn_agent_with_two_tools_in_a_worker(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path, api: str
) -> None:
    workers = worker_procs()
    workers.module = MODULE
    await workers.start()
    with AgentsFake(SCRIPT) as fake:
        arg = agent_arg(tmp_path, fake, api)
        run = await engine.start("oa-support", f"two-tools-{api}", arg)
        assert await run.result(timeout=30) == FINAL
        assert fake.turns() == [0, 1, 2]
        assert {r.path for r in fake.snapshot()} == {
            "/v1/responses" if api == "responses" else "/v1/chat/completions"
        }
    assert await step_names(run) == STEPS
    assert effects_by_call(arg) == {
        ("lookup:o-1", "c1"): 1,
        ("refund", "c2"): 1,
        ("lookup:o-2", "c3"): 1,
    }
    assert sorted(p.read_text() for p in Path(arg["store"]).iterdir()) == [
        "looked up o-1",
        "looked up o-2",
        "refunded 3 on o-1",
    ]


async def test_a_model_that_is_down_pauses_the_run_and_bulk_resume_finishes_it(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path, nats_server: Any, namespace: str
) -> None:
    workers = worker_procs()
    workers.module = MODULE
    await workers.start()
    with AgentsFake(SCRIPT) as fake:
        fake.down_from = 1  # the first turn answers, the second gets 500s
        fake.down.set()
        arg = agent_arg(tmp_path, fake, "chat", pause=True)
        run = await engine.start("oa-support", "down", arg)

        async def paused() -> bool:
            return any(i.run_id == "down" for i in await engine.list_runs(status="paused"))

        await wait_until(paused, timeout=30, what="the pause")
        pause = [r for _, r in await run.journal() if isinstance(r, RunPaused)]
        assert [(p.step, p.attempts) for p in pause] == [("model", 2)]
        # one request an attempt (the client's own retries are off), the waits durable
        assert fake.turns() == [0, 1, 1]

        fake.down.clear()
        cmd = cli_cmd(
            "runs", "bulk", "resume", "--workflow", "oa-support",
            "--nats", nats_server.url, "--namespace", namespace,
        )  # fmt: skip
        done = await anyio.run_process(cmd, check=False, env=cli_env())
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
        assert await run.result(timeout=30) == FINAL
        # turn 0 was journaled: never asked again
        assert fake.turns() == [0, 1, 1, 1, 2]
    assert sum(isinstance(r, RunResumed) for _, r in await run.journal()) == 1
    assert effects_by_call(arg) == {
        ("lookup:o-1", "c1"): 1,  # before the pause: not run again
        ("refund", "c2"): 1,
        ("lookup:o-2", "c3"): 1,
    }
    assert await step_names(run) == STEPS


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_run_streamed_over_the_real_client_streams_each_model_call(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path, api: str
) -> None:
    workers = worker_procs()
    workers.module = MODULE
    await workers.start()
    with AgentsFake(SCRIPT, delay=0) as fake:
        arg = agent_arg(tmp_path, fake, api)
        run = await engine.start("oa-streamed", f"streamed-{api}", arg)
        text = "".join([t async for t in engine.run(run.run_id).stream("model-2")])
        assert await run.result(timeout=30) == [FINAL, True]
        assert all(r.body.get("stream") for r in fake.snapshot())
        assert fake.turns() == [0, 1, 2]
    assert text == FINAL
    assert await step_names(run) == [
        "model-0",
        "tool:lookup_order",
        "model-1",
        "tool:refund",
        "tool:lookup_order",
        "model-2",
    ]
