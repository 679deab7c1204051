"""A replayed ``generate`` does not ask the model again: a worker process is SIGKILLed
after ``classify`` (and its re-ask) were journaled, another worker replays the run, and
the scripted model's request file (written by every worker process) shows each request
sent once, by the first worker for the two journaled steps.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.runtime.records import StepCompleted, WaitStarted
from fusee.testing import ScriptedModel
from tests.workers import procs as worker_lib
from tests.workers.procs import wait_until

AGENT = Path(worker_lib.__file__).resolve().parent / "ai_ticket.py"


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
async def test_a_killed_worker_s_journaled_generate_is_not_asked_again(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path, stream: bool
) -> None:
    log = tmp_path / "requests.jsonl"
    workers = worker_procs()
    workers.module = AGENT
    first = await workers.start()
    run = await engine.start("ai_ticket", "ticket-1", {"log": str(log), "stream": stream})

    async def waiting() -> bool:
        return any(isinstance(r, WaitStarted) for _, r in await run.journal())

    await wait_until(waiting, timeout=15, what="classify journaled and the run waiting")
    first.kill()
    second = await workers.start()
    await run.signal("go")
    result = await run.result(timeout=15)

    assert result == {"category": "billing", "reply": "We are refunding you today.", "reasks": 1}
    names = [r.name for _, r in await run.journal() if isinstance(r, StepCompleted)]
    assert names == ["classify", "classify#reask-1", "draft-reply"]
    calls = ScriptedModel([], log=log).calls
    assert [c.index for c in calls] == [0, 1, 2], "each request sent once"
    assert [c.pid for c in calls] == [first.pid, first.pid, second.pid]
    assert all(c.stream == stream for c in calls)
    assert calls[1].request.messages[1].content == "It is about billing, I think."
    assert os.getpid() not in {c.pid for c in calls}


CRASH = Path(worker_lib.__file__).resolve().parent / "ai_stream_crash.py"


async def _died_after_end(
    engine: fusee.Engine,
    worker_procs: Any,
    tmp_path: Path,
    workflow: str,
    *,
    without_final: bool = False,
) -> tuple[Any, list[Any]]:
    """Run ``workflow`` on a worker that exits right after its first token stream's end
    marker is stored (before the step commits), then on a second worker."""
    workers = worker_procs()
    workers.module = CRASH
    env = {"AI_DIE_AFTER_END": str(tmp_path / "died")}
    if without_final:
        env["AI_END_WITHOUT_FINAL"] = "1"
    first = await workers.start(extra_env=env)
    log = tmp_path / "requests.jsonl"
    run = await engine.start(workflow, "r1", {"log": str(log), "again": without_final})

    async def dead() -> bool:
        return not first.alive

    await wait_until(dead, timeout=15, what="the first worker exited after the end marker")
    await workers.start()
    return await run.result(timeout=15), ScriptedModel([], log=log).calls


async def test_a_streamed_turn_s_tool_calls_survive_a_crash_after_the_end_marker(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    result, calls = await _died_after_end(engine, worker_procs, tmp_path, "ai_stream_loop")
    assert result == {"text": "the answer is: found x", "iterations": 2}
    assert len(calls) == 2, "the turn that asked for the tool was not asked again"


async def test_a_streamed_generate_s_usage_survives_a_crash_after_the_end_marker(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    result, calls = await _died_after_end(engine, worker_procs, tmp_path, "ai_stream_generate")
    assert len(calls) == 1
    assert result == {"text": "cut", "finish": "length", "out": 300}


async def test_an_end_marker_without_its_response_is_asked_again(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    """An end marker stored without the final response (by a worker of an earlier
    version) cannot make the turn's result: the turn is asked again."""
    result, calls = await _died_after_end(
        engine, worker_procs, tmp_path, "ai_stream_loop", without_final=True
    )
    assert result == {"text": "the answer is: found x", "iterations": 2}
    assert len(calls) == 3, "the turn whose response was lost was asked again"
