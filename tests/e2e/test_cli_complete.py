"""The whole ``fusee`` command set as a user (or a script) runs it: the CLI as a
subprocess, a real nats-server, a real worker process serving
``tests/workers/cli_complete.py``; ``--json`` output parsed back, exit codes checked
(docs/reference/cli.md, "Exit codes")."""

from __future__ import annotations

import inspect
import json
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from tests.helpers import cli_cmd, cli_env
from tests.workers.procs import HERE, Workers, wait_until

MODULE = HERE / "cli_complete.py"


@pytest.fixture(scope="module")
def served(nats_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ...]]:
    """A worker for the module's namespace; yields the CLI's connection options."""
    tmp = tmp_path_factory.mktemp("cli-complete")
    namespace = f"t{secrets.token_hex(4)}"
    workers = Workers(nats_server.url, namespace, tmp, module=MODULE)
    try:
        worker = workers.spawn()
        deadline = time.monotonic() + 20
        while not worker.find("worker.started"):
            assert worker.alive, worker.tail()
            assert time.monotonic() < deadline, worker.tail()
            time.sleep(0.05)
        yield ("--nats", nats_server.url, "--namespace", namespace)
    finally:
        workers.cleanup()


@pytest.fixture
async def engine(served: tuple[str, ...]) -> AsyncIterator[fusee.Engine]:
    async with await fusee.connect(served[1], namespace=served[3]) as e:
        yield e


def _id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


async def cli(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``fusee ARGS`` to its end; stdout and stderr as text."""
    with anyio.fail_after(30):
        done = await anyio.run_process(
            cli_cmd(*args),
            check=False,
            env={**cli_env(), **(env or {})},
            input=stdin.encode() if stdin is not None else None,
        )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def _error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """``--json``'s error object on stderr: ``{"code", "message"}``."""
    assert done.stdout == "", done.stdout
    error: dict[str, Any] = json.loads(done.stderr)["error"]
    return error


async def test_runs_start_result_journal_list_show_as_json(
    served: tuple[str, ...], tmp_path: Path
) -> None:
    run_id = _id("s")
    started = await cli(
        "runs", "start", "cc_echo", "--id", run_id, "--input", '"hi"', "--json", *served
    )
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout) == {"run_id": run_id, "workflow": "cc_echo"}
    again = await cli(
        "runs", "start", "cc_echo", "--id", run_id, "--input", '"hi"', "--json", *served
    )
    assert (again.returncode, json.loads(again.stdout)) == (0, json.loads(started.stdout))
    other = await cli(
        "runs", "start", "cc_echo", "--id", run_id, "--input", '"ho"', "--json", *served
    )
    assert other.returncode == 1
    assert _error(other)["code"] == "run_exists"

    result = await cli("runs", "result", run_id, "--json", *served)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"run_id": run_id, "result": "HI"}
    plain = await cli("runs", "result", run_id, *served)
    assert json.loads(plain.stdout) == "HI"

    (tmp_path / "input.json").write_text('"from a file"')
    waited = await cli(
        "runs", "start", "cc_echo", "--input", f"@{tmp_path / 'input.json'}", "--wait", "--json",
        *served,
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    out = json.loads(waited.stdout)
    assert out["result"] == "FROM A FILE"
    assert out["run_id"].startswith("cc_echo-")  # an ID made up for it
    piped = await cli("runs", "start", "cc_echo", "--input", "@-", "--wait", *served, stdin='"x"')
    assert (piped.returncode, json.loads(piped.stdout)) == (0, "X")

    page = await cli("runs", "journal", run_id, "--limit", "2", "--json", *served)
    assert page.returncode == 0, page.stderr
    first = json.loads(page.stdout)
    assert [r["record"]["kind"] for r in first["records"]] == ["run.started", "step.completed"]
    assert first["next"] == first["records"][-1]["seq"]
    rest = json.loads(
        (
            await cli("runs", "journal", run_id, "--after", str(first["next"]), "--json", *served)
        ).stdout
    )
    assert [r["record"]["kind"] for r in rest["records"]] == ["run.completed"]
    assert rest["next"] is None
    text = await cli("runs", "journal", run_id, *served)
    assert [line.split()[1] for line in text.stdout.splitlines()] == [
        "run.started",
        "step.completed",
        "run.completed",
    ]

    listed = await cli("runs", "list", "--workflow", "cc_echo", "--json", *served)
    assert run_id in [r["run_id"] for r in json.loads(listed.stdout)]
    shown = json.loads((await cli("runs", "show", run_id, "--json", *served)).stdout)
    assert shown["run"]["status"] == "completed"


async def test_exit_codes(served: tuple[str, ...], engine: fusee.Engine) -> None:
    failing = _id("f")
    await engine.start("cc_fail", failing, None)
    waiting = await engine.start("cc_wait", _id("w"), None)
    for args in (
        ("runs", "show", "no-such-run"),
        ("runs", "result", "no-such-run"),
        ("runs", "journal", "no-such-run"),
        ("streams", "follow", "no-such-run", "model-0"),
    ):
        done = await cli(*args, *served)
        assert done.returncode == 3, (args, done.stderr)  # not found
        assert done.stderr.startswith("error: no run 'no-such-run'"), done.stderr
    assert (
        _error(await cli("runs", "show", "no-such-run", "--json", *served))["code"] == "not_found"
    )
    bad_input: list[tuple[str, ...]] = [
        ("runs", "show", "bad\tid"),
        ("runs", "start", "cc_echo", "--input", "{nope"),
        ("runs", "start", "cc_echo", "--input", "@/no/such/file"),
        ("runs", "start", "cc_echo", "--timeout", "soon"),
        ("runs", "signal", waiting.run_id, "go", "{nope"),
        ("runs", "journal", "x", "--limit", "0"),
    ]
    for bad in bad_input:
        done = await cli(*bad, *served)
        assert done.returncode == 2, (bad, done.stderr)  # bad input, nothing sent
        assert done.stderr.startswith("error: "), (bad, done.stderr)
    usage = await cli("runs", "show", "--no-such-flag", *served)
    assert usage.returncode == 2
    assert "No such option" in usage.stderr

    failed = await cli("runs", "result", failing, "--timeout", "15s", *served)
    assert failed.returncode == 1
    assert f"run '{failing}' failed: ValueError: no good" in failed.stderr
    error = _error(await cli("runs", "result", failing, "--json", *served))
    assert error["code"] == "run_failed"

    late = await cli("runs", "result", waiting.run_id, "--timeout", "200ms", "--json", *served)
    assert late.returncode == 4  # not yet: the run goes on
    assert _error(late)["code"] == "not_yet"
    assert (await waiting.describe()).status in ("running", "waiting")


async def test_signal_cancel_and_resume_as_json(
    served: tuple[str, ...], engine: fusee.Engine, tmp_path: Path
) -> None:
    waiting = await engine.start("cc_wait", _id("w"), None)
    sent = await cli("runs", "signal", waiting.run_id, "go", '{"ok": true}', "--json", *served)
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout) == {"run_id": waiting.run_id, "action": "signal", "signal": "go"}
    assert await waiting.result(timeout="15s") == {"ok": True}
    ended = await cli("runs", "signal", waiting.run_id, "go", "--json", *served)
    assert ended.returncode == 1
    assert _error(ended)["code"] == "ended"

    stuck = await engine.start("cc_wait", _id("c"), None)
    cancel = await cli("runs", "cancel", stuck.run_id, "--reason", "no", "--json", *served)
    assert json.loads(cancel.stdout) == {"run_id": stuck.run_id, "action": "cancel", "reason": "no"}
    with pytest.raises(fusee.RunCancelled):
        await stuck.result(timeout="15s")

    flag = tmp_path / "fixed"
    paused = await engine.start("cc_pause", _id("p"), {"flag": str(flag)})

    async def is_paused() -> bool:
        return (await paused.describe()).status == "paused"

    await wait_until(is_paused, timeout=20, what="paused")
    no_result = await cli("runs", "result", paused.run_id, *served)
    assert no_result.returncode == 4
    assert "is paused" in no_result.stderr
    flag.touch()
    resumed = await cli("runs", "resume", paused.run_id, "--json", *served)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {
        "run_id": paused.run_id,
        "action": "resume",
        "force": False,
    }
    assert await paused.result(timeout="15s") == "answered"
    again = await cli("runs", "resume", paused.run_id, "--json", *served)
    assert again.returncode == 1
    assert _error(again)["code"] == "not_paused"


async def test_runs_show_watch_prints_a_token_as_it_arrives_then_exits_at_the_end(
    served: tuple[str, ...], engine: fusee.Engine, tmp_path: Path
) -> None:
    flag = tmp_path / "go-on"
    run = await engine.start("cc_talk", _id("t"), {"flag": str(flag)})
    out_path, err_path = tmp_path / "watch.out", tmp_path / "watch.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            cli_cmd("runs", "show", run.run_id, "--watch", "--stream", "model-0", *served),
            stdout=out,
            stderr=err,
            env=cli_env(),
        )
        try:

            async def saw_hello() -> bool:
                assert proc.poll() is None, out_path.read_text()
                return "hello " in out_path.read_text()

            # the first token is shown while the run still waits for the test's flag
            await wait_until(saw_hello, timeout=20, what="the first token in the watch")
            assert "world" not in out_path.read_text()
            assert proc.poll() is None
            flag.touch()
            code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=20))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = out_path.read_text()
    assert code == 0, (text, err_path.read_text())
    assert "-- stream model-0:\nhello world\n" in text
    assert "run.completed" in text
    assert text.splitlines()[-1].startswith("status    completed")


async def test_runs_show_watch_as_json_lines_and_streams_follow_json(
    served: tuple[str, ...], engine: fusee.Engine, tmp_path: Path
) -> None:
    flag = tmp_path / "go-on"
    flag.touch()  # no window: the run goes straight through
    run = await engine.start("cc_talk", _id("j"), {"flag": str(flag)})
    watched = await cli(
        "runs", "show", run.run_id, "--watch", "--stream", "model-0", "--json", *served
    )
    assert watched.returncode == 0, watched.stderr
    events = [json.loads(line) for line in watched.stdout.splitlines()]
    tokens = "".join(e["text"] for e in events if e["event"] == "token" and e["kind"] == "token")
    assert tokens == "hello world"
    assert events[-1]["event"] == "end"
    assert events[-1]["run"]["status"] == "completed"
    assert "run.completed" in [e["record"]["kind"] for e in events if e["event"] == "record"]

    follow = await cli("streams", "follow", run.run_id, "model-0", "--json", *served)
    assert follow.returncode == 0, follow.stderr
    kinds = [(e["kind"], e["text"]) for e in map(json.loads, follow.stdout.splitlines())]
    assert ("token", "hello ") in kinds
    assert kinds[-1][0] == "end"


async def test_limits_and_objects_take_json(served: tuple[str, ...]) -> None:
    name = f"lim_{secrets.token_hex(2)}"
    set_ = await cli("limits", "set", name, "--per-second", "5", "--json", *served)
    assert set_.returncode == 0, set_.stderr
    assert json.loads(set_.stdout)["per_second"] == 5
    table = await cli("limits", "ls", *served)
    header = table.stdout.splitlines()[0].split()
    assert header[:2] == ["LIMIT", "PER"]


async def test_the_connection_comes_from_the_environment_or_before_the_command(
    served: tuple[str, ...], engine: fusee.Engine
) -> None:
    run = await engine.start("cc_echo", _id("e"), "env")
    assert await run.result(timeout="15s") == "ENV"
    url, namespace = served[1], served[3]
    env = {"FUSEE_NATS_URL": url, "FUSEE_NAMESPACE": namespace}
    from_env = await cli("runs", "result", run.run_id, env=env)
    assert (from_env.returncode, json.loads(from_env.stdout)) == (0, "ENV"), from_env.stderr
    before = await cli(
        "--nats", url, "--namespace", namespace, "--json", "runs", "result", run.run_id
    )
    assert json.loads(before.stdout) == {"run_id": run.run_id, "result": "ENV"}
    # the command's own --namespace wins over the environment's
    elsewhere = await cli("runs", "show", run.run_id, "--namespace", "nowhere", env=env)
    assert elsewhere.returncode == 3


@pytest.mark.skipif(
    "user" not in inspect.signature(fusee.connect).parameters,
    reason="fusee.connect() takes NATS credentials once issue 15's natsauth work lands",
)
async def test_a_comma_separated_url_list_reaches_the_server(served: tuple[str, ...]) -> None:
    urls = f"nats://127.0.0.1:1,{served[1]}"  # the first never answers
    done = await cli("runs", "list", "--nats", urls, "--namespace", served[3], "--json")
    assert done.returncode == 0, done.stderr


def test_shell_completion_completes_commands() -> None:
    env = {
        **cli_env(),
        "_FUSEE_COMPLETE": "complete_bash",
        "COMP_WORDS": "fusee runs st",
        "COMP_CWORD": "2",
    }
    done = subprocess.run(
        [sys.executable, "-m", "fusee"],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == {"start"}
    script = subprocess.run(
        [sys.executable, "-m", "fusee", "--show-completion", "bash"],
        env={**cli_env(), "SHELL": "/bin/bash"},
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert script.returncode == 0, script.stderr
    assert "_FUSEE_COMPLETE" in script.stdout
