"""The Agents SDK workflow its golden journal (``tests/golden/agents_runs/``) was
recorded from, and the recorder: ``python -m tests.golden.openai_agents_workflows``.

DO NOT CHANGE the workflow, like a golden file: ``test_golden_openai_agents.py``
replays the recorded journal through it, so an upgrade of ``openai-agents`` (or of
fusee.ai.openai) that changes the step names, their order, or the payloads the
adapter journals (a ``ModelResponse``'s JSON, a tool's result, a guardrail's) fails
there. The agent: an input guardrail, two turns of tool calls (two at once in the
second), a handoff to a second agent, and its answer; the model is the SDK's
``ScriptedModel``, so the recording needs no network.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from agents import (
    Agent,
    GuardrailFunctionOutput,
    function_tool,
    handoff,
    input_guardrail,
    set_tracing_disabled,
)
from agents.testing import ScriptedModel, assistant_message, function_call

import fusee
from fusee.actors.registry import Registry, Workflow
from fusee.ai.openai import run
from fusee.runtime.ids import escape

__all__ = ("REGISTRY", "RUN_ID", "RUNS", "main")

set_tracing_disabled(True)

RUNS = Path(__file__).parent / "agents_runs"
RUN_ID = "openai-agents"


@function_tool
def lookup_order(order: str) -> str:
    """Look an order up."""
    return f"{order}: shipped"


@function_tool
def refund(order: str, amount: int) -> str:
    """Refund part of an order."""
    return f"refunded {amount} on {order}"


@input_guardrail
def on_topic(ctx: Any, agent: Any, text: Any) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info={"topic": "orders"}, tripwire_triggered=False)


def agents() -> Agent[Any]:
    """The agents, made again by every activation (their models are fresh scripts: a
    replay that asked one would get its first answer, not the journaled one)."""
    closer = Agent(
        name="closer",
        instructions="Close the ticket.",
        model=ScriptedModel([[assistant_message("Refunded 3 on o-1; o-2 has shipped.")]]),
    )
    return Agent(
        name="support",
        instructions="Help with orders.",
        tools=[lookup_order, refund],
        handoffs=[handoff(closer)],
        input_guardrails=[on_topic],
        model=ScriptedModel(
            [
                [function_call("lookup_order", {"order": "o-1"}, call_id="call_a1")],
                [
                    function_call("refund", {"order": "o-1", "amount": 3}, call_id="call_b1"),
                    function_call("lookup_order", {"order": "o-2"}, call_id="call_b2"),
                ],
                [function_call("transfer_to_closer", {}, call_id="call_c1")],
            ]
        ),
    )


async def support(ctx: fusee.Context, question: str) -> Any:
    result = await run(ctx, agents(), question)
    return [result.final_output, result.last_agent.name]


REGISTRY = Registry()
REGISTRY.add(Workflow("golden.openai_agents", support, str, True))


async def _record(url: str) -> list[bytes]:
    async with (
        await fusee.connect(url, namespace="golden", partitions=1) as engine,
        engine.worker(registry=REGISTRY),
    ):
        with anyio.fail_after(60):
            r = await engine.start("golden.openai_agents", RUN_ID, "Refund 3 on o-1; o-2?")
            print(RUN_ID, "->", await r.result())
        return [m.data for m in await engine.store.read_journal(escape(RUN_ID))]


def main() -> None:
    """Record the journal into ``DIR`` (default ``agents_runs/``): only for a new file."""
    from fusee.adapters.jetstream.server import EmbeddedServer

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else RUNS
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            records = anyio.run(_record, server.url)
        finally:
            server.stop()
    out.mkdir(exist_ok=True)
    (out / f"{RUN_ID}.jsonl").write_bytes(b"".join(r + b"\n" for r in records))
    print(f"wrote {out / RUN_ID}.jsonl ({len(records)} records)")


if __name__ == "__main__":
    main()
