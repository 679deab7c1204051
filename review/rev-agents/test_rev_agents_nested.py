"""Repro: an agent used as a tool whose own tool needs approval (rev-agents)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from agents import Agent, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from tests.workers.procs import wait_until

import fusee
from fusee.actors.worker import WorkerConfig
from fusee.ai.openai import run

pytestmark = pytest.mark.timeout(60)
set_tracing_disabled(True)

WIRES: list[int] = []
TOKENS: dict[str, str] = {}
AGENTS: dict[str, Agent[Any]] = {}


@function_tool(needs_approval=True)
def wire(amount: int) -> str:
    """Wire money."""
    WIRES.append(amount)
    return f"wired {amount}"


@fusee.workflow("rev_oa_nested")
async def nested(ctx: fusee.Context, question: str) -> Any:
    def ask(cb: Any) -> None:
        TOKENS[ctx.run_id] = cb.token

    result = await run(ctx, AGENTS[ctx.run_id], question, approve=ask)
    return result.final_output


@pytest.mark.parametrize("replay", [False, True])
async def test_an_agent_tool_whose_tool_needs_approval(engine: fusee.Engine, replay: bool) -> None:
    """The SDK (0.24) surfaces a nested agent tool's approval in the outer run's
    interruptions and resumes the nested run from its state. The durable copy runs
    the agent tool as ONE step: the step journals whatever the interrupted nested
    run returned, and the SDK's side table of nested results (agent_tool_state) is
    not journaled. Expected: the person is asked, approves, the wire runs once and
    the outer agent answers. On fix/agents: in memory (replay=False) it works; after
    any replay (replay=True here; in production: the person answers after the run
    parked, which is the normal case, or a crash) the run PAUSES for good with a
    DeterminismError: "step 3 is 'completion approve:wire:w1' in the journal, but the
    code now calls 'model'" (the replayed agent-tool step no longer interrupts)."""
    WIRES.clear()
    run_id = f"nested-{replay}"
    treasurer = Agent(
        name="treasurer",
        tools=[wire],
        model=ScriptedModel(
            [[function_call("wire", {"amount": 7}, call_id="w1")], [assistant_message("sent 7")]]
        ),
    )
    AGENTS[run_id] = Agent(
        name="desk",
        tools=[treasurer.as_tool(tool_name="ask_treasurer", tool_description="Treasury.")],
        model=ScriptedModel(
            [
                [function_call("ask_treasurer", {"input": "wire 7"}, call_id="t1")],
                [assistant_message("The treasurer sent 7.")],
            ]
        ),
    )
    async with engine.worker(config=WorkerConfig(always_replay=replay)):
        run_ = await engine.start("rev_oa_nested", run_id, "wire 7")
        token = await wait_until(
            functools.partial(TOKENS.get, run_id), timeout=20, what="the approval's ask"
        )
        assert await engine.complete(token, True)
        assert await run_.result(timeout=20) == "The treasurer sent 7."
    assert WIRES == [7]
