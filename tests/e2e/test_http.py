"""The HTTP API against a real server process: ``fusee api`` and ``fusee worker``
subprocesses on a real nats-server, spoken to by a real HTTP client (httpx).

One API process and one worker serve the whole module (each test uses its own run
IDs); the tests of token streams skip while ``Run.stream_events`` is missing.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import pytest

import fusee
from tests.helpers import assert_http_error
from tests.helpers import cli_cmd as _cmd
from tests.helpers import cli_env as _env
from tests.helpers import run_cli as _cli
from tests.workers.procs import wait_until

WORKFLOWS = textwrap.dedent(
    """
    import anyio
    import fusee

    @fusee.workflow("http-echo")
    async def echo(ctx, text):
        upper = await ctx.step("upper", lambda: text.upper())
        return {"echo": upper}

    def _boom(text):
        raise ValueError(f"no good: {text}")

    @fusee.workflow("http-fail")
    async def fail(ctx, text):
        await ctx.step("boom", lambda: _boom(text), retry=fusee.Retry(attempts=1))
        return "unreachable"

    @fusee.workflow("http-pause")
    async def pause(ctx, arg):
        import os

        def flaky():
            if not os.path.exists(arg["fixed"]):
                raise ConnectionError("the provider is down")
            return "fixed"

        policy = fusee.Retry(attempts=2, initial="1ms", max="2ms", on_exhausted="pause")
        return await ctx.step("model", flaky, retry=policy)

    @fusee.workflow("http-held")
    async def held(ctx, arg):
        # running until the file arg["until"] exists: the test creates it
        import os

        async def hold():
            while not os.path.exists(arg["until"]):
                await anyio.sleep(0.01)
            return arg["value"]
        return await ctx.step("hold", hold)

    _attempts = {}

    @fusee.workflow("http-tokens")
    async def tokens(ctx, arg):
        from fusee.ai import model_call

        def fn(resume):
            key = (ctx.run_id, arg.get("turn", 0))
            _attempts[key] = attempt = _attempts.get(key, 0) + 1

            async def chunks():
                for i in range(arg["n"]):
                    if attempt == 1 and i == arg.get("fail_at", -1):
                        raise ConnectionError("the provider hung up")
                    await anyio.sleep(arg["delay"])
                    yield f"a{attempt}t{i} "
            return chunks()

        return await model_call(
            ctx,
            "reply",
            fn,
            prefill=False,
            retry=fusee.Retry(attempts=3, initial="10ms", jitter=0),
        )
    """
)


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.text().splitlines():
            if line.startswith("{") and f'"{name}"' in line:
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue  # a line being written
        return [e for e in found if e.get("event") == name]

    def wait_for(self, name: str, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not (found := self.events(name)):
            assert self.proc.poll() is None, f"exited with {self.proc.returncode}:\n{self.text()}"
            assert time.monotonic() < deadline, f"no {name} within {timeout}s:\n{self.text()}"
            time.sleep(0.05)
        return found[0]


@dataclass
class Api:
    """The module's API server, its worker, and where they are."""

    base: str
    nats: str
    namespace: str
    api: Proc
    worker: Proc
    conn: tuple[str, ...] = field(default=())


@pytest.fixture(scope="module")
def api(nats_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("http")
    workflows = tmp / "http_workflows.py"
    workflows.write_text(WORKFLOWS)
    namespace = f"t{secrets.token_hex(4)}"
    conn = ("--nats", nats_server.url, "--namespace", namespace)
    procs: list[tuple[Proc, Any]] = []

    def start(name: str, *args: str) -> Proc:
        path = tmp / f"{name}.log"
        out = path.open("wb")
        popen = subprocess.Popen(
            _cmd(*args), stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=tmp
        )
        proc = Proc(popen, path)
        procs.append((proc, out))
        return proc

    try:
        worker = start("worker", "worker", str(workflows), *conn)
        server = start(
            "api",
            "api",
            "--port",
            "0",
            "--keepalive",
            "300ms",
            "--log-level",
            "debug",
            "--no-auth",
            *conn,
        )
        serving = server.wait_for("api.serving")
        worker.wait_for("worker.started")
        assert serving["host"] == "127.0.0.1"
        yield Api(serving["url"], nats_server.url, namespace, server, worker, conn)
    finally:
        for proc, out in procs:
            if proc.proc.poll() is None:
                proc.proc.terminate()
                try:
                    proc.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.proc.kill()
                    proc.proc.wait()
            out.close()


def _rid(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


async def _running(engine: fusee.Engine, run_id: str) -> None:
    """Until the run's status is ``running`` (its worker took it)."""
    with anyio.fail_after(20):
        while (await engine.run(run_id).describe()).status != "running":
            await anyio.sleep(0.05)


def assert_error(response: httpx.Response, status: int, code: str) -> str:
    """The one error shape; returns the message."""
    message: str = assert_http_error(response, status, code)["message"]
    return message


# -- result and describe ------------------------------------------------------------------


async def test_result_of_completed_failed_unknown_and_invalid_runs(
    client: httpx.AsyncClient, engine: fusee.Engine, api: Api
) -> None:
    done, failed = _rid("echo"), _rid("fail")
    await engine.start("http-echo", done, "hello")
    await engine.start("http-fail", failed, "x")

    r = await client.get(f"/v1/runs/{done}/result", params={"timeout": "15s"})
    assert r.status_code == 200, r.text
    assert r.json() == {"run_id": done, "status": "completed", "result": {"echo": "HELLO"}}

    r = await client.get(f"/v1/runs/{failed}/result", params={"timeout": "15"})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "run_id": failed,
        "status": "failed",
        "error": {"type": "ValueError", "message": "no good: x"},
    }

    r = await client.get("/v1/runs/no-such-run/result")
    message = assert_error(r, 404, "run_not_found")
    assert message == f"no run 'no-such-run' in namespace '{api.namespace}'"

    r = await client.get("/v1/runs/bad%09id/result")
    assert "invalid run ID" in assert_error(r, 400, "invalid_id")
    r = await client.get(f"/v1/runs/{'x' * 300}/result")
    assert_error(r, 400, "invalid_id")


async def test_result_of_a_run_still_going_with_and_without_timeout(
    client: httpx.AsyncClient, engine: fusee.Engine, tmp_path: Path
) -> None:
    nobody = _rid("pending")
    await engine.start("http-nobody", nobody, None)  # no worker serves this workflow
    started = time.monotonic()
    r = await client.get(f"/v1/runs/{nobody}/result", params={"timeout": "300ms"})
    waited = time.monotonic() - started
    assert r.status_code == 202, r.text
    assert r.json()["run_id"] == nobody
    assert r.json()["status"] == "pending"
    assert 0.3 <= waited < 5

    started = time.monotonic()
    r = await client.get(f"/v1/runs/{nobody}/result", params={"timeout": "0"})
    assert (r.status_code, r.json()["status"]) == (202, "pending")
    assert time.monotonic() - started < 2

    slow, release = _rid("slow"), tmp_path / "release"
    await engine.start("http-held", slow, {"until": str(release), "value": 2.0})
    await _running(engine, slow)  # and it stays running until `release` exists
    r = await client.get(f"/v1/runs/{slow}/result", params={"timeout": 0.2})
    assert (r.status_code, r.json()) == (202, {"run_id": slow, "status": "running"})
    # without a timeout: the default (30 s) outlasts the step, so the wait ends with it
    got: list[httpx.Response] = []

    async def wait_result() -> None:
        got.append(await client.get(f"/v1/runs/{slow}/result"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_result)
        release.touch()  # (before or after the request arrives: the answer is the same)
    [r] = got
    assert r.status_code == 200, r.text
    assert r.json() == {"run_id": slow, "status": "completed", "result": 2.0}


@pytest.mark.parametrize(
    ("timeout", "says"),
    [
        ("abc", "invalid timeout 'abc'"),
        ("-1", "must not be negative"),
        ("10m", "at most 5m"),
        ("", "must not be empty"),
        ("30x", "invalid timeout"),
    ],
)
async def test_result_rejects_a_bad_timeout(
    client: httpx.AsyncClient, engine: fusee.Engine, timeout: str, says: str
) -> None:
    run = _rid("echo")
    await engine.start("http-echo", run, "t")
    r = await client.get(f"/v1/runs/{run}/result", params={"timeout": timeout})
    message = assert_error(r, 400, "invalid_argument")
    assert "timeout" in message
    assert says in message


async def test_describe(client: httpx.AsyncClient, engine: fusee.Engine) -> None:
    run = f"chat-7/{_rid('turn')}"  # IDs may hold slashes
    await engine.start("http-echo", run, "a")
    await (engine.run(run)).result(timeout="15s")
    path = quote(run, safe="")  # one path segment: its slash is %2F
    r = await client.get(f"/v1/runs/{path}")
    assert r.status_code == 200, r.text
    info = r.json()
    assert (info["run_id"], info["workflow"], info["status"], info["steps"]) == (
        run,
        "http-echo",
        "completed",
        1,
    )
    r = await client.get(f"/v1/runs/{path}/result", params={"timeout": 0})
    assert r.json()["result"] == {"echo": "A"}
    # written as it is, it is not that run's path: the error says how to write it
    message = assert_error(await client.get(f"/v1/runs/{run}"), 404, "not_found")
    assert "%2F" in message

    failed = _rid("fail")
    await engine.start("http-fail", failed, "y")
    with pytest.raises(fusee.RunFailed):
        await engine.run(failed).result(timeout="15s")
    info = (await client.get(f"/v1/runs/{failed}")).json()
    assert (info["status"], info["error_type"], info["message"], info["step"]) == (
        "failed",
        "ValueError",
        "no good: y",
        "boom",
    )
    assert_error(await client.get("/v1/runs/nope"), 404, "run_not_found")


# -- the API itself -----------------------------------------------------------------------


async def test_resume_a_paused_run(
    client: httpx.AsyncClient, engine: fusee.Engine, tmp_path: Path
) -> None:
    run_id, fixed = _rid("http-pause"), tmp_path / "fixed"
    await engine.start("http-pause", run_id, {"fixed": str(fixed)})

    async def paused() -> bool:
        return (await engine.run(run_id).describe()).status == "paused"

    await wait_until(paused, timeout=20, what=f"{run_id} to pause")
    r = await client.get(f"/v1/runs/{run_id}")
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["step"], r.json()["attempts"]) == ("paused", "model", 2)
    bad = await client.post(f"/v1/runs/{run_id}/resume", json={"force": "yes"})
    assert bad.status_code == 400
    fixed.touch()
    r = await client.post(f"/v1/runs/{run_id}/resume")
    assert r.status_code == 202, r.text
    assert r.json() == {"run_id": run_id, "status": "resuming"}
    assert await engine.run(run_id).result(timeout="15s") == "fixed"
    r = await client.post(f"/v1/runs/{run_id}/resume")
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "not_paused_error"
    assert (await client.post("/v1/runs/nope-never/resume")).status_code == 404


async def test_openapi_lists_every_endpoint(client: httpx.AsyncClient) -> None:
    r = await client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {
        "/healthz",
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/journal",
        "/v1/runs/{run_id}/result",
        "/v1/runs/{run_id}/resume",
        "/v1/runs/{run_id}/cancel",
        "/v1/runs/{run_id}/signals/{name}",
        "/v1/runs/{run_id}/streams/{name}",
        "/v1/runs/bulk/resume",
        "/v1/runs/bulk/cancel",
        "/v1/runs/{run_id}/waits/{pos}/complete",
        "/v1/runs/{run_id}/streams",
        "/v1/objects",
        "/v1/objects/{object_type}",
        "/v1/objects/{object_type}/{key}",
        "/v1/objects/{object_type}/{key}/state",
        "/v1/objects/{object_type}/{key}/call/{handler}",
        "/v1/objects/{object_type}/{key}/send/{handler}",
        "/v1/objects/{object_type}/{key}/cancel",
        "/v1/completions/{token}",
        "/v1/limits",
        "/v1/limits/{name}",
        "/v1/tokens",
        "/v1/tokens/{token_id}",
        "/v1/runs/{run_id}/streams/{name}/token",
    }
    # generated from the routes' types: the bearer scheme, and the routes exempt from it
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["security"] == [{"bearer": []}]
    assert doc["paths"]["/healthz"]["get"]["security"] == [{}]
    assert doc["paths"]["/v1/completions/{token}"]["post"]["security"] == [{}]
    completions = doc["paths"]["/v1/completions/{token}"]
    assert {"200", "400", "404", "409", "413"} <= set(completions["post"]["responses"])
    for path, item in doc["paths"].items():
        for op in item.values():
            assert op["responses"], path
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == set(path.replace("}", "{").split("{")[1::2]), path
    result = doc["paths"]["/v1/runs/{run_id}/result"]["get"]
    assert {"200", "202", "400", "404"} <= set(result["responses"])
    assert "timeout" in {p["name"] for p in result["parameters"]}
    stream = doc["paths"]["/v1/runs/{run_id}/streams/{name}"]["get"]
    assert {"from", "Last-Event-ID"} <= {p["name"] for p in stream["parameters"]}
    assert "text/event-stream" in stream["responses"]["200"]["content"]
    error = doc["components"]["schemas"]["ErrorDetail"]
    assert {"code", "message"} <= set(error["required"])
    assert "request_id" in error["properties"]


async def test_healthz(client: httpx.AsyncClient, api: Api) -> None:
    r = await client.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok", "namespace": api.namespace})


async def test_errors_have_one_shape(client: httpx.AsyncClient) -> None:
    assert "GET /nope" in assert_error(await client.get("/nope"), 404, "not_found")
    assert_error(await client.get("/v1"), 404, "not_found")
    r = await client.post("/healthz")
    assert "GET" in assert_error(r, 405, "method_not_allowed")
    r = await client.delete("/v1/runs/x/result")
    assert_error(r, 405, "method_not_allowed")


# -- token streams (SSE) ------------------------------------------------------------------


@dataclass
class Event:
    event: str
    data: dict[str, Any]
    id: str | None


async def read_events(
    response: httpx.Response, *, limit: int | None = None, comments: list[str] | None = None
) -> list[Event]:
    """Parse SSE from ``response`` until it closes, or until ``limit`` events."""
    events: list[Event] = []
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):
            if comments is not None:
                comments.append(line[1:].strip())
            continue
        if line == "":
            if fields:
                events.append(
                    Event(
                        fields.get("event", "message"), json.loads(fields["data"]), fields.get("id")
                    )
                )
                fields = {}
                if limit is not None and len(events) >= limit:
                    break
            continue
        key, _, value = line.partition(":")
        fields[key] = value[1:] if value.startswith(" ") else value
    return events


def tokens_of(events: list[Event]) -> list[Event]:
    return [e for e in events if e.event == "token"]


SSE = {"Accept": "text/event-stream"}


async def test_sse_reconnect_with_last_event_id_has_no_gap_and_no_duplicate(
    client: httpx.AsyncClient, engine: fusee.Engine, api: Api
) -> None:
    run = _rid("tokens")
    n = 60
    await engine.start("http-tokens", run, {"n": n, "delay": 0.02})
    url = f"/v1/runs/{run}/streams/reply"

    async with client.stream("GET", url, headers=SSE) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        first = await read_events(r, limit=15)
    # disconnected midway: the run is still writing
    assert [e.event for e in first] == ["token"] * 15
    assert [e.id for e in first] == [str(i) for i in range(15)]
    assert [e.data["index"] for e in first] == list(range(15))
    status = (await client.get(f"/v1/runs/{run}")).json()["status"]
    assert status == "running"

    async with client.stream("GET", url, headers={**SSE, "Last-Event-ID": first[-1].id or ""}) as r:
        assert r.status_code == 200
        rest = await read_events(r)  # to the end: the server closes the response
    assert rest[-1].event == "end"
    assert [e.event for e in rest[:-1]] == ["token"] * (n - 15)
    got = first + rest[:-1]
    assert [e.data["index"] for e in got] == list(range(n))  # no gap, no duplicate
    text = "".join(e.data["text"] for e in got)
    assert text == "".join(f"a1t{i} " for i in range(n))
    assert all(e.data["attempt"] == 1 for e in got)
    assert rest[-1].data["index"] == n
    assert rest[-1].id is None

    result = await client.get(f"/v1/runs/{run}/result", params={"timeout": "15s"})
    assert result.json()["result"] == text

    # after the run ended: ?from=N reads exactly the tail; the header wins over ?from=
    async with client.stream("GET", url, params={"from": 57}, headers=SSE) as r:
        tail = await read_events(r)
    assert [e.data["index"] for e in tokens_of(tail)] == [57, 58, 59]
    assert tail[-1].event == "end"
    async with client.stream(
        "GET", url, params={"from": 0}, headers={**SSE, "Last-Event-ID": "58"}
    ) as r:
        tail = await read_events(r)
    assert [e.data["index"] for e in tokens_of(tail)] == [59]

    # the server noticed the first client leave and stopped its reader
    assert api.api.events("http.stream.disconnected")


async def test_sse_shows_where_an_attempt_started_over(
    client: httpx.AsyncClient, engine: fusee.Engine
) -> None:
    run = _rid("retry")
    await engine.start("http-tokens", run, {"n": 8, "delay": 0.01, "fail_at": 5})
    async with client.stream("GET", f"/v1/runs/{run}/streams/reply", headers=SSE) as r:
        events = await read_events(r)
    kinds = [e.event for e in events]
    assert kinds == ["token"] * 5 + ["attempt"] + ["token"] * 8 + ["end"], kinds
    boundary = events[5]
    assert (boundary.id, boundary.data["index"], boundary.data["attempt"]) == (None, 5, 2)
    assert [e.data["index"] for e in tokens_of(events)] == list(range(13))
    final = "".join(e.data["text"] for e in events[6:] if e.event == "token")
    result = await client.get(f"/v1/runs/{run}/result", params={"timeout": "15s"})
    assert result.json()["result"] == final == "".join(f"a2t{i} " for i in range(8))


async def test_sse_bad_input(client: httpx.AsyncClient, engine: fusee.Engine) -> None:
    run = _rid("echo")
    await engine.start("http-echo", run, "z")
    await engine.run(run).result(timeout="15s")
    url = f"/v1/runs/{run}/streams/reply"

    assert_error(await client.get("/v1/runs/nope/streams/reply", headers=SSE), 404, "run_not_found")
    message = assert_error(await client.get(url, headers=SSE), 404, "stream_not_found")
    assert "reply" in message
    for value, says in (("-1", "must not be negative"), ("abc", "integer"), ("1.5", "integer")):
        r = await client.get(url, params={"from": value}, headers=SSE)
        assert says in assert_error(r, 400, "invalid_argument")
    r = await client.get(url, headers={**SSE, "Last-Event-ID": "x"})
    assert "Last-Event-ID" in assert_error(r, 400, "invalid_argument")
    r = await client.get(url, headers={"Accept": "application/json"})
    assert_error(r, 406, "not_acceptable")
    r = await client.get("/v1/runs/bad%09id/streams/reply", headers=SSE)
    assert_error(r, 400, "invalid_id")


async def test_sse_huge_offset_waits_with_keepalives_and_honours_disconnect(
    client: httpx.AsyncClient, engine: fusee.Engine, api: Api, tmp_path: Path
) -> None:
    done = _rid("tokens")
    await engine.start("http-tokens", done, {"n": 3, "delay": 0})
    await engine.run(done).result(timeout="15s")
    # a finished stream: a huge offset has nothing to send but its end
    async with client.stream(
        "GET", f"/v1/runs/{done}/streams/reply", params={"from": 10**12}, headers=SSE
    ) as r:
        events = await read_events(r)
    assert [e.event for e in events] == ["end"]

    # a live run that has no such stream yet, or not this far: the reader waits, with
    # keep-alive comments (300 ms in this server), until the client leaves
    slow, release = _rid("slow"), tmp_path / "release"
    await engine.start("http-held", slow, {"until": str(release), "value": 0})
    before = len(api.api.events("http.stream.disconnected"))
    comments: list[str] = []
    try:
        # live (held) all along: the 1.5 s is how long this client listens
        with anyio.move_on_after(1.5):
            async with client.stream(
                "GET", f"/v1/runs/{slow}/streams/reply", params={"from": 10**12}, headers=SSE
            ) as r:
                assert r.status_code == 200
                assert await read_events(r, comments=comments) == []
    finally:
        release.touch()
    assert comments.count("keep-alive") >= 2, comments
    with anyio.fail_after(5):
        while len(api.api.events("http.stream.disconnected")) <= before:
            await anyio.sleep(0.05)


# -- fusee streams follow -----------------------------------------------------------------


async def test_streams_follow_prints_the_text(engine: fusee.Engine, api: Api) -> None:
    run = _rid("tokens")
    await engine.start("http-tokens", run, {"n": 20, "delay": 0.02})
    text = "".join(f"a1t{i} " for i in range(20))
    live = await _cli("streams", "follow", run, "reply", *api.conn)  # follows it while it runs
    assert (live.returncode, live.stdout) == (0, text), live.stderr
    tail = await _cli("streams", "follow", run, "reply", "--from", "18", *api.conn)
    assert (tail.returncode, tail.stdout) == (0, "a1t18 a1t19 "), tail.stderr

    unknown = await _cli("streams", "follow", "nope", "reply", *api.conn)
    assert unknown.returncode == 3  # not found
    assert unknown.stderr.strip() == f"error: no run 'nope' in namespace '{api.namespace}'"
    negative = await _cli("streams", "follow", run, "reply", "--from", "-1", *api.conn)
    assert negative.returncode == 2  # bad input
    assert "--from -1" in negative.stderr
    no_stream = await _cli("streams", "follow", run, "other", *api.conn)
    assert no_stream.returncode == 3
    assert no_stream.stderr.startswith("error: "), no_stream.stderr


# -- serving: fusee api and fusee dev --api-port ------------------------------------------


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Start ``fusee ARGS`` in the background (output in a file); killed at the end."""
    started: list[tuple[Proc, Any]] = []

    def start(*args: str) -> Proc:
        path = tmp_path / f"spawned-{len(started)}.log"
        out = path.open("wb")
        popen = subprocess.Popen(
            _cmd(*args), stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=tmp_path
        )
        started.append((Proc(popen, path), out))
        return started[-1][0]

    yield start
    for proc, out in started:
        if proc.proc.poll() is None:
            proc.proc.kill()
        proc.proc.wait()
        out.close()


async def test_api_stops_on_sigterm_and_ends_open_streams(
    spawn: Any, api: Api, engine: fusee.Engine, tmp_path: Path
) -> None:
    server = spawn("api", "--port", "0", "--no-auth", *api.conn)
    serving = await anyio.to_thread.run_sync(server.wait_for, "api.serving")
    assert serving["auth"] is False
    assert server.events("api.no_auth")[0]["level"] == "warning"  # said loudly
    slow, release = _rid("slow"), tmp_path / "release"
    await engine.start("http-held", slow, {"until": str(release), "value": 0})
    try:  # the run stays live (held) while its stream is open
        async with httpx.AsyncClient(base_url=serving["url"], timeout=20.0) as c:
            assert (await c.get("/healthz")).status_code == 200
            async with c.stream("GET", f"/v1/runs/{slow}/streams/reply", headers=SSE) as r:
                assert r.status_code == 200
                server.proc.terminate()
                with anyio.fail_after(5):  # the open stream ends at once, without an end event
                    assert await read_events(r) == []
    finally:
        release.touch()
    code = await anyio.to_thread.run_sync(lambda: server.proc.wait(timeout=10))
    assert code == 0, server.text()
    assert server.events("api.stopped")


async def test_api_reports_a_port_in_use(spawn: Any, api: Api) -> None:
    port = api.base.rsplit(":", 1)[1]
    done = await _cli("api", "--port", port, *api.conn)
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: cannot serve the HTTP API on 127.0.0.1:{port}: ")
    assert "Traceback" not in done.stderr


async def test_dev_serves_the_api_with_api_port(spawn: Any, tmp_path: Path) -> None:
    path = tmp_path / "dev_workflows.py"
    path.write_text(WORKFLOWS)
    dev = spawn("dev", str(path), "--api-port", "0", "--store", str(tmp_path / "store"))
    serving = await anyio.to_thread.run_sync(dev.wait_for, "api.serving", 30.0)
    await anyio.to_thread.run_sync(dev.wait_for, "dev.serving")
    # the dev token it printed (stdout) opens the API, which refuses a request without it
    token = re.search(r"API token \(admin[^)]*\): (\S+)", dev.text())
    assert token is not None, dev.text()
    bearer = {"Authorization": f"Bearer {token[1]}"}
    async with httpx.AsyncClient(base_url=serving["url"], timeout=20.0) as c:
        assert (await c.get("/healthz")).json()["namespace"] == "fusee"
        assert (await c.get("/v1/runs/none/result")).status_code == 401
        assert_error(await c.get("/v1/runs/none/result", headers=bearer), 404, "run_not_found")
    dev.proc.send_signal(2)  # SIGINT, as Ctrl-C
    assert await anyio.to_thread.run_sync(lambda: dev.proc.wait(timeout=15)) == 0, dev.text()


async def test_a_bug_is_a_500_without_its_traceback() -> None:
    """In process (a real server cannot be made to fail on purpose): any exception that
    is not fusee's becomes the same error shape, and its details stay in the log."""
    from fusee.adapters.http import create_app

    class Broken:
        run_id = "r1"

        async def describe(self) -> Any:
            raise RuntimeError("secret detail")

    class FakeEngine:
        namespace = "fake"

        def run(self, run_id: str) -> Broken:
            return Broken()

    app = create_app(FakeEngine(), auth=False)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        r = await c.get("/v1/runs/r1")
    message = assert_error(r, 500, "internal_error")
    assert "secret" not in r.text
    assert "http.internal_error" in message


async def test_every_id_addresses_itself(client: httpx.AsyncClient, engine: fusee.Engine) -> None:
    """IDs that end like a route's suffix, or hold one, are still their own paths."""
    tail = _rid("x")
    ids = [f"amb/result-{tail}", f"a/streams/reply-{tail}", f"k9/state-{tail}"]
    for run in ids:
        await engine.start("http-echo", run, "z")
        await engine.run(run).result(timeout="15s")
        info = (await client.get(f"/v1/runs/{quote(run, safe='')}")).json()
        assert info["run_id"] == run  # describe, not the result of a shorter ID
        r = await client.get(f"/v1/runs/{quote(run, safe='')}/result")
        assert r.json()["result"] == {"echo": "Z"}
    # unescaped, "amb/result-…" is the result of run "amb" (there is none)
    message = assert_error(await client.get(f"/v1/runs/amb/result-{tail}"), 404, "not_found")
    assert "%2F" in message
    assert_error(await client.get("/v1/runs/amb/result"), 404, "run_not_found")


@pytest.mark.parametrize(
    "path",
    [
        "/v1/runs/%40counter%2Fseed",
        "/v1/runs/%40counter%2Fseed/result",
        "/v1/runs/%40counter%2Fseed/streams/reply",
    ],
)
async def test_run_routes_refuse_object_ids(client: httpx.AsyncClient, path: str) -> None:
    message = assert_error(await client.get(path), 400, "invalid_id")
    assert "reserved for objects" in message


async def test_run_handles_refuse_object_ids(engine: fusee.Engine) -> None:
    with pytest.raises(fusee.InvalidId, match="reserved for objects"):
        engine.run("@counter/victim")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def test_bodies_over_the_limit_are_refused_unread(
    client: httpx.AsyncClient, api: Api
) -> None:
    big = b'{"text": "' + b"x" * (2 << 20) + b'"}'  # 2 MB: more than one NATS message
    r = await client.post("/v1/objects/counter/k/call/add", content=big)
    message = assert_error(r, 413, "payload_too_large")
    assert "1,048,576 bytes" in message
    assert "--max-body" in message
    patch = b'{"set": {"notes": "' + b"y" * (1200 << 10) + b'"}}'
    assert_error(
        await client.patch("/v1/objects/counter/k/state", content=patch), 413, "payload_too_large"
    )

    # 100 MB announced: refused on its headers, the connection closed
    before = _rss_mib(api.api.proc.pid)

    async def chunks(n: int) -> Any:
        for _ in range(n):
            yield b"z" * (1 << 20)

    headers = {"content-length": str(100 << 20), "content-type": "application/json"}
    try:
        r = await client.patch("/v1/objects/counter/k/state", content=chunks(100), headers=headers)
        assert_error(r, 413, "payload_too_large")
    except (httpx.WriteError, httpx.ReadError):
        pass  # the server answered and closed while the client was still sending
    # sent in chunks with no length: counted as it comes, refused past the limit
    try:
        r = await client.patch("/v1/objects/counter/k/state", content=chunks(5))
        assert_error(r, 413, "payload_too_large")
    except (httpx.WriteError, httpx.ReadError):
        pass
    assert _rss_mib(api.api.proc.pid) - before < 20  # it never held the bodies
    # and the API still answers
    assert (await client.get("/healthz")).status_code == 200


async def test_the_request_id_is_in_the_api_log(client: httpx.AsyncClient, api: Api) -> None:
    """Each log line the API writes while serving a request names its ID (bound into
    structlog's context), as the response's ``X-Request-ID`` does."""
    r = await client.get("/v1/runs/none-such", headers={"X-Request-ID": "trace-log-1"})
    assert r.headers["x-request-id"] == "trace-log-1"

    def logged() -> Any:
        return [e for e in api.api.events("http.request") if e.get("request_id") == "trace-log-1"]

    [line] = await wait_until(logged, timeout=10, what="the request's log line")
    assert (line["method"], line["path"], line["status"]) == ("GET", "/v1/runs/none-such", 404)


async def test_the_app_takes_middleware_that_sees_the_route() -> None:
    """The hook for authentication: ``create_app(middleware=[...])`` runs once a route
    matched, with its template, and answers with the one error shape."""
    from fusee.adapters.http import create_app
    from fusee.adapters.http.errors import send_error

    seen: list[tuple[str, str]] = []

    def refuse(app: Any) -> Any:
        async def middleware(scope: Any, receive: Any, send: Any) -> None:
            seen.append((scope["method"], scope["path_template"]))
            await send_error(scope, send, 401, "unauthorized", "no token")

        return middleware

    class FakeEngine:
        namespace = "fake"

    app = create_app(FakeEngine(), middleware=[refuse], auth=False)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        r = await c.post("/v1/runs/a%2Fb/signals/go", headers={"X-Request-ID": "t-1"})
    assert assert_http_error(r, 401, "unauthorized")["request_id"] == "t-1"
    assert seen == [("POST", "/v1/runs/{run_id}/signals/{name}")]


async def test_head_of_a_live_stream_answers_its_headers(
    client: httpx.AsyncClient, engine: fusee.Engine, api: Api
) -> None:
    run = _rid("head")
    await engine.start("http-tokens", run, {"n": 2000, "delay": 0.05})
    url = f"/v1/runs/{run}/streams/reply"
    async with client.stream("GET", url, headers=SSE) as r:
        await read_events(r, limit=1)  # the stream exists
    r = await client.head(url, headers=SSE)
    assert (r.status_code, r.content) == (200, b"")
    assert r.headers["content-type"].startswith("text/event-stream")

    # the server ended the HEAD request too (its log line is written as it ends), while
    # the stream goes on: it does not read a stream for a request that has its answer
    def ended() -> Any:
        return [e for e in api.api.events("http.request") if e["method"] == "HEAD"]

    [line] = await wait_until(ended, timeout=10, what="the HEAD request's end")
    assert (line["path"], line["status"]) == (url, 200)
    assert (await client.get(f"/v1/runs/{run}")).json()["status"] == "running"
    assert (await client.post(f"/v1/runs/{run}/cancel", json={})).status_code == 202
