"""fusee.ai.pydantic with Pydantic AI's parallel tool calls (its default) inside a
workflow: the calls of one model response run at once, as tasks of Pydantic AI's own,
and their steps ending in another order than they began (skewed by the test) take
the positions they had, live, replayed after every step, and after a SIGKILL.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

import fusee
from fusee.actors.worker import WorkerConfig
from fusee.ai.pydantic import FuseeDurability, run, tool_key
from fusee.runtime.records import RunPaused, StepCompleted
from tests.helpers import registry_of
from tests.workers.procs import assert_chained, wait_until
from tests.workers.pydantic_parallel import _answer

PARALLEL = Path(__file__).resolve().parent.parent / "workers" / "pydantic_parallel.py"
LOOKUP = "support__function_toolset__<agent>.call_tool:lookup_order"
REFUND = "support__function_toolset__<agent>.call_tool:refund"
EXPECTED = "lookup_order=A1:shipped | refund=refunded 5"

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("always_replay", [False, True], ids=["live", "replayed"])
async def test_two_tool_calls_run_at_once_and_end_in_another_order(
    engine: fusee.Engine, always_replay: bool
) -> None:
    # lookup_order returns only once refund returned: one after the other (the
    # model's order), the run would wait forever; so the two run at once, and refund's
    # step ends first.
    calls: collections.Counter[str] = collections.Counter()
    refunded = anyio.Event()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls["model"] += 1
        return _answer(messages, info)

    async def lookup_order(order: str) -> str:
        """Look an order up."""
        calls[f"lookup_order {tool_key()}"] += 1
        with anyio.fail_after(10):
            await refunded.wait()
        return f"{order}:shipped"

    async def refund(ctx: RunContext[None], order: str, amount: int) -> str:
        """Refund part of an order."""
        calls[f"refund {tool_key()}"] += 1
        refunded.set()
        return f"refunded {amount}"

    agent = Agent(
        FunctionModel(model),
        name="support",
        tools=[lookup_order, refund],
        capabilities=[FuseeDurability()],
    )

    async def support(ctx: fusee.Context, _arg: Any) -> str:
        result = await run(ctx, lambda: agent.run("refund A1"))
        return result.output

    config = WorkerConfig(always_replay=always_replay)
    async with engine.worker(registry=registry_of(support, "support"), config=config):
        run_ = await engine.start("support", "p-par", None)
        assert await run_.result(timeout=30) == EXPECTED
    journal = await run_.journal()
    assert_chained(journal)
    done = [r for _, r in journal if isinstance(r, StepCompleted)]
    # positions in the model's order, the journal in the order they ended
    assert {r.pos: r.name for r in done} == {
        1: "support__model.request",
        2: LOOKUP,
        3: REFUND,
        4: "support__model.request",
    }
    assert [r.name for r in done] == [
        "support__model.request",
        REFUND,
        LOOKUP,
        "support__model.request",
    ]
    assert calls["model"] == 2  # never asked again for a journaled response
    tools = {k: n for k, n in calls.items() if k != "model"}
    assert sorted(k.split()[0] for k in tools) == ["lookup_order", "refund"]
    assert set(tools.values()) == {1}  # each once
    assert not [r for _, r in journal if isinstance(r, RunPaused)]


async def test_killed_while_one_tool_runs_only_that_tool_runs_again(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs(partitions=4)
    workers.module = PARALLEL
    log, release, models = tmp_path / "effects.log", tmp_path / "release", tmp_path / "models"
    env = {"FUSEE_TEST_MODEL_LOG": str(models)}
    first = await workers.start(extra_env=env)
    run_ = await engine.start("pyd_parallel", "p-kill", {"log": str(log), "until": str(release)})
    # refund ended while lookup_order waits for `release`: the kill cuts lookup_order
    await first.wait_for("step.completed", run_id="p-kill", step=REFUND, timeout=20)

    def lookup_began() -> bool:
        return log.exists() and "lookup_order" in log.read_text()

    await wait_until(lookup_began, timeout=10, what="lookup_order to begin")
    first.kill()
    release.touch()
    await workers.start(extra_env=env)
    assert await run_.result(timeout=30) == EXPECTED
    lines = log.read_text().splitlines()
    assert models.read_text().splitlines() == ["model -"] * 2  # none asked again
    refunds = [line for line in lines if line.startswith("refund ")]
    lookups = [line for line in lines if line.startswith("lookup_order ")]
    assert len(refunds) == 1  # its step ended before the kill: it never runs again
    assert len(lookups) == 2  # cut, then again
    assert len(set(lookups)) == 1  # under one key
    journal = await run_.journal()
    assert_chained(journal)
    assert not [r for _, r in journal if isinstance(r, RunPaused)]
