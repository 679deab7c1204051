"""What a worker logs about a run: one line per thing that happened, never one per replay.

Workers run in their own processes (``tests/workers/launch.py``, JSON log lines on
stderr) on the ``chain`` workflow of ``tests/workers/chain.py``. Each test runs twice:
with the worker in the mode ``$FUSEE_ALWAYS_REPLAY`` gives the suite, and with
``FUSEE_ALWAYS_REPLAY=1`` set for the worker (the run is evicted and replayed from its
journal after every step, which must not show in the logs).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fusee
from tests.workers.procs import (
    CHAIN,
    WorkerProc,
    chain_input,
    chain_result,
    execution_lines,
    wait_until,
)

STEPS = ("s1", "s2", "s3", "s4")
STEP_FIELDS = ("run_id", "step", "attempt", "duration_ms")

MODES = [
    pytest.param(None, id="env-mode"),
    pytest.param({"FUSEE_ALWAYS_REPLAY": "1"}, id="always-replay"),
]


def of_run(events: list[dict[str, Any]], run_id: str, event: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == event and e.get("run_id") == run_id]


def completed_steps(events: list[dict[str, Any]], run_id: str) -> list[str]:
    """The ``step`` of each ``step.completed`` line of ``run_id``, in log order."""
    return [e["step"] for e in of_run(events, run_id, "step.completed")]


def assert_step_line(line: dict[str, Any], run_id: str, *, min_ms: float) -> None:
    missing = [k for k in STEP_FIELDS if k not in line]
    assert missing == [], f"{line} lacks {missing}"
    assert line["run_id"] == run_id
    assert line["step"] in STEPS
    assert line["attempt"] == 1
    assert isinstance(line["duration_ms"], int | float)
    # each step sleeps ``delay`` seconds: the duration is the step's, not a replay's 0
    assert line["duration_ms"] >= min_ms, line


@pytest.mark.parametrize("extra_env", MODES)
async def test_each_step_is_logged_once(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path, extra_env: dict[str, str] | None
) -> None:
    worker = await worker_procs().start(extra_env=extra_env)
    arg = chain_input(tmp_path / "effects.log", steps=len(STEPS), delay=0.05, tag="logs")
    run = await engine.start("chain", "r-logs", arg)
    assert await run.result(timeout=20) == chain_result(arg)
    await worker.wait_for("run.completed", run_id="r-logs")

    events = worker.events()
    assert completed_steps(events, "r-logs") == list(STEPS)
    for line in of_run(events, "r-logs", "step.completed"):
        assert_step_line(line, "r-logs", min_ms=45)
    assert len(of_run(events, "r-logs", "run.completed")) == 1
    assert len(of_run(events, "r-logs", "run.started")) == 1
    assert of_run(events, "r-logs", "run.resumed") == []  # evictions are not resumptions
    started = collections.Counter(e["step"] for e in of_run(events, "r-logs", "step.started"))
    assert started == dict.fromkeys(STEPS, 1)


@pytest.mark.parametrize("extra_env", MODES)
async def test_a_resumed_run_does_not_log_its_past_again(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path, extra_env: dict[str, str] | None
) -> None:
    procs = worker_procs()
    first = await procs.start(extra_env=extra_env)
    effects = tmp_path / "effects.log"
    release = tmp_path / "release-s3"  # step 3 cannot end before this file exists
    arg = chain_input(effects, steps=len(STEPS), delay=0.4, tag="crash")
    arg["hold"] = {"step": "s3", "until": str(release)}
    run = await engine.start("chain", "r-crash", arg)

    def in_step_3() -> bool:  # its body began (it wrote its line), held open
        return "s3" in [name for name, _, _ in execution_lines(effects)]

    await wait_until(in_step_3, timeout=10, what="step 3 to begin")
    # s2's line before the kill (an info line is written up to two loop turns later)
    await first.wait_for("step.completed", run_id="r-crash", step="s2", timeout=10)
    first.kill()  # SIGKILL in the middle of step 3
    release.touch()

    before = first.events()
    assert completed_steps(before, "r-crash") == ["s1", "s2"]
    assert of_run(before, "r-crash", "run.completed") == []

    second = await procs.start(extra_env=extra_env)
    assert await run.result(timeout=20) == chain_result(arg)
    await second.wait_for("run.completed", run_id="r-crash")

    after = second.events()
    resumed = of_run(after, "r-crash", "run.resumed")
    assert len(resumed) == 1, resumed
    assert resumed[0]["steps"] == 2  # what the journal held: s1 and s2
    assert of_run(after, "r-crash", "run.started") == []
    # replaying s1 and s2 logs nothing: they neither start nor complete again
    assert completed_steps(after, "r-crash") == ["s3", "s4"]
    assert [e["step"] for e in of_run(after, "r-crash", "step.started")] == ["s3", "s4"]
    for line in of_run(after, "r-crash", "step.completed"):
        assert_step_line(line, "r-crash", min_ms=350)
    assert len(of_run(after, "r-crash", "run.completed")) == 1

    # across both workers, each step completed (and was logged so) exactly once
    assert sorted(completed_steps(before + after, "r-crash")) == list(STEPS)
    # s3 ran on both workers (the kill cut the first execution short), the rest once
    ran = collections.Counter(name for name, _, _ in execution_lines(effects))
    assert ran == {"s1": 1, "s2": 1, "s3": 2, "s4": 1}


def _cli_env() -> dict[str, str]:
    # the test says where NATS is; nothing from the developer's shell may point elsewhere
    return {k: v for k, v in os.environ.items() if k not in ("FUSEE_NATS_URL", "FUSEE_STORE")}


async def test_cli_worker_logs_json_lines(
    nats_server: Any, namespace: str, engine: fusee.Engine, tmp_path: Path
) -> None:
    log_path = tmp_path / "cli-worker.log"
    cmd = [
        sys.executable,
        "-m",
        "fusee",
        "worker",
        str(CHAIN),
        "--nats",
        nats_server.url,
        "--namespace",
        namespace,
        "--log-format",
        "json",
    ]
    with log_path.open("ab") as err:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=_cli_env(),
            cwd=tmp_path,
        )
    worker = WorkerProc("cli", proc, log_path)
    try:
        await worker.wait_for("worker.started", timeout=20)
        arg = chain_input(tmp_path / "effects.log", steps=len(STEPS), delay=0.05, tag="cli")
        run = await engine.start("chain", "r-cli", arg)
        assert await run.result(timeout=20) == chain_result(arg)
        await worker.wait_for("run.completed", run_id="r-cli")
        assert worker.stop() == 0  # SIGTERM: drains, says worker.stopped, exits 0
    finally:
        worker.kill()

    lines = [ln for ln in log_path.read_text().splitlines() if ln.strip()]
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
    assert all(isinstance(e, dict) for e in events)
    assert all({"event", "level", "timestamp"} <= e.keys() for e in events), events

    assert completed_steps(events, "r-cli") == list(STEPS)
    for event in of_run(events, "r-cli", "step.completed"):
        assert_step_line(event, "r-cli", min_ms=45)
        assert event["level"] == "info"
        assert "worker" in event
    assert len(of_run(events, "r-cli", "run.completed")) == 1
    assert [e["event"] for e in events if e["event"].startswith("worker.")][-1] == "worker.stopped"
    # the CLI's default level is info: debug lines (step.started) stay out
    assert not [e for e in events if e["level"] == "debug"]
