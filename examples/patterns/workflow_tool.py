"""A workflow as a tool: the agent's tool is a whole workflow, with its own steps,
retries and journal; the agent waits for it as a child run.

    fusee dev examples/patterns/workflow_tool.py

``workflow_tool(research)`` makes each call of the tool the child run
``<run id>/<tool call id>-<16 hex>`` (the step name and the run's generation, hashed):
the child's ID comes from the call, so a replay of the
agent (after a crash, on another worker) attaches to the same child instead of starting
another. The tool's schema is the workflow's input type.

The model is scripted and the sources are a dict, so this runs offline.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

import fusee
import fusee.dev
from fusee.ai import ModelRequest, ToolResultMessage, UserMessage, generate, loop, workflow_tool
from fusee.testing import ScriptedModel, tool_call

SOURCES = {
    "durable execution": [
        "A durable step's result is saved before the next step runs.",
        "After a crash, the run is replayed from its journal.",
    ]
}


class Topic(msgspec.Struct):
    """What to research."""

    topic: str


def answer(request: ModelRequest, n: int) -> Any:
    """The model: the agent delegates to the research tool, then answers from its report;
    asked to summarize notes, it joins them."""
    if not request.tools:  # the research workflow's own model call
        notes = request.messages[-1]
        assert isinstance(notes, UserMessage)
        return "In short: " + " ".join(notes.content.splitlines()[1:])
    report = [m for m in request.messages if isinstance(m, ToolResultMessage)]
    if not report:
        return tool_call("research", "call_research_1", topic="durable execution")
    return f"Here is what I found. {msgspec.json.decode(report[0].content)['summary']}"


model = ScriptedModel(answer)


@fusee.workflow("research-topic")
async def research(ctx: fusee.Context, q: Topic) -> dict[str, Any]:
    """Research a topic: find sources, read them, summarize what they say."""
    found = await ctx.step("search", lambda: sorted(k for k in SOURCES if k in q.topic.lower()))
    notes = await ctx.step("read", lambda: [line for k in found for line in SOURCES[k]])
    summary = await generate(
        ctx, "summarize", model=model, prompt="Summarize:\n" + "\n".join(notes)
    )
    return {"topic": q.topic, "sources": len(notes), "summary": summary.text}


@fusee.workflow("research-agent")
async def research_agent(ctx: fusee.Context, question: str) -> str:
    result = await loop(
        ctx,
        "agent",
        model=model,
        prompt=question,
        tools={"research": workflow_tool(research)},
        max_iterations=4,
    )
    return result.text


async def main(engine: fusee.Engine) -> None:
    run_id = f"ask-{time.strftime('%m%d-%H%M%S')}"
    run = await engine.start(research_agent, run_id, "What is durable execution?")
    print(f"\n  {await run.result(timeout='30s')}\n")
    print(f"Journal of {run_id}:")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
    # the call's child run: <run id>/<tool call id>-<16 hex>, named by the parent's journal
    journal = await run.journal()
    child = engine.run(next(r.name for _, r in journal if getattr(r, "wait", None) == "child"))
    print(f"\nJournal of the tool call's child run {child.run_id}:")
    print("\n".join(fusee.dev.format_journal(await child.journal())))
    print()
