"""Orchestrator-workers: a model breaks the task down and delegates each part to a
worker workflow, then sums up.

    fusee dev examples/patterns/orchestrator_workers.py

This is ``loop`` with workflow tools: the loop is the orchestrator (each turn the step
``orchestrate/turn-<i>``), each workflow tool a worker, and every delegation a child
run ``<run id>/<tool call id>-<16 hex>`` with its own steps, retries and journal. A replay
attaches to the same child instead of starting another.
"""

from __future__ import annotations

import time

import msgspec

import fusee
import fusee.dev
from fusee.ai import AssistantMessage, ModelRequest, loop, workflow_tool
from fusee.testing import Reply, ScriptedModel, tool_call

# -- the workers: workflows with their own steps ---------------------------------------


class Search(msgspec.Struct):
    """What to look for in the repository."""

    query: str


class PullRequest(msgspec.Struct):
    """A change to propose."""

    title: str
    files: list[str]


FILES = {"retry": ["src/retry.py", "tests/test_retry.py"]}
PULLS: dict[str, int] = {}  # the forge, standing in: a pull request per idempotency key


def forge_open(title: str, branch: str, *, idempotency_key: str) -> str:
    number = PULLS.setdefault(idempotency_key, len(PULLS) + 1)  # asked twice, opens one
    return f"https://git.example/pr/{number} ({branch}: {title})"


@fusee.workflow("repo.search")
async def search_code(ctx: fusee.Context, search: Search) -> list[str]:
    """Searches the code for a query; returns the files that match."""
    return await ctx.step("grep", lambda: FILES.get(search.query, []))


@fusee.workflow("repo.open-pr")
async def open_pr(ctx: fusee.Context, pr: PullRequest) -> str:
    """Opens a pull request with these files; returns its URL."""
    branch = await ctx.step("branch", lambda: "fusee/" + pr.title.lower().replace(" ", "-"))
    # s.key is the same on every attempt and after a crash: the forge's idempotency key.
    return await ctx.step("open", lambda s: forge_open(pr.title, branch, idempotency_key=s.key))


# -- the orchestrator --------------------------------------------------------------------


def scripted(request: ModelRequest, n: int) -> Reply:
    """The stand-in model: search, then open a PR with what it found, then report."""
    turn = sum(isinstance(m, AssistantMessage) for m in request.messages)
    if turn == 0:
        return tool_call("search-code", "call_search", query="retry")
    if turn == 1:
        files = msgspec.json.decode(request.messages[-1].content)
        return tool_call("open-pr", "call_pr", title="Cap the retry delay", files=files)
    return f"Done: {request.messages[-1].content}"


model = ScriptedModel(scripted)


@fusee.workflow("orchestrator")
async def orchestrator(ctx: fusee.Context, brief: str) -> str:
    result = await loop(
        ctx,
        "orchestrate",
        model=model,
        prompt=f"Ship the change described in: {brief}",
        max_iterations=12,
        tools={"search-code": workflow_tool(search_code), "open-pr": workflow_tool(open_pr)},
    )
    return result.text


async def main(engine: fusee.Engine) -> None:
    run_id = f"orchestrator-{time.strftime('%m%d-%H%M%S')}"
    run = await engine.start(orchestrator, run_id, "cap the retry delay at 30 s")
    print(f"\n  {await run.result(timeout='30s')}\n")
    print("\n".join(fusee.dev.format_journal(await run.journal())))
    journal = await run.journal()
    # each call's child run: <run id>/<tool call id>-<16 hex>, named by the parent's journal
    children = [r.name for _, r in journal if getattr(r, "wait", None) == "child"]
    print(f"\n  the worker that opened the PR, {children[-1]}:")
    print("\n".join(fusee.dev.format_journal(await engine.run(children[-1]).journal())))
