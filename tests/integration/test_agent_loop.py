"""``fusee.ai.loop`` (issue 13): the agent loop in a worker process, with a scripted
model whose record is a file (``tests/workers/agents.py``).

Each turn is the step ``agent/turn-<i>``, each tool call the step
``agent/tool-<i>-<tool>`` with ``s.key`` ``<step key>-<tool-call ID>``, a workflow tool the child
run ``<run id>/<call id>``, an approval the completion ``agent/approve-<i>-<tool>``;
what went wrong in a call is the call's result for the model, journaled.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

import fusee
from fusee.ai import ModelRequest, ToolResultMessage
from fusee.runtime.records import RunStarted, StepFailed, WaitDone, WaitStarted
from fusee.testing import ScriptedModel
from tests.workers.procs import (
    HERE,
    Workers,
    assert_chained,
    execution_lines,
    journal_calls,
    wait_until,
)

AGENTS = HERE / "agents.py"

pytestmark = pytest.mark.timeout(120)


def agent_arg(tmp_path: Path, script: list[Any], **extra: Any) -> dict[str, Any]:
    """The agent workflow's input: its script, and the test's files."""
    arg = {
        "prompt": "Where is my refund?",
        "script": script,
        "model_log": str(tmp_path / "model.jsonl"),
        "effects": str(tmp_path / "effects.log"),
        "store": str(tmp_path / "store"),
        "killed": str(tmp_path / "killed"),
        "asked": str(tmp_path / "asked.log"),
        "meet": str(tmp_path),
        "release": str(tmp_path / "release"),
        **extra,
    }
    (tmp_path / "child-arg.json").write_bytes(msgspec.json.encode(arg))
    return arg


def calls(name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A scripted tool call: ``calls("search_kb", "c-1", query="x")``."""
    cid = args[0]
    if len(args) > 1:  # raw argument text
        return {"name": name, "id": cid, "arguments": args[1]}
    return {"name": name, "id": cid, "args": kwargs}


def ran_calls(arg: dict[str, Any]) -> list[tuple[str, str]]:
    """The executions as ``(what, tool-call ID)``: a loop tool's ``s.key`` is
    ``<the step's key: 32 hex>-<the call's ID>`` (another step's, a bare step key, kept)."""
    out = []
    for what, key, _ in execution_lines(Path(arg["effects"])):
        step_key, _, call_id = key.partition("-")
        assert re.fullmatch("[0-9a-f]{32}", step_key), key
        out.append((what, call_id or key))
    return out


def requests(arg: dict[str, Any]) -> list[ModelRequest]:
    return ScriptedModel([], log=arg["model_log"]).requests


def tool_results(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The tool results of the loop's messages, by tool-call ID."""
    return {m["tool_call_id"]: m for m in result["messages"] if m["role"] == "tool"}


async def start_worker(worker_procs: Any, tmp_path: Path, **env: str) -> tuple[Workers, Any]:
    workers = worker_procs()
    workers.module = AGENTS
    proc = await workers.start(extra_env={"FUSEE_TEST_AGENT_DIR": str(tmp_path), **env})
    return workers, proc


async def test_each_turn_and_each_tool_call_is_a_step_of_the_journal(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    script = [
        {"calls": [calls("search_kb", "c-0", query="refund policy")]},
        {
            "calls": [
                calls("search_kb", "c-1a", query="delays"),
                calls("lookup_order", "c-1b", order="o-7"),
            ]
        },
        {"text": "Refunds take 3 days; o-7 has shipped."},
    ]
    arg = agent_arg(tmp_path, script)
    await start_worker(worker_procs, tmp_path)
    run = await engine.start("agent", "support-1", arg)
    result = await run.result(timeout=60)

    assert result["text"] == "Refunds take 3 days; o-7 has shipped."
    assert result["iterations"] == 3
    assert result["stopped"] is False
    assert [m["role"] for m in result["messages"]] == [
        "user", "assistant", "tool", "assistant", "tool", "tool", "assistant",
    ]  # fmt: skip
    results = tool_results(result)
    assert results["c-0"]["content"] == "kb: refund policy -> refunds take 3 days"
    assert results["c-1b"]["content"] == '{"order":"o-7","status":"shipped"}'
    assert not any(m.get("is_error") for m in results.values())

    journal = await run.journal()
    assert_chained(journal)
    # a workflow tool's child: <run id>/<call id>-<the step name and generation, hashed>
    child_id = journal_calls(journal)[4][1]
    assert re.fullmatch(r"support-1/c-1b-[0-9a-f]{16}", child_id), child_id
    assert journal_calls(journal) == [
        ("step", "agent/turn-0"),
        ("step", "agent/tool-0-search_kb"),
        ("step", "agent/turn-1"),
        ("step", "agent/tool-1-search_kb"),
        ("child", child_id),
        ("step", "agent/turn-2"),
    ]
    # s.key of a tool call's step is its step's key and the model's tool-call ID
    ran = ran_calls(arg)
    assert [r for r in ran if r[0] == "search_kb"] == [("search_kb", "c-0"), ("search_kb", "c-1a")]
    child = engine.run(child_id)
    assert await child.result(timeout=10) == {"order": "o-7", "status": "shipped"}
    started = [r for _, r in await child.journal() if isinstance(r, RunStarted)]
    assert [(r.workflow, r.parent) for r in started] == [("orders-lookup", "support-1")]

    sent = requests(arg)
    assert len(sent) == 3  # one request per turn
    assert [t.name for t in sent[0].tools] == [
        "search_kb", "charge", "notify", "meet", "boom", "fatal", "hold", "refund",
        "lookup_order", "lookup",
    ]  # fmt: skip
    search = next(t for t in sent[0].tools if t.name == "search_kb")
    assert search.description == "Search the knowledge base."
    assert search.parameters["properties"] == {
        "query": {"type": "string", "description": "the words to look for."}
    }
    lookup = next(t for t in sent[0].tools if t.name == "lookup_order")
    assert lookup.parameters["required"] == ["order"]
    assert lookup.description == "Look up an order's status."
    last = sent[2].messages
    assert isinstance(last[-1], ToolResultMessage)
    assert [m.tool_call_id for m in last if isinstance(m, ToolResultMessage)] == [
        "c-0",
        "c-1a",
        "c-1b",
    ]
    usage = result["usage"]
    assert usage["output_tokens"] == 1 + 2 + len(result["text"].split())


async def test_the_tool_calls_of_one_turn_run_at_once(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    # meet("a") waits until meet("b") started, and the other way round: run one
    # after the other, the first gives up after meet_timeout
    script = [
        {"calls": [calls("meet", "c-a", who="a"), calls("meet", "c-b", who="b")]},
        {"text": "both met"},
    ]
    arg = agent_arg(tmp_path, script, meet_timeout=5)
    await start_worker(worker_procs, tmp_path)
    result = await (await engine.start("agent", "meet-1", arg)).result(timeout=60)
    results = tool_results(result)
    assert results["c-a"]["content"] == "a met b", results
    assert results["c-b"]["content"] == "b met a", results


async def test_a_workflow_tool_is_a_child_run_that_a_replay_attaches_to(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    script = [
        {"calls": [calls("lookup_order", "c-9", order="o-9")]},
        {"text": "o-9 has shipped"},
    ]
    # the worker dies in the child's step: the next worker replays the parent, which
    # attaches to the same child run (it does not start another)
    arg = agent_arg(tmp_path, script, kill_at="lookup:o-9:before")
    workers, first = await start_worker(worker_procs, tmp_path)
    run = await engine.start("agent", "orders-1", arg)
    await wait_until(lambda: not first.alive, timeout=30, what="the worker to kill itself")
    await workers.start(extra_env={"FUSEE_TEST_AGENT_DIR": str(tmp_path)})
    result = await run.result(timeout=60)
    assert result["text"] == "o-9 has shipped"
    assert tool_results(result)["c-9"]["content"] == '{"order":"o-9","status":"shipped"}'

    journal = await run.journal()
    child_id = journal_calls(journal)[1][1]
    assert re.fullmatch(r"orders-1/c-9-[0-9a-f]{16}", child_id), child_id
    assert journal_calls(journal) == [
        ("step", "agent/turn-0"),
        ("child", child_id),
        ("step", "agent/turn-1"),
    ]
    assert len([r for _, r in journal if isinstance(r, WaitStarted)]) == 1
    child = engine.run(child_id)
    started = [r for _, r in await child.journal() if isinstance(r, RunStarted)]
    assert len(started) == 1
    looks = [k for n, k, _ in execution_lines(Path(arg["effects"])) if n == "lookup:o-9"]
    assert len(looks) == 2
    assert len(set(looks)) == 1
    assert len(list(Path(arg["store"]).iterdir())) == 1  # its effect applied once
    assert len(requests(arg)) == 2


async def _approval(
    engine: fusee.Engine, tmp_path: Path, run_id: str, value: Any
) -> tuple[dict[str, Any], dict[str, Any], list[tuple[int, Any]]]:
    script = [
        {"calls": [calls("refund", "c-r", order="o-1", amount=30)]},
        {"text": "done"},
    ]
    arg = agent_arg(tmp_path, script)
    run = await engine.start("agent", run_id, arg)
    asked = Path(arg["asked"])
    line = await wait_until(
        lambda: asked.exists() and asked.read_text(), timeout=30, what="the ask"
    )
    call_id, tool, arguments, token = line.split()
    assert (call_id, tool, msgspec.json.decode(arguments)) == (
        "c-r",
        "refund",
        {"order": "o-1", "amount": 30},
    )
    assert [n for n, _, _ in execution_lines(Path(arg["effects"]))] == []  # it waits
    assert await engine.complete(token, value)
    return await run.result(timeout=60), arg, await run.journal()


async def test_an_approved_tool_runs_after_its_completion(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    await start_worker(worker_procs, tmp_path)
    result, arg, journal = await _approval(engine, tmp_path, "approve-1", True)
    assert tool_results(result)["c-r"]["content"] == "refunded 30 EUR on o-1"
    assert ran_calls(arg) == [("refund", "c-r")]
    assert journal_calls(journal) == [
        ("step", "agent/turn-0"),
        ("completion", "agent/approve-0-refund"),
        ("step", "ask/agent/approve-0-refund"),
        ("step", "agent/tool-0-refund"),
        ("step", "agent/turn-1"),
    ]
    done = [r for _, r in journal if isinstance(r, WaitDone)]
    assert [msgspec.json.decode(bytes(d.value)) for d in done] == [True]


async def test_a_refused_approval_is_the_tool_result_and_the_tool_does_not_run(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    await start_worker(worker_procs, tmp_path)
    refusal = {"approved": False, "reason": "over the limit"}
    result, arg, journal = await _approval(engine, tmp_path, "refuse-1", refusal)
    assert tool_results(result)["c-r"]["content"] == (
        "the call was not approved, so it did not run: over the limit"
    )
    assert result["text"] == "done"
    assert execution_lines(Path(arg["effects"])) == []
    assert journal_calls(journal) == [
        ("step", "agent/turn-0"),
        ("completion", "agent/approve-0-refund"),
        ("step", "ask/agent/approve-0-refund"),
        ("step", "agent/turn-1"),
    ]
    second = requests(arg)[1].messages[-1]
    assert isinstance(second, ToolResultMessage)
    assert second.content.endswith("over the limit")


async def test_a_tool_that_raises_gives_the_model_the_error(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    script = [{"calls": [calls("boom", "c-b", order="o-404")]}, {"text": "sorry"}]
    arg = agent_arg(tmp_path, script)
    await start_worker(worker_procs, tmp_path)
    run = await engine.start("agent", "boom-1", arg)
    result = await run.result(timeout=60)
    got = tool_results(result)["c-b"]
    assert got["content"] == "tool 'boom' failed: ValueError: no such order o-404"
    assert got["is_error"] is True
    failed = [r for _, r in await run.journal() if isinstance(r, StepFailed)]
    assert [(f.name, f.error_type, f.message) for f in failed] == [
        ("agent/tool-0-boom", "ValueError", "no such order o-404")
    ]
    sent = requests(arg)[1].messages[-1]
    assert isinstance(sent, ToolResultMessage)
    assert sent.is_error


async def failed_with(run: fusee.Run, error_type: str) -> str:
    """The message of the error ``run`` failed with, checked to be an ``error_type``."""
    with pytest.raises(fusee.RunFailed) as failed:
        await run.result(timeout=30)
    assert failed.value.error_type == error_type, failed.value
    return failed.value.message


async def fails_fatally(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path, run_id: str, script: list[Any]
) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
    """Run the agent with ``script``, whose ``fatal`` call fails the run with
    ``FatalError``; the agent's input and the run's journal."""
    arg = agent_arg(tmp_path, script)
    await start_worker(worker_procs, tmp_path)
    run = await engine.start("agent", run_id, arg)
    assert "the ledger is locked" in await failed_with(run, "fusee.FatalError")
    return arg, await run.journal()


async def test_a_tool_that_raises_fatal_error_fails_the_run(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    script = [{"calls": [calls("fatal", "c-f")]}, {"text": "unreachable"}]
    arg, _ = await fails_fatally(engine, worker_procs, tmp_path, "fatal-1", script)
    assert len(requests(arg)) == 1  # the model was not asked again


async def test_bad_tool_calls_are_journaled_results_for_the_model(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    script = [
        {
            "calls": [
                calls("no_such_tool", "c-n", x=1),
                calls("search_kb", "c-v", query=5),
                calls("search_kb", "c-j", "{not json"),
                calls("search_kb", "c-x", query="ok", extra=True),
            ]
        },
        {"text": "fixed"},
    ]
    arg = agent_arg(tmp_path, script)
    await start_worker(worker_procs, tmp_path)
    run = await engine.start("agent", "bad-1", arg)
    result = await run.result(timeout=60)
    results = tool_results(result)
    assert results["c-n"]["content"].startswith("there is no tool 'no_such_tool'; the tools are: ")
    assert "search_kb" in results["c-n"]["content"]
    assert results["c-v"]["content"] == (
        "invalid arguments for tool 'search_kb': Expected `str`, got `int` - at `$.query`; "
        "call it again with arguments that match its schema"
    )
    assert results["c-j"]["content"].startswith("the arguments of tool 'search_kb' are not JSON")
    assert "unknown field `extra`" in results["c-x"]["content"]
    assert all(r["is_error"] for r in results.values())
    assert execution_lines(Path(arg["effects"])) == []  # no tool ran
    failed = [r for _, r in await run.journal() if isinstance(r, StepFailed)]
    # one turn's calls run together: their failures are journaled in any order
    assert sorted((f.name, f.error_type) for f in failed) == [
        ("agent/tool-0-no_such_tool", "fusee.UnknownTool"),
        ("agent/tool-0-search_kb", "fusee.ToolInputError"),
        ("agent/tool-0-search_kb", "fusee.ToolInputError"),
        ("agent/tool-0-search_kb", "fusee.ToolInputError"),
    ]
    assert all(f.attempt == 1 for f in failed)  # never retried


async def test_max_iterations_zero_fails_at_the_call_and_journals_nothing(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    arg = agent_arg(tmp_path, [{"text": "never asked"}], max_iterations=0)
    await start_worker(worker_procs, tmp_path)
    run = await engine.start("agent", "zero-1", arg)
    with pytest.raises(fusee.RunFailed) as failed:
        await run.result(timeout=60)
    assert failed.value.error_type == "fusee.InvalidArgument"
    assert "max_iterations=0" in failed.value.message
    assert journal_calls(await run.journal()) == []
    assert requests(arg) == []


async def test_max_iterations_used_up_fails_the_run_with_fatal_error(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    script = [
        {"calls": [calls("search_kb", "c-1", query="a")]},
        {"calls": [calls("search_kb", "c-2", query="b")]},
        {"text": "too late"},
    ]
    arg = agent_arg(tmp_path, script, max_iterations=2)
    await start_worker(worker_procs, tmp_path)
    run = await engine.start("agent", "max-1", arg)
    message = await failed_with(run, "fusee.FatalError")
    assert "no final answer after 2 turn(s)" in message
    assert "search_kb" in message
    assert len(requests(arg)) == 2


async def test_tools_changed_between_deploys_make_the_replay_name_both_calls(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    # deploy a: "lookup" is a function (a step); deploy b: a workflow tool (a child run)
    script = [
        {"calls": [calls("lookup", "c-l", order="o-3")]},
        {"calls": [calls("hold", "c-h")]},
        {"text": "done"},
    ]
    arg = agent_arg(tmp_path, script)
    workers, first = await start_worker(worker_procs, tmp_path)
    run = await engine.start("agent", "deploy-1", arg)
    effects = Path(arg["effects"])
    await wait_until(
        lambda: [n for n, _, _ in execution_lines(effects)] == ["hold"],
        timeout=30,
        what="turn 1's tool to be running",
    )
    first.kill()
    await workers.start(
        extra_env={"FUSEE_TEST_AGENT_DIR": str(tmp_path), "FUSEE_TEST_AGENT_DEPLOY": "b"}
    )
    Path(arg["release"]).touch()

    async def paused() -> Any:
        info = await run.describe()
        return info if info.status == "paused" else None

    info = await wait_until(paused, timeout=30, what="the run to pause")
    assert "step 'agent/tool-0-lookup'" in info.reason
    assert re.search(r"child 'deploy-1/c-l-[0-9a-f]{16}'", info.reason), info.reason
    assert len(requests(arg)) == 2  # the replay asked the model nothing


async def test_turn_calls_its_own_model_and_stop_ends_the_loop_early(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    # the evaluator-optimizer case: each turn drafts and scores; stop judges the score
    # (a step of the workflow) and ends the loop at the first draft over the bar
    arg = agent_arg(tmp_path, [], scores={"draft 0": 0.3, "draft 1": 0.6, "draft 2": 0.9}, bar=0.8)
    await start_worker(worker_procs, tmp_path)
    run = await engine.start("evaluator", "refine-1", arg)
    result = await run.result(timeout=60)
    assert result["text"] == "draft 2"
    assert result["stopped"] is True
    assert result["iterations"] == 3
    assert [m["content"] for m in result["messages"] if m["role"] == "tool"] == [
        "0.3",
        "0.6",
        "0.9",
    ]
    assert journal_calls(await run.journal()) == [
        ("step", "refine/turn-0"),
        ("step", "refine/tool-0-score"),
        ("step", "judge-0"),
        ("step", "refine/turn-1"),
        ("step", "refine/tool-1-score"),
        ("step", "judge-1"),
        ("step", "refine/turn-2"),
        ("step", "refine/tool-2-score"),
        ("step", "judge-2"),
    ]
    # turn= ran once a turn (also under FUSEE_ALWAYS_REPLAY), seeing the history so far
    turns = [n for n, _, _ in execution_lines(Path(arg["effects"]))]
    assert turns == ["turn:1", "turn:3", "turn:5"]


async def test_stop_that_never_says_so_runs_out_of_iterations(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    arg = agent_arg(tmp_path, [], scores={f"draft {i}": 0.1 for i in range(2)}, bar=0.8)
    arg["max_iterations"] = 2
    await start_worker(worker_procs, tmp_path)
    run = await engine.start("evaluator", "refine-2", arg)
    with pytest.raises(fusee.RunFailed) as failed:
        await run.result(timeout=60)
    assert failed.value.error_type == "fusee.FatalError"
    assert (
        "no final answer after 2 turn(s) (max_iterations=2); the last turn still called score"
        in (failed.value.message)
    )
