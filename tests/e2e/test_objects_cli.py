"""``fusee objects ...`` as a user runs it: the CLI as a subprocess, a real nats-server,
and a real worker process serving the object types of ``tests/workers/objects.py``.

One worker serves the whole module (each test uses its own keys). ``$EDITOR`` is a
small script each test writes, which rewrites the file it is given.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from tests.helpers import cli_cmd, cli_env
from tests.workers.procs import HERE, Workers

OBJECTS = HERE / "objects.py"


@pytest.fixture(scope="module")
def served(nats_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ...]]:
    """A worker for the module's namespace; yields the CLI's connection options."""
    tmp = tmp_path_factory.mktemp("objects-cli")
    namespace = f"t{secrets.token_hex(4)}"
    workers = Workers(nats_server.url, namespace, tmp, module=OBJECTS)
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


def _key(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


async def cli(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``fusee ARGS`` to its end; stdout and stderr as text."""
    environ = {k: v for k, v in cli_env().items() if k not in ("EDITOR", "VISUAL")}
    with anyio.fail_after(30):
        done = await anyio.run_process(
            cli_cmd(*args),
            check=False,
            env={**environ, **(env or {})},
            input=stdin.encode() if stdin is not None else None,
        )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def editor(tmp_path: Path, body: str) -> dict[str, str]:
    """``$EDITOR``: a script that runs ``body`` with ``path`` (the file to edit) and
    ``state`` (its JSON, parsed) defined, then exits."""
    script = tmp_path / f"editor-{secrets.token_hex(2)}.py"
    script.write_text(
        "import json, sys\n"
        "path = sys.argv[1]\n"
        "state = json.load(open(path))\n" + textwrap.dedent(body)
    )
    return {"EDITOR": f"{sys.executable} {script}"}


async def wait_running(engine: fusee.Engine, key: str, seq: int) -> fusee.ObjectInfo:
    """Until ``show`` lists invocation ``seq`` as running (once it journaled a wait)."""
    with anyio.fail_after(15):
        while True:
            info = await engine.object("counter", key).show()
            if info.running is not None and info.running.seq == seq:
                return info
            await anyio.sleep(0.05)


# -- reading ------------------------------------------------------------------------------


async def test_call_get_and_ls(served: tuple[str, ...], engine: fusee.Engine) -> None:
    key = _key("tally")
    called = await cli("objects", "call", "counter", key, "add", '{"client": "c", "n": 1}', *served)
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout) == 1

    got = await cli("objects", "get", "counter", key, *served)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == {"count": 1, "seen": ["c:1"]}
    assert got.stdout == json.dumps({"count": 1, "seen": ["c:1"]}, indent=2) + "\n"
    never = await cli("objects", "get", "counter", _key("never"), *served)
    assert (never.returncode, json.loads(never.stdout)) == (0, {})

    listed = await cli("objects", "ls", "counter", "--json", *served)
    assert listed.returncode == 0, listed.stderr
    entries = {e["key"]: e["state"] for e in json.loads(listed.stdout)}
    assert entries[key] == {"count": 1, "seen": ["c:1"]}
    table = await cli("objects", "ls", "counter", *served)
    row = next(line for line in table.stdout.splitlines() if line.startswith(key))
    assert row.split(None, 1)[1] == '{"count": 1, "seen": ["c:1"]}'

    empty = await cli("objects", "ls", "nobody", *served)
    assert (empty.returncode, empty.stdout) == (0, "")
    assert "No keys of object type 'nobody'" in empty.stderr


async def test_show_the_queue_then_cancel_by_number(
    served: tuple[str, ...], engine: fusee.Engine
) -> None:
    key = _key("queue")
    obj = engine.object("counter", key)
    await obj.call("add", {"client": "c", "n": 1})
    sent = await cli("objects", "send", "counter", key, "approve", "{}", *served)
    assert sent.returncode == 0, sent.stderr
    held = int(sent.stdout)
    queued = int((await cli("objects", "send", "counter", key, "add", '{"n": 2}', *served)).stdout)
    assert queued > held
    await wait_running(engine, key, held)

    show = await cli("objects", "show", "counter", key, *served)
    assert show.returncode == 0, show.stderr
    lines = show.stdout.splitlines()
    assert lines[0] == f"object    counter/{key}"
    assert "  count  1" in lines
    running = next(line for line in lines if line.startswith("running"))
    assert running.startswith(f"running   #{held}  approve  since ")
    waiting = lines.index("waiting   1, in the order they run:")
    assert lines[waiting + 1].split()[:3] == [f"#{queued}", "add", "queued"]
    assert any(line.startswith("last ") and " add  ok" in line for line in lines)
    # the way fusee was started here (python -m fusee: not on PATH), then its arguments
    assert lines[-1].startswith("cancel one with: ")
    assert f" -m fusee objects cancel counter {key} {held} " in lines[-1]

    as_json = json.loads((await cli("objects", "show", "counter", key, "--json", *served)).stdout)
    assert as_json["running"]["seq"] == held
    assert as_json["running"]["handler"] == "approve"
    assert [w["seq"] for w in as_json["waiting"]] == [queued]
    assert as_json["state"] == {"count": 1, "seen": ["c:1"]}

    cancel = await cli(
        "objects", "cancel", "counter", key, str(held), "--reason", "no one", *served
    )
    assert cancel.returncode == 0, cancel.stderr
    with pytest.raises(fusee.HandlerCancelled, match="no one"):
        await obj.result(held, timeout="15s")
    assert await obj.result(queued, timeout="15s") == 2  # the next one ran

    nothing = await cli("objects", "cancel", "counter", key, *served)
    assert nothing.returncode == 1
    assert "nothing queued to cancel" in nothing.stderr
    # a number that is not running or queued (it ended, or never was) is not a success
    for gone in (str(held), "99999"):
        missing = await cli("objects", "cancel", "counter", key, gone, *served)
        assert missing.returncode == 1, missing.stdout
        assert f"no invocation {gone} running or queued" in missing.stderr


async def test_cancel_without_a_number_cancels_the_running_invocation_only(
    served: tuple[str, ...], engine: fusee.Engine
) -> None:
    key = _key("stop")
    obj = engine.object("counter", key)
    held = await obj.send("approve", {})
    await wait_running(engine, key, held)
    cancel = await cli("objects", "cancel", "counter", key, *served)
    assert cancel.returncode == 0, cancel.stderr
    assert f"invocation #{held}" in cancel.stdout
    with pytest.raises(fusee.HandlerCancelled, match="cancelled from the CLI"):
        await obj.result(held, timeout="15s")
    # a later invocation is not hit by that cancel
    later = await obj.send("approve", {})
    info = await wait_running(engine, key, later)
    assert info.running is not None
    assert not info.running.cancelling
    await obj.signal("approval", "yes")
    assert await obj.result(later, timeout="15s") == "yes"


# -- editing ------------------------------------------------------------------------------


async def test_edit_in_the_editor_applies_what_was_saved(
    served: tuple[str, ...], engine: fusee.Engine, tmp_path: Path
) -> None:
    key = _key("edit")
    obj = engine.object("counter", key)
    await obj.call("add", {"client": "c", "n": 1})
    env = editor(
        tmp_path,
        """
        assert state == {"count": 1, "seen": ["c:1"]}, state
        state["count"] = 42
        del state["seen"]
        state["note"] = "fixed by hand"
        json.dump(state, open(path, "w"), indent=2)
        """,
    )
    edited = await cli("objects", "edit", "counter", key, *served, env=env)
    assert edited.returncode == 0, edited.stderr
    assert json.loads(edited.stdout) == {"count": 42, "note": "fixed by hand"}
    assert await obj.state() == {"count": 42, "note": "fixed by hand"}
    assert await obj.call("add", {"n": 2}) == 43  # handlers see the edited state


async def test_edit_with_invalid_json_or_no_change_applies_nothing(
    served: tuple[str, ...], engine: fusee.Engine, tmp_path: Path
) -> None:
    key = _key("broken")
    obj = engine.object("counter", key)
    await obj.call("add", {"client": "c", "n": 1})
    before = await obj.show()

    broken = editor(tmp_path, 'open(path, "w").write(\'{\\n  "count": 2,\\n  oops\\n}\\n\')')
    bad = await cli("objects", "edit", "counter", key, *served, env=broken)
    assert bad.returncode == 2, bad.stderr
    assert bad.stdout == ""
    message = bad.stderr.strip()
    assert message.startswith("error: the edited state is not valid JSON: ")
    assert "at line 3, column 3" in message
    assert "nothing applied" in message
    kept = Path(message.rsplit("your edit is kept in ", 1)[1].rstrip(")"))
    assert "oops" in kept.read_text()
    kept.unlink()

    array = editor(tmp_path, 'open(path, "w").write("[1, 2]")')
    bad = await cli("objects", "edit", "counter", key, *served, env=array)
    assert bad.returncode == 2
    assert "must be a JSON object, not an array" in bad.stderr
    Path(bad.stderr.strip().rsplit("kept in ", 1)[1].rstrip(")")).unlink()

    same = await cli("objects", "edit", "counter", key, *served, env={"EDITOR": "true"})
    assert same.returncode == 0, same.stderr
    assert "no change" in same.stdout

    after = await obj.show()
    assert after.state == before.state == {"count": 1, "seen": ["c:1"]}
    assert after.last == before.last  # no edit invocation ran


async def test_edit_with_flags_and_files(
    served: tuple[str, ...], engine: fusee.Engine, tmp_path: Path
) -> None:
    key = _key("flags")
    obj = engine.object("counter", key)
    await obj.call("add", {"client": "c", "n": 1})
    setting = await cli(
        "objects",
        "edit",
        "counter",
        key,
        "--set",
        "count=5",
        "--set",
        'tags=["a", "b"]',
        "--delete",
        "seen",
        *served,
    )
    assert setting.returncode == 0, setting.stderr
    assert json.loads(setting.stdout) == {"count": 5, "tags": ["a", "b"]}

    bad = await cli(
        "objects", "edit", "counter", key, "--set", "count=6", "--set", "tags=[1,", *served
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: --set tags: the value is not valid JSON")
    assert "Traceback" not in bad.stderr
    assert await obj.state() == {"count": 5, "tags": ["a", "b"]}  # count=6 was not applied

    file = tmp_path / "state.json"
    file.write_text('{"count": 7}')
    replaced = await cli("objects", "edit", "counter", key, "--file", str(file), *served)
    assert replaced.returncode == 0, replaced.stderr
    assert await obj.state() == {"count": 7}

    piped = await cli(
        "objects", "edit", "counter", key, "--file", "-", *served, stdin='{"x": null}'
    )
    assert piped.returncode == 0, piped.stderr
    assert await obj.state() == {"x": None}

    not_object = await cli("objects", "edit", "counter", key, "--file", "-", *served, stdin="3")
    assert not_object.returncode == 2
    assert "must be a JSON object, not a number" in not_object.stderr
    assert await obj.state() == {"x": None}


async def test_an_edit_waits_for_the_running_invocation(
    served: tuple[str, ...], engine: fusee.Engine
) -> None:
    key = _key("turn")
    obj = engine.object("counter", key)
    held = await obj.send("approve", {})
    await wait_running(engine, key, held)
    async with anyio.create_task_group() as tg:
        done: list[subprocess.CompletedProcess[str]] = []

        async def edit() -> None:
            done.append(await cli("objects", "edit", "counter", key, "--set", "x=1", *served))

        tg.start_soon(edit)

        async def edit_queued() -> bool:
            info = await obj.show()
            return [w.handler for w in info.waiting] == ["fusee.edit"]

        with anyio.fail_after(20):  # the CLI queued it: it waits its turn behind approve
            while not await edit_queued():
                await anyio.sleep(0.05)
        assert not done
        info = await obj.show()
        assert info.running is not None
        assert info.running.seq == held
        assert await obj.state() == {}
        await obj.signal("approval", "ok")
    assert done[0].returncode == 0, done[0].stderr
    assert json.loads(done[0].stdout) == {"approved": "ok", "x": 1}


async def test_clear(served: tuple[str, ...], engine: fusee.Engine) -> None:
    key = _key("clear")
    obj = engine.object("counter", key)
    await obj.call("add", {"client": "c", "n": 1})
    cleared = await cli("objects", "clear", "counter", key, *served)
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout == f"cleared the state of counter/{key}\n"
    assert await obj.state() == {}
    assert await obj.call("add", {"n": 2}) == 1


# -- invoking and bad input -----------------------------------------------------------------


async def test_call_failures_timeouts_and_bad_input(
    served: tuple[str, ...], engine: fusee.Engine
) -> None:
    key = _key("fail")
    obj = engine.object("counter", key)
    await obj.call("add", {"client": "c", "n": 1})

    failed = await cli("objects", "call", "counter", key, "fail", '{"message": "boom"}', *served)
    assert failed.returncode == 1
    assert failed.stderr == f"error: counter/{key}: handler 'fail' failed: ValueError: boom\n"
    assert await obj.state() == {"count": 1, "seen": ["c:1"]}  # its changes were dropped

    late = await cli(
        "objects", "call", "counter", key, "approve", "{}", "--timeout", "300ms", *served
    )
    assert late.returncode == 4  # not yet: it stays queued
    assert "did not end within 300ms; it stays queued or running" in late.stderr
    await obj.signal("approval", "later")
    with anyio.fail_after(15):
        while (await obj.state()).get("approved") != "later":
            await anyio.sleep(0.05)

    for args, says in [
        (("get", "bad/type", "k"), "invalid object type 'bad/type'"),
        (("get", "counter", "a\tb"), "invalid key of object 'counter'"),
        (("call", "counter", key, "add", "{nope"), "the input is not valid JSON"),
        (("send", "counter", key, "add", "NaN"), "the input is not valid JSON"),
        (("edit", "counter", key, "--set", "=1"), "expected KEY=JSON"),
        (("edit", "counter", key, "--file", "-", "--set", "a=1"), "--file replaces the whole"),
        (("cancel", "counter", key, "0"), "an invocation's number is >= 1"),
        (("call", "counter", key, "add", "--timeout", "soon"), "invalid --timeout"),
    ]:
        bad = await cli("objects", *args, *served)
        assert bad.returncode == 2, (args, bad.stdout, bad.stderr)
        assert bad.stderr.startswith("error: "), (args, bad.stderr)
        assert says in bad.stderr, (args, bad.stderr)
        assert len(bad.stderr.splitlines()) == 1, bad.stderr
    assert (await obj.state())["count"] == 1


async def test_send_with_an_idempotency_key_queues_once(
    served: tuple[str, ...], engine: fusee.Engine
) -> None:
    key = _key("once")
    args = ("objects", "send", "counter", key, "add", '{"n": 1}', "--idempotency-key", "k-1")
    first, second = await cli(*args, *served), await cli(*args, *served)
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    assert first.stdout == second.stdout
    assert await engine.object("counter", key).result(int(first.stdout), timeout="15s") == 1
    called = await cli("objects", "call", "counter", key, "add", "{}", *served)
    assert json.loads(called.stdout) == 2  # the retried send did not run it twice


async def test_edit_and_clear_with_no_worker_stop_at_their_timeout(nats_server: Any) -> None:
    unserved = ("--nats", nats_server.url, "--namespace", f"t{secrets.token_hex(4)}")
    key = _key("orphan")
    for args in (("edit", "nobody", key, "--set", "a=1"), ("clear", "nobody", key)):
        done = await cli("objects", *args, "--timeout", "1s", *unserved)
        assert done.returncode == 4, (args, done.stdout, done.stderr)
        assert "stays queued" in done.stderr
        assert "'nobody'" in done.stderr
        assert "queued; it applies when a worker for 'nobody' runs" in done.stderr


async def test_an_edit_of_a_type_no_worker_serves_says_so_at_once(served: tuple[str, ...]) -> None:
    # a worker runs, but none has the type: the edit waits for one, and says so first
    done = await cli(
        "objects", "edit", "nobody", _key("orphan"), "--set", "a=1", "--timeout", "2s", *served
    )
    assert done.returncode == 4, done.stderr
    assert (
        "queued; it applies when a worker for 'nobody' runs (1 live worker, none serves it)"
        in done.stderr
    )


async def test_a_state_too_large_is_one_line_naming_it(served: tuple[str, ...]) -> None:
    big = json.dumps({"notes": "x" * 1_500_000})
    done = await cli("objects", "edit", "counter", _key("big"), "--file", "-", *served, stdin=big)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "bytes" in lines[0]


async def test_send_cancel_and_clear_print_json(
    served: tuple[str, ...], engine: fusee.Engine
) -> None:
    key = _key("json")
    obj = engine.object("counter", key)
    await obj.call("add", {"client": "c", "n": 1})
    sent = await cli("objects", "send", "counter", key, "approve", "{}", "--json", *served)
    assert sent.returncode == 0, sent.stderr
    out = json.loads(sent.stdout)
    assert (out["object_type"], out["key"]) == ("counter", key)
    await wait_running(engine, key, out["seq"])
    cancel = await cli("objects", "cancel", "counter", key, "--reason", "r", "--json", *served)
    assert json.loads(cancel.stdout) == {
        "object_type": "counter",
        "key": key,
        "seq": out["seq"],
        "reason": "r",
    }
    with pytest.raises(fusee.HandlerCancelled):
        await obj.result(out["seq"], timeout="15s")
    cleared = await cli("objects", "clear", "counter", key, "--json", *served)
    assert json.loads(cleared.stdout) == {"object_type": "counter", "key": key, "state": {}}
    nothing = await cli("objects", "cancel", "counter", key, "--json", *served)
    assert nothing.returncode == 1
    assert json.loads(nothing.stderr)["error"]["code"] == "nothing_to_cancel"
