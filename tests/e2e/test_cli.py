"""The ``fusee`` command line, run as a user runs it: real processes, a real nats-server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import fusee
from fusee.adapters.jetstream.server import running_server
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.helpers import cli_cmd as _cmd
from tests.helpers import cli_env as _env
from tests.helpers import run_cli as cli

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "agent.py"
REFUND = REPO / "examples" / "refund.py"

WORKFLOWS = textwrap.dedent(
    """
    import fusee

    @fusee.workflow("cli-echo")
    async def echo(ctx, text: str) -> dict:
        upper = await ctx.step("upper", lambda: text.upper())
        return {"echo": upper}

    def _boom(text):
        raise ValueError(f"no good: {text}")

    @fusee.workflow("cli-approve")
    async def approve(ctx, text: str) -> dict:
        decision = await ctx.wait_for("decision")
        return {"text": text, "decision": decision}

    @fusee.workflow("cli-fail")
    async def fail(ctx, text: str) -> str:
        await ctx.step("boom", lambda: _boom(text), retry=fusee.Retry(attempts=1))
        return "unreachable"
    """
)


@dataclass
class Background:
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait_for(self, text: str, timeout: float = 15.0) -> None:
        with anyio.fail_after(timeout):
            while text not in self.text():
                assert self.proc.poll() is None, (
                    f"exited with {self.proc.returncode}:\n{self.text()}"
                )
                await anyio.sleep(0.05)

    async def stop(self, sig: signal.Signals, timeout: float = 10.0) -> int:
        self.proc.send_signal(sig)
        return await anyio.to_thread.run_sync(lambda: self.proc.wait(timeout=timeout))


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Any]:
    """Start ``fusee ARGS`` in the background, its output in a file; killed at the end."""
    started: list[tuple[Background, Any]] = []

    def start(*args: str) -> Background:
        log_path = tmp_path / f"background-{len(started)}.log"
        log = log_path.open("wb")
        proc = subprocess.Popen(
            _cmd(*args), stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=tmp_path
        )
        bg = Background(proc, log_path)
        started.append((bg, log))
        return bg

    yield start
    for bg, log in started:
        if bg.proc.poll() is None:
            bg.proc.kill()
        bg.proc.wait()
        log.close()


@pytest.fixture
def workflows(tmp_path: Path) -> Path:
    path = tmp_path / "cli_workflows.py"
    path.write_text(WORKFLOWS)
    return path


async def test_worker_serves_and_runs_commands_inspect(
    nats_server: Any, namespace: str, workflows: Path, launch: Any
) -> None:
    url = nats_server.url
    conn = ("--nats", url, "--namespace", namespace)
    worker = launch("worker", str(workflows), *conn)
    async with await fusee.connect(url, namespace=namespace) as engine:
        echo = await engine.start("cli-echo", "echo-1", "hello")
        failing = await engine.start("cli-fail", "fail-1", "x")
        waiting = await engine.start("cli-nobody", "pending-1", None)  # no worker has it
        assert await echo.result(timeout="15s") == {"echo": "HELLO"}
        with pytest.raises(fusee.RunFailed):
            await failing.result(timeout="15s")
    assert waiting.run_id == "pending-1"

    listed = await cli("runs", "list", "--json", *conn)
    assert listed.returncode == 0, listed.stderr
    statuses = {r["run_id"]: r["status"] for r in json.loads(listed.stdout)}
    assert statuses["echo-1"] == "completed"
    assert statuses["fail-1"] == "failed"
    assert statuses["pending-1"] in ("pending", "running")

    table = await cli("runs", "list", *conn)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:5] == ["RUN", "ID", "WORKFLOW", "STATUS", "STEPS"]
    fail_row = next(line for line in lines if line.startswith("fail-1 "))
    assert "failed" in fail_row
    assert "ValueError: no good: x" in fail_row

    only_failed = await cli("runs", "list", "--status", "failed", "--json", *conn)
    assert [r["run_id"] for r in json.loads(only_failed.stdout)] == ["fail-1"]

    show = await cli("runs", "show", "echo-1", *conn)
    assert show.returncode == 0, show.stderr
    assert "status    completed after 1 step" in show.stdout
    step_line = next(line for line in show.stdout.splitlines() if "step.completed" in line)
    assert "upper" in step_line
    assert "(attempt 1," in step_line
    assert '-> "HELLO"' in step_line
    assert '-> {"echo":"HELLO"}' in show.stdout  # run.completed

    show_failed = await cli("runs", "show", "fail-1", *conn)
    assert show_failed.returncode == 0, show_failed.stderr
    assert "error     ValueError: no good: x  (in step boom)" in show_failed.stdout
    assert "step.failed" in show_failed.stdout

    as_json = await cli("runs", "show", "echo-1", "--json", *conn)
    shown = json.loads(as_json.stdout)
    assert shown["run"]["status"] == "completed"
    assert [e["record"]["kind"] for e in shown["journal"]] == [
        "run.started",
        "step.completed",
        "run.completed",
    ]

    result = await cli("runs", "result", "echo-1", *conn)
    assert (result.returncode, json.loads(result.stdout)) == (0, {"echo": "HELLO"})

    failed = await cli("runs", "result", "fail-1", *conn)
    assert failed.returncode == 1
    assert failed.stdout == ""
    assert "run 'fail-1' failed: ValueError: no good: x" in failed.stderr

    timed_out = await cli("runs", "result", "pending-1", "--timeout", "300ms", *conn)
    assert timed_out.returncode == 4  # not yet
    assert "did not end within 300ms" in timed_out.stderr

    for args in (("show", "no-such-run"), ("result", "no-such-run")):
        unknown = await cli("runs", *args, *conn)
        assert unknown.returncode == 3  # not found
        assert unknown.stderr.strip() == f"error: no run 'no-such-run' in namespace '{namespace}'"

    bad = await cli("runs", "show", "bad\tid", *conn)
    assert bad.returncode == 2  # bad input
    assert bad.stderr.startswith("error: invalid run ID")
    assert "Traceback" not in bad.stderr

    assert await worker.stop(signal.SIGTERM) == 0
    assert '"worker.stopped"' in worker.text()


async def test_worker_stops_gracefully_on_sigterm(
    nats_server: Any, namespace: str, workflows: Path, launch: Any
) -> None:
    worker = launch("worker", str(workflows), "--nats", nats_server.url, "--namespace", namespace)
    await worker.wait_for('"worker.started"')
    with anyio.fail_after(10):  # the whole graceful stop, releasing 16 partitions
        assert await worker.stop(signal.SIGTERM) == 0
    assert '"worker.stopped"' in worker.text()
    # The partitions it handed over serve runs again with the next worker.
    async with await fusee.connect(nats_server.url, namespace=namespace) as engine:
        again = launch(
            "worker", str(workflows), "--nats", nats_server.url, "--namespace", namespace
        )
        run = await engine.start("cli-echo", "after-stop", "ok")
        assert await run.result(timeout="15s") == {"echo": "OK"}
        assert await again.stop(signal.SIGINT) == 0


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "error: no such file: "),
        ("def broken(:\n", "error: cannot import {path}: SyntaxError: "),
        (
            "import fusee\nraise RuntimeError('config missing')\n",
            "error: cannot import {path}: RuntimeError: config missing (at ",
        ),
    ],
    ids=["missing", "syntax-error", "raises"],
)
async def test_bad_file_is_one_clear_line(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "user_file.py"
    if content is not None:
        path.write_text(content)
    for command in ("worker", "dev"):
        done = await cli(command, str(path), "--nats", "nats://127.0.0.1:1")
        assert done.returncode == 1
        assert done.stderr.startswith(expected.format(path=path)), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def offline_env() -> dict[str, str]:
    """The CLI's environment with no OpenAI settings: the demo's model is scripted."""
    return {k: v for k, v in _env().items() if not k.startswith("OPENAI_")}


DEMO_JOURNAL = [  # the demo's journal: (kind, name) per line, in journal order
    ("run.started", "support"),
    ("step.completed", "agent/turn-0"),
    ("wait.started", "child '{run}/call_order'"),
    ("step.completed", "agent/tool-0-search_kb"),
    ("wait.done", "child '{run}/call_order'"),
    ("step.completed", "agent/turn-1"),
    ("wait.started", "completion 'agent/approve-1-refund'"),
    ("step.completed", "ask/agent/approve-1-refund"),
    ("wait.done", "completion 'agent/approve-1-refund'"),
    ("step.completed", "agent/tool-1-refund"),
    ("step.completed", "agent/turn-2"),
    ("run.completed", ""),
]


def journal_lines(stdout: str, title: str) -> list[tuple[str, str]]:
    """The ``(kind, name)`` of each journal line printed under the line starting ``title``."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title)) + 1
    out = []
    for line in lines[start:]:
        if not line.startswith("  #"):
            break
        kind, _, rest = line.split(maxsplit=1)[1].partition(" ")
        rest = rest.strip()
        name = rest.split("  ")[0] if kind.startswith("wait") else rest.split(" ")[0]
        out.append((kind, "" if rest.startswith("->") else name))
    return out


def demo_output(done: subprocess.CompletedProcess[str], model: str, order_call: str) -> str:
    """The demo's ``runs show`` hint, once its output was checked: it exited 0, named
    ``model``, had a refund approved, and printed the run's journal with the child
    ``<run id>/<order_call>``."""
    assert done.returncode == 0, done.stderr
    assert f"model: {model}" in done.stdout
    assert "approval asked: refund " in done.stdout
    hint = next(line for line in done.stdout.splitlines() if " runs show " in line)
    run_id = hint.split(" runs show ")[1].split()[0]
    # the child is <run id>/<call id>-<16 hex: the step name and generation, hashed>
    child = re.compile(rf"child '{re.escape(run_id)}/{re.escape(order_call)}-[0-9a-f]{{16}}'")
    lines = journal_lines(done.stdout, "Journal of run ")
    assert [(kind, "the child" if child.fullmatch(name) else name) for kind, name in lines] == [
        (kind, "the child" if "call_order" in name else name.format(run=run_id))
        for kind, name in DEMO_JOURNAL
    ]
    return hint


async def test_dev_runs_the_demo_on_its_own_embedded_server(tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = await cli("dev", str(DEMO), "--store", str(store), env=offline_env())
    hint = demo_output(done, "scripted", "call_order")
    assert "A: Sorry your parcel arrived damaged. Order 1042 is refunded in full" in done.stdout
    # the workflow tool's child run: the order service's first answer lost, retried
    assert journal_lines(done.stdout, "Journal of the workflow tool's run ") == [
        ("run.started", "orders-lookup"),
        ("step.retrying", "fetch"),
        ("step.completed", "fetch"),
        ("run.completed", ""),
    ]
    assert running_server(store) is None  # dev stopped the server it started
    # no HTTP API served: no admin token made (nothing would ask for it)
    assert "API token" not in done.stdout

    # the hint works as printed, in a shell where `fusee` is not on PATH
    env = {**_env(), "PATH": "/usr/bin:/bin"}
    with anyio.fail_after(30):
        show = await anyio.run_process(["sh", "-c", hint.strip()], check=False, env=env)
    assert show.returncode == 0, show.stderr.decode()
    assert "status    completed after 6 steps" in show.stdout.decode()
    assert running_server(store) is None


async def test_the_demo_asks_a_real_openai_client_when_a_key_is_set(tmp_path: Path) -> None:
    replies: list[Reply | str] = [
        Reply(
            tool_calls=[
                ("call_k", "search_kb", '{"query": "damaged"}'),
                ("call_o", "lookup_order", '{"order": "1042"}'),
            ]
        ),
        Reply(tool_calls=[("call_r", "refund", '{"order": "1042", "amount_eur": 40}')]),
        "Refunded: 40 EUR are on their way back to you.",
    ]
    with FakeOpenAI(replies=replies, delay=0) as fake:
        env = {
            **offline_env(),
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": fake.base_url,
            "OPENAI_MODEL": "gpt-test",
        }
        done = await cli("dev", str(DEMO), "--store", str(tmp_path / "store"), env=env)
        sent = [r.body for r in fake.snapshot()]
    demo_output(done, "gpt-test", "call_o")
    assert "A: Refunded: 40 EUR are on their way back to you." in done.stdout
    # what the provider saw: three requests of the model named, the tools' schemas,
    # and each tool's result sent back under its call's ID
    assert [b["model"] for b in sent] == ["gpt-test"] * 3
    assert [t["function"]["name"] for t in sent[0]["tools"]] == [
        "search_kb",
        "lookup_order",
        "refund",
    ]
    assert sent[0]["messages"][0]["role"] == "system"
    results = {m["tool_call_id"]: m["content"] for m in sent[2]["messages"] if m["role"] == "tool"}
    assert results["call_k"].startswith("A parcel that arrived damaged is refunded in full")
    assert '"status":"delivered"' in results["call_o"]
    assert results["call_r"] == "refunded 40 EUR on order 1042"


async def test_the_refund_example_waits_for_approval_then_refunds(tmp_path: Path) -> None:
    done = await cli("dev", str(REFUND), "--store", str(tmp_path / "store"))
    assert done.returncode == 0, done.stderr
    assert "status while it waits: waiting" in done.stdout
    assert "approved by ana -> refunded 40 EUR on order 1042" in done.stdout
    assert "wait.done       signal 'approval'" in done.stdout


async def test_dev_without_main_serves_until_ctrl_c(tmp_path: Path, launch: Any) -> None:
    path = tmp_path / "only_workflows.py"
    path.write_text(WORKFLOWS)
    store = tmp_path / "store"
    dev = launch("dev", str(path), "--store", str(store))
    await dev.wait_for('"dev.serving"')
    found = running_server(store)
    assert found is not None
    async with await fusee.connect(found.url, namespace="fusee") as engine:
        run = await engine.start("cli-echo", "served", "dev")
        assert await run.result(timeout="15s") == {"echo": "DEV"}
    assert await dev.stop(signal.SIGINT) == 0
    assert running_server(store) is None


async def test_runs_signal_and_cancel_from_the_command_line(
    nats_server: Any, namespace: str, workflows: Path, launch: Any
) -> None:
    conn = ("--nats", nats_server.url, "--namespace", namespace)
    launch("worker", str(workflows), *conn)
    async with await fusee.connect(nats_server.url, namespace=namespace) as engine:
        approved = await engine.start("cli-approve", "ok-1", "refund")
        sent = await cli("runs", "signal", "ok-1", "decision", '{"approved": true}', *conn)
        assert sent.returncode == 0, sent.stderr
        assert await approved.result(timeout="15s") == {
            "text": "refund",
            "decision": {"approved": True},
        }
        again = await cli("runs", "signal", "ok-1", "decision", "1", *conn)
        assert again.returncode == 1
        assert "already ended" in again.stderr

        stuck = await engine.start("cli-approve", "stuck-1", "refund")
        stopped = await cli("runs", "cancel", "stuck-1", "--reason", "user left", *conn)
        assert stopped.returncode == 0, stopped.stderr
        with pytest.raises(fusee.RunCancelled, match="user left"):
            await stuck.result(timeout="15s")

    bad = await cli("runs", "signal", "ok-1", "decision", "{not json", *conn)
    assert bad.returncode == 2
    assert "not JSON" in bad.stderr
    unknown = await cli("runs", "cancel", "nope", *conn)
    assert unknown.returncode == 3
    assert "no run 'nope'" in unknown.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_a_stopped_command_stops_the_server_it_started(
    tmp_path: Path, launch: Any, sig: signal.Signals
) -> None:
    store = tmp_path / "store"
    # waits for a call no worker serves, on the embedded server it starts itself
    waiting = launch(
        "objects", "call", "counter", "k", "add", "--timeout", "5m", "--store", str(store)
    )
    with anyio.fail_after(20):
        while (found := running_server(store)) is None:
            assert waiting.proc.poll() is None, waiting.text()
            await anyio.sleep(0.05)
    code = await waiting.stop(sig)
    assert code == 128 + sig, waiting.text()
    assert running_server(store) is None  # its server is gone with it
    with pytest.raises(ProcessLookupError):
        os.kill(found.pid, 0)


CHAT_ONLY = """
import anyio
import fusee


async def say(ctx, text: str) -> str:
    async def think() -> str:
        await anyio.sleep(0.3)  # the turn takes a while: main does not wait for it
        return "echo: " + text

    reply = await ctx.step("think", think)
    ctx.state.set("last", reply)
    return reply


chats = fusee.object("dev_chat", {"say": say})


async def main(engine):
    print("queued", await chats.key("u1", engine=engine).send("say", "hi"))
"""


async def test_dev_with_objects_only_finishes_what_main_sent(tmp_path: Path) -> None:
    path = tmp_path / "chat.py"
    path.write_text(CHAT_ONLY)
    store = tmp_path / "store"
    done = await cli("dev", str(path), "--store", str(store))
    assert done.returncode == 0, done.stderr
    assert "queued" in done.stdout
    assert "no_workflows" not in done.stderr
    assert "nothing_to_serve" not in done.stderr
    async with await fusee.connect(store_dir=store) as engine:
        assert await engine.object("dev_chat", "u1").state() == {"last": "echo: hi"}


@pytest.mark.parametrize(
    "args",
    [
        ("runs", "cancel", "@counter/victim"),
        ("runs", "signal", "@counter/victim", "go"),
        ("runs", "show", "@counter/victim"),
    ],
)
async def test_run_commands_refuse_object_ids(nats_server: Any, namespace: str, args: Any) -> None:
    done = await cli(*args, "--nats", nats_server.url, "--namespace", namespace)
    assert done.returncode != 0
    assert "reserved for objects" in done.stderr
    assert "Traceback" not in done.stderr
