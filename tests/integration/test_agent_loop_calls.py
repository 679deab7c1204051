"""``fusee.ai.loop``'s tool calls across runs and at the edges (issue 13): ``s.key``
unique per run when the model's call IDs are not, made-up IDs, names too long for
their steps or children, a tool's ``FatalError`` (raised as one, failing fast), two
approvals in one turn, ``parallel_tools=False``. Workflows: ``tests/workers/loop_agents.py``
and ``tests/workers/agents.py``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.runtime.records import CallCancelled, RunStarted, StepFailed, WaitDone
from fusee.testing import ScriptedModel
from tests.integration.test_agent_loop import (
    agent_arg,
    calls,
    failed_with,
    fails_fatally,
    ran_calls,
    requests,
    start_worker,
    tool_results,
)
from tests.workers.procs import HERE, journal_calls, wait_until

pytestmark = pytest.mark.timeout(120)
MOD = HERE / "loop_agents.py"


async def start_loop_worker(worker_procs: Any, tmp_path: Path, module: Path = MOD) -> None:
    """A worker process serving ``module``'s workflows, ``LOOP_DIR`` its ``tmp_path``."""
    workers = worker_procs()
    workers.module = module
    await workers.start(extra_env={"LOOP_DIR": str(tmp_path)})


def _charged(tmp_path: Path) -> list[str]:
    return sorted(p.read_text() for p in (tmp_path / "payments").iterdir())


async def test_two_runs_with_id_less_tool_calls_both_charge(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    """A model that gives its calls no ID: the loop's made-up IDs differ between runs
    (and take only the characters Anthropic takes back), so do the tools' keys."""
    await start_loop_worker(worker_procs, tmp_path)
    r1 = await (await engine.start("loop-noid", "noid-1", {"order": "o-1"})).result(timeout=60)
    r2 = await (await engine.start("loop-noid", "noid-2", {"order": "o-2"})).result(timeout=60)
    assert r1["text"] == r2["text"] == "done"
    assert _charged(tmp_path) == ["o-1", "o-2"]
    made = [r["messages"][1]["tool_calls"][0]["id"] for r in (r1, r2)]
    assert made[0] != made[1]
    assert all(re.fullmatch(r"call_[0-9a-f]{32}", m) for m in made), made
    assert [r["messages"][2]["tool_call_id"] for r in (r1, r2)] == made


async def test_two_runs_whose_server_counts_call_ids_both_charge(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    """A server that numbers calls ``call_0`` (llama.cpp-style): the ID is kept, the
    key is still the run's own."""
    await start_loop_worker(worker_procs, tmp_path)
    for i in (1, 2):
        arg = {"order": f"o-{i}", "id": "call_0"}
        out = await (await engine.start("loop-noid", f"cnt-{i}", arg)).result(timeout=60)
        assert out["messages"][1]["tool_calls"][0]["id"] == "call_0"
    assert _charged(tmp_path) == ["o-1", "o-2"]
    assert all(k.endswith("-call_0") for k in (p.name for p in (tmp_path / "payments").iterdir()))


async def test_a_long_but_valid_loop_name_is_refused_at_the_call(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    """loop name 100 characters, tool name 40: both valid, but ``<name>/tool-9-<tool>``
    is 148 bytes: InvalidArgument at the call, the model not asked."""
    await start_loop_worker(worker_procs, tmp_path)
    log = str(tmp_path / "model.jsonl")
    arg = {"log": log, "name": 100, "tool": "t" * 40, "call": "t" * 40}
    run = await engine.start("loop-longname", "long-1", arg)
    message = await failed_with(run, "fusee.InvalidArgument")
    assert "step names would be too long" in message
    assert "got 148" in message
    assert ScriptedModel([], log=log).requests == []


async def test_an_unknown_tool_whose_name_makes_its_step_name_too_long_is_labelled(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    """The model names an unknown tool of 64 characters (valid) after a loop name of 60:
    the step is ``<name>/tool-0-unknown-tool`` and the model reads that there is none."""
    await start_loop_worker(worker_procs, tmp_path)
    arg = {"log": str(tmp_path / "model.jsonl"), "name": 60, "tool": "t", "call": "z" * 64}
    run = await engine.start("loop-longname", "long-2", arg)
    out = await run.result(timeout=60)
    assert out["text"] == "done"
    assert out["messages"][2]["content"].startswith(f"there is no tool '{'z' * 64}'")
    assert ("step", f"{'a' * 60}/tool-0-unknown-tool") in journal_calls(await run.journal())


async def test_a_workflow_tool_call_in_a_run_with_a_long_id(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    """Run ID 200 bytes, provider call ID 60: ``<run id>/<call id>`` would be 261 bytes,
    so the child's ID holds the call ID's hash."""
    cid = "toolu_" + "x" * 54
    script = [{"calls": [calls("lookup_order", cid, order="o-1")]}, {"text": "done"}]
    arg = agent_arg(tmp_path, script)
    await start_worker(worker_procs, tmp_path)
    run = await engine.start("agent", "r" * 200, arg)
    result = await run.result(timeout=60)
    assert result["text"] == "done"
    [(_, child)] = [c for c in journal_calls(await run.journal()) if c[0] == "child"]
    assert re.fullmatch("r{200}/[0-9a-f]{16}", child), child
    started = [r for _, r in await engine.run(child).journal() if isinstance(r, RunStarted)]
    assert [r.parent for r in started] == ["r" * 200]


async def test_a_run_id_too_long_for_a_workflow_tools_child_is_refused_at_the_call(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    arg = agent_arg(tmp_path, [{"text": "never asked"}])
    await start_worker(worker_procs, tmp_path)
    run = await engine.start("agent", "r" * 250, arg)
    message = await failed_with(run, "fusee.InvalidArgument")
    assert "too long for a workflow tool's child run ID" in message
    assert requests(arg) == []


async def test_a_tool_fatal_error_is_raised_by_loop_as_fatal_error(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    await start_loop_worker(worker_procs, tmp_path)
    out = await (await engine.start("loop-fatal", "fatal-x", {})).result(timeout=60)
    assert out.startswith("caught FatalError: loop 'agent': tool 'locked' (call c1)"), out
    assert "the ledger is locked" in out
    assert out.endswith("(from StepFailedError)"), out


async def test_two_approvals_and_a_plain_call_in_one_turn(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    """Two refunds behind approvals and a search in one turn: each approval its own
    token, one refused and one approved, the search run at once."""
    script = [
        {
            "calls": [
                calls("refund", "c-1", order="o-1", amount=10),
                calls("search_kb", "c-2", query="q"),
                calls("refund", "c-3", order="o-3", amount=30),
            ]
        },
        {"text": "done"},
    ]
    arg = agent_arg(tmp_path, script)
    await start_worker(worker_procs, tmp_path)
    run = await engine.start("agent", "two-approvals", arg)
    asked = Path(arg["asked"])
    lines = await wait_until(
        lambda: (
            asked.exists()
            and len(asked.read_text().splitlines()) == 2
            and asked.read_text().splitlines()
        ),
        timeout=30,
        what="both asks",
    )
    tokens = {line.split()[0]: line.split()[3] for line in lines}
    assert tokens["c-1"] != tokens["c-3"]
    assert await engine.complete(tokens["c-3"], {"approved": False, "reason": "too much"})
    assert await engine.complete(tokens["c-1"], True)
    got = tool_results(await run.result(timeout=60))
    assert got["c-1"]["content"] == "refunded 10 EUR on o-1"
    assert got["c-3"]["content"] == "the call was not approved, so it did not run: too much"
    assert got["c-2"]["content"].startswith("kb: q")
    assert sorted(ran_calls(arg)) == [("refund", "c-1"), ("search_kb", "c-2")]


async def test_parallel_tools_false_runs_the_calls_one_after_the_other(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    """``parallel_tools=False``: meet a gives up waiting for b (it would meet b if they
    ran at once), then meet b finds a; an approval and an unknown tool in the same turn."""
    script = [
        {
            "calls": [
                calls("meet", "c-a", who="a"),
                calls("meet", "c-b", who="b"),
                calls("refund", "c-r", order="o", amount=1),
                calls("nope", "c-n"),
            ]
        },
        {"text": "done"},
    ]
    arg = agent_arg(tmp_path, script, meet_timeout=1, parallel=False)
    await start_worker(worker_procs, tmp_path)
    run = await engine.start("agent", "seq-1", arg)
    asked = Path(arg["asked"])
    line = await wait_until(lambda: asked.exists() and asked.read_text(), timeout=30, what="ask")
    assert await engine.complete(line.split()[3], {"approved": False})
    got = tool_results(await run.result(timeout=60))
    assert got["c-a"]["is_error"]
    assert "never came" in got["c-a"]["content"]
    assert got["c-b"]["content"] == "b met a"
    assert got["c-r"]["content"] == "the call was not approved, so it did not run"
    assert got["c-n"]["content"].startswith("there is no tool 'nope'")


async def test_a_fatal_tool_fails_the_loop_without_waiting_for_another_calls_approval(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    """A turn calls ``fatal`` (FatalError) and ``refund`` (behind an approval no one
    gives): the run fails as ``fatal`` fails, the approval's wait cancelled."""
    script = [
        {"calls": [calls("fatal", "c-f"), calls("refund", "c-r", order="o-1", amount=5)]},
        {"text": "unreachable"},
    ]
    arg, journal = await fails_fatally(engine, worker_procs, tmp_path, "fatal-wait", script)
    assert [r.error_type for _, r in journal if isinstance(r, StepFailed)] == ["fusee.FatalError"]
    assert not [r for _, r in journal if isinstance(r, WaitDone)]
    cancelled = [(r.call, r.name) for _, r in journal if isinstance(r, CallCancelled)]
    assert ("completion", "agent/approve-0-refund") in cancelled, cancelled
    assert ran_calls(arg) == []
