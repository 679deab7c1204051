"""Review rfix (fix/ai3): a workflow tool's child ID once repeated within a run, a
streamed turn of a later generation read an earlier one's stream, a failed approval
ask crashed the run, a second streamed loop of one name was refused at its first turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fusee
from tests.integration.test_agent_loop_calls import start_loop_worker
from tests.workers.procs import HERE

pytestmark = pytest.mark.timeout(120)
MOD = HERE / "loop_generations.py"


async def _worker(worker_procs: Any, tmp_path: Path) -> None:
    await start_loop_worker(worker_procs, tmp_path, MOD)


def _sent(tmp_path: Path) -> list[str]:
    d = tmp_path / "sent"
    return sorted(p.read_text() for p in d.iterdir()) if d.exists() else []


@pytest.mark.parametrize(
    ("texts", "sent"),
    [(("hi", "hi"), ["hi", "hi"]), (("a", "b"), ["a", "b"])],
    ids=["same_input_both_send", "other_input"],
)
async def test_two_loops_of_a_run_with_the_same_call_id_each_run_their_child(
    engine: fusee.Engine,
    worker_procs: Any,
    tmp_path: Path,
    texts: tuple[str, str],
    sent: list[str],
) -> None:
    """A server numbering its calls call_0 in both loops: with the same input the
    second call attached to the first child (its send lost), with another input
    RunExists failed the run."""
    await _worker(worker_procs, tmp_path)
    h = await engine.start("rfix-two-loops", f"tl-{texts[1]}", {"t1": texts[0], "t2": texts[1]})
    assert await h.result(timeout=60) == [f"sent {t}" for t in texts]
    assert _sent(tmp_path) == sent  # each loop's call sent


async def test_generations_same_call_id(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    await _worker(worker_procs, tmp_path)
    h = await engine.start("rfix-generations", "gen-1", {"text": "x"})
    out = await h.result(timeout=60)
    assert out == "sent x-1"
    assert _sent(tmp_path) == ["x-0", "x-1"]


async def test_streamed_turn_in_a_second_generation_asks_the_model(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    """Generation 1's "agent/turn-0" stream is generation 0's (same run, same name):
    the ended stream is taken as this generation's answer, the model not asked."""
    await _worker(worker_procs, tmp_path)
    h = await engine.start("rfix-stream-generations", "sg-1", {})
    assert await h.result(timeout=60) == "answer to question 1"
    # a reader of the run gets the current generation's stream
    text = [t async for t in engine.run("sg-1").stream("agent/turn-0")]
    assert "".join(text) == "answer to question 1"


async def test_an_approvals_ask_that_fails_is_the_calls_result(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    """ask(cb) fails for good: await_completion raises StepFailedError, _kept keeps it,
    _took hands it to approval_verdict, whose msgspec.json.encode(exception) raises."""
    await _worker(worker_procs, tmp_path)
    h = await engine.start("rfix-ask-fails", "af-1", {})
    out = await h.result(timeout=90)
    assert out.startswith("the approval could not be asked: "), out
    assert "chat is down" in out, out
    assert out.endswith("; the tool did not run"), out


async def test_a_workflow_tools_child_id_taken_by_another_run_is_the_calls_error(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    await _worker(worker_procs, tmp_path)
    h = await engine.start("rfix-taken-child", "tc-1", {})
    out = await h.result(timeout=60)
    assert out["is_error"] is True
    assert out["content"].startswith("tool 'notify' could not start its run: run 'tc-1/call_0-")
    assert "exists with another input" in out["content"]
    assert _sent(tmp_path) == ["someone else"]  # the call did not run


async def test_a_second_streamed_loop_of_a_name_is_refused_at_its_call(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    await _worker(worker_procs, tmp_path)
    h = await engine.start("rfix-two-streamed-loops", "ts-1", {})
    with pytest.raises(fusee.RunFailed) as e:
        await h.result(timeout=60)
    assert e.value.error_type == "fusee.InvalidArgument"
    assert "loop 'agent': stream=True" in e.value.message
