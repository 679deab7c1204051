"""The auth review's findings, against a real ``fusee api`` process, a worker and NATS:
an open request ends when its token is revoked or expires; an entry of an unknown scope
is a 401 and no token reaches the console log; the scope asked for is the strictest of
the path's views; unknown tokens cost no NATS read once the API follows the bucket; a
check never makes the bucket; completion tokens never reach a log line."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import nats
import nats.js.errors
import pytest

import fusee
from fusee.adapters.http.auth import DEFAULT_RULES, AuthMiddleware
from fusee.runtime.api_tokens import parse_token
from tests.workers.procs import HERE, Workers, api_server, started, wait_until

STREAM = "model-0"  # the stream of tests/workers/tokens.py's tok_slow
ENDS_WITHIN = 5.0  # an open request's end after its token goes (the watch's delivery)


class Served:
    def __init__(self, base: str, nats: str, namespace: str, tmp: Path) -> None:
        self.base, self.nats, self.namespace, self.tmp = base, nats, namespace, tmp


@pytest.fixture(scope="module")
def served(nats_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("authrev")
    namespace = f"t{secrets.token_hex(4)}"
    workers = Workers(nats_server.url, namespace, tmp, module=HERE / "tokens.py")
    with api_server(nats_server.url, namespace, tmp, auth=True) as server:
        try:
            started(workers.spawn(), "worker.started")
            serving = started(server, "api.serving")
            yield Served(str(serving["url"]), nats_server.url, namespace, tmp)
        finally:
            workers.cleanup()


@pytest.fixture
async def engine(served: Served) -> AsyncIterator[fusee.Engine]:
    async with await fusee.connect(served.nats, namespace=served.namespace) as e:
        yield e


@pytest.fixture
async def client(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.base, timeout=30.0) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _long_run(engine: fusee.Engine, tmp: Path) -> str:
    run = f"rev-{secrets.token_hex(3)}"
    # 2000 tokens, 50 ms apart: the run and its stream last ~100 s, far beyond the test
    arg = {"tokens": 2000, "delay": 0.05, "prefill": False, "log": str(tmp / f"{run}.log")}
    await engine.start("tok_slow", run, arg)
    return run


@pytest.mark.parametrize("how", ["revoked issuer", "expired", "revoked bearer", "expired bearer"])
async def test_an_open_stream_ends_when_its_token_is_revoked_or_expires(
    served: Served, engine: fusee.Engine, client: httpx.AsyncClient, how: str
) -> None:
    run = await _long_run(engine, served.tmp)
    path = f"/v1/runs/{run}/streams/{STREAM}"
    reader = await engine.tokens.create("read", ttl="3s" if how == "expired bearer" else None)
    if how == "expired":
        request: dict[str, Any] = {
            "params": {"access_token": engine.tokens.stream_token(run, STREAM, ttl="3s")}
        }
    elif how == "revoked issuer":
        r = await client.post(f"{path}/token", headers=bearer(reader.token))
        assert r.status_code == 201, r.text
        request = {"params": {"access_token": r.json()["access_token"]}}
    else:
        request = {"headers": bearer(reader.token)}
    async with client.stream("GET", path, **request) as resp:
        assert resp.status_code == 200
        lines = resp.aiter_lines()
        async for line in lines:
            if line.startswith("data:"):
                break  # the stream flows
        if how.startswith("revoked"):
            await engine.tokens.revoke(reader.id)
        tail: list[str] = []
        ended = False
        with anyio.move_on_after(ENDS_WITHIN + 3):  # (an expiry: its 3 s, then the bound)
            async for line in lines:
                tail.append(line)
            ended = True
        assert ended, f"{how}: the stream still flows ({len(tail)} lines since)"
    # its last event says why
    assert "event: error" in tail, tail[-5:]
    error = json.loads(tail[tail.index("event: error") + 1].removeprefix("data: "))["error"]
    assert error["code"] == "unauthorized"
    assert ("revoked" if how.startswith("revoked") else "expired") in error["message"]
    # and the same request again is refused
    again = await client.get(path, **request)
    assert again.status_code == 401


async def test_a_waiting_result_ends_with_401_when_its_token_expires(
    served: Served, engine: fusee.Engine, client: httpx.AsyncClient
) -> None:
    """A long ``GET /result`` let in with a token that expires during the wait: a 401
    when it expires, not the run's result a minute later. (An expiry, not a revoke: the
    request is sure to be let in first, its token being good for 3 s.)"""
    run = await _long_run(engine, served.tmp)
    reader = await engine.tokens.create("read", ttl="3s")
    with anyio.fail_after(3 + ENDS_WITHIN):  # the run itself lasts ~100 s
        r = await client.get(
            f"/v1/runs/{run}/result", params={"timeout": "60s"}, headers=bearer(reader.token)
        )
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == "unauthorized"
    assert "expired while the request was open" in r.json()["error"]["message"]


async def test_an_entry_of_unknown_scope_is_a_401_and_no_token_is_logged(
    nats_server: Any, tmp_path: Path
) -> None:
    """A scope this fusee does not know (a newer fusee's, a hand edit) is refused like
    an unknown token; the console log (rich tracebacks) shows no token."""
    namespace = f"t{secrets.token_hex(4)}"
    async with await fusee.connect(nats_server.url, namespace=namespace) as engine:
        made = await engine.tokens.create("read", name="future")
        nc = await nats.connect(nats_server.url)
        try:
            kv = await nc.jetstream().key_value(f"{namespace}_auth")
            entry = json.loads((await kv.get(made.id)).value or b"{}")
            entry["scope"] = "owner"
            await kv.put(made.id, json.dumps(entry).encode())
        finally:
            await nc.close()
    args = ("--log-format", "console", "--log-level", "debug")
    with api_server(nats_server.url, namespace, tmp_path, auth=True, args=args) as server:

        async def bound() -> str | None:
            m = re.search(r"api\.serving.*?(http://127\.0\.0\.1:\d+)", server.log_path.read_text())
            return m.group(1) if m else None

        base = await wait_until(bound, timeout=20, what="api.serving")
        async with httpx.AsyncClient(base_url=base, timeout=20.0) as client:
            r = await client.get("/v1/limits", headers=bearer(made.token))
            assert r.status_code == 401, r.text
            assert r.json()["error"]["code"] == "unauthorized"
        log = server.log_path.read_text(errors="replace")
    assert "tokens.bad_entry" in log  # the reason, at debug
    assert parse_token(made.token).secret not in log


async def test_the_scope_needed_is_the_strictest_of_the_path_s_views(nats_server: Any) -> None:
    """An app that routes on the decoded path (``scope["path"]``, as uvicorn gives it)
    sees ``/v1/tokens`` for ``GET /v1/%74okens``: the middleware asks for admin there."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def tokens(request: Any) -> JSONResponse:
        return JSONResponse({"tokens": "the admin list"})

    async with await fusee.connect(nats_server.url, namespace=f"t{secrets.token_hex(4)}") as e:
        read = (await e.tokens.create("read")).token
        admin = (await e.tokens.create("admin")).token
        app = AuthMiddleware(
            Starlette(routes=[Route("/v1/tokens", tokens)]), e.tokens, DEFAULT_RULES
        )

        async def status(raw: bytes, path: str, token: str) -> list[int]:
            sent: list[int] = []

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    sent.append(message["status"])

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"", "more_body": False}

            # the scope uvicorn builds: path decoded, raw_path as sent
            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "GET",
                "scheme": "http",
                "path": path,
                "raw_path": raw,
                "query_string": b"",
                "root_path": "",
                "headers": [(b"host", b"t"), (b"authorization", f"Bearer {token}".encode())],
                "server": ("t", 80),
                "client": ("c", 1),
            }
            await app(scope, receive, send)
            return sent

        for raw, path in (
            (b"/v1/%74okens", "/v1/tokens"),
            (b"/v1//tokens", "/v1//tokens"),
            (b"/v1/x/../tokens", "/v1/x/../tokens"),
            (b"/v1/tokens/", "/v1/tokens/"),
        ):
            assert await status(raw, path, read) == [403], raw
        assert await status(b"/v1/%74okens", "/v1/tokens", admin) == [200]


async def test_unknown_tokens_cost_no_nats_read_once_the_bucket_is_followed(
    served: Served, engine: fusee.Engine, client: httpx.AsyncClient
) -> None:
    made = await engine.tokens.create("read")
    # a token it knows: the API starts following the bucket and loads every entry
    assert (await client.get("/v1/limits", headers=bearer(made.token))).status_code == 200
    bucket = f"KV_{served.namespace}_auth"
    nc = await nats.connect(served.nats)
    reads = 0

    async def count(msg: Any) -> None:
        nonlocal reads
        reads += 1

    try:
        # every way nats-py reads a key: Direct Get (both forms), a stream's message get
        for subject in (f"$JS.API.DIRECT.GET.{bucket}", f"$JS.API.DIRECT.GET.{bucket}.>"):
            await nc.subscribe(subject, cb=count)
        await nc.subscribe(f"$JS.API.STREAM.MSG.GET.{bucket}", cb=count)
        await nc.flush()
        statuses: list[int] = []

        async def unknown() -> None:
            fake = f"fusee_{secrets.token_hex(6)}_" + "A" * 43
            statuses.append((await client.get("/v1/limits", headers=bearer(fake))).status_code)

        async with anyio.create_task_group() as tg:  # (each refusal takes REFUSE_AFTER)
            for _ in range(50):
                tg.start_soon(unknown)
        assert statuses == [401] * 50
        # a token made after the load is known from the watch, and a revoke lands there
        late = await engine.tokens.create("read")

        async def known() -> bool:
            r = await client.get("/v1/limits", headers=bearer(late.token))
            return r.status_code == 200

        await wait_until(known, timeout=5, what="the API to see the new token")
        await nc.flush()
    finally:
        await nc.close()
    assert reads == 0, f"the API read the bucket {reads} times"


async def test_a_check_never_makes_the_bucket(nats_server: Any) -> None:
    namespace = f"t{secrets.token_hex(4)}"
    async with await fusee.connect(nats_server.url, namespace=namespace) as engine:
        fake = f"fusee_{secrets.token_hex(6)}_" + "A" * 43
        with pytest.raises(fusee.Unauthorized):
            await engine.tokens.verify(fake)
        assert await engine.tokens.list() == []
        with pytest.raises(fusee.UnknownToken):
            await engine.tokens.revoke("0" * 12)
    nc = await nats.connect(nats_server.url)
    try:
        with pytest.raises(nats.js.errors.BucketNotFoundError):
            await nc.jetstream().key_value(f"{namespace}_auth")
    finally:
        await nc.close()


async def test_a_completion_token_never_reaches_a_log_line(
    served: Served, client: httpx.AsyncClient
) -> None:
    """Every log line that carries a path cuts a completion URL's token out."""
    from fusee.adapters.http.redact import redacted

    secret = secrets.token_urlsafe(24)
    assert redacted(f"/v1/completions/{secret}") == "/v1/completions/***"
    assert redacted(f"/v1//completions/{secret}/x") == "/v1//completions/***/x"
    # a completion path that needs a token (a method the route has no rule for): refused,
    # and logged without its token
    r = await client.delete(f"/v1/completions/{secret}")
    assert r.status_code == 401
    log = (served.tmp / "api.log").read_text(errors="replace")
    assert "/v1/completions/***" in log
    assert secret not in log


async def test_a_token_made_elsewhere_works_at_once_and_refusals_take_one_time(
    served: Served, engine: fusee.Engine, client: httpx.AsyncClient
) -> None:
    """The API answers from its watch of the bucket: a token made a moment ago by
    another process is waited for (up to REFUSE_AFTER), not refused; and a refusal takes
    that long whether its ID names a token or not."""
    from fusee._tokens import REFUSE_AFTER

    warm = await engine.tokens.create("read")
    assert (await client.get("/v1/limits", headers=bearer(warm.token))).status_code == 200
    for _ in range(5):
        made = await engine.tokens.create("read")
        assert (await client.get("/v1/limits", headers=bearer(made.token))).status_code == 200
    other = secrets.token_urlsafe(32)
    for token in (f"fusee_{warm.id}_{other}", f"fusee_{secrets.token_hex(6)}_{other}"):
        start = anyio.current_time()
        assert (await client.get("/v1/limits", headers=bearer(token))).status_code == 401
        assert anyio.current_time() - start >= REFUSE_AFTER


async def _raw(base: str, method: str, target: str, headers: dict[str, str]) -> tuple[int, str]:
    host, port = base.removeprefix("http://").split(":")
    async with await anyio.connect_tcp(host, int(port)) as s:
        head = f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        body = "{}" if method in ("POST", "PUT") else ""
        head += f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n\r\n{body}"
        await s.send(head.encode())
        out = b""
        with anyio.move_on_after(5):
            try:
                while chunk := await s.receive():
                    out += chunk
            except anyio.EndOfStream:
                pass
    status = int(out.split(b" ", 2)[1])
    return status, out.decode(errors="replace")


async def test_path_variants_of_admin_routes_are_refused(
    served: Served, engine: fusee.Engine
) -> None:
    """Raw request targets that normalise to an admin route (trailing slash, //, %74,
    case, HEAD, absolute-form, dot segments) never give a read token or no token a 2xx
    from the real server (a guard for a change of framework). OPTIONS is open (its
    ``Allow`` header only, no body: a browser's CORS preflight carries no token)."""
    read = (await engine.tokens.create("read")).token
    targets = [
        ("POST", "/v1/tokens/"),
        ("POST", "/v1//tokens"),
        ("POST", "/v1/%74okens"),
        ("POST", "/V1/tokens"),
        ("HEAD", "/v1/tokens"),
        ("GET", "/v1/tokens/"),
        ("GET", "/v1/tokens?x=1"),
        ("GET", "/v1/tokens;x"),
        ("GET", "/v1/tokens#x"),
        ("PUT", "/v1/limits/x/"),
        ("PUT", "/v1/limits/%78"),
        ("POST", "/v1/runs/bulk/resume/"),
        ("POST", "/v1/runs/bulk%2Fresume"),
        ("POST", "/v1/runs//bulk/resume"),
        ("GET", "/v1/completions/x/../../tokens"),
        ("GET", "/v1/completions/..%2F..%2Ftokens"),
        ("GET", "http://x/v1/tokens"),
        ("GET", "/./v1/tokens"),
        ("GET", "/v1/tokens/."),
        ("GET", "/v1/tokens%00"),
        ("DELETE", "/v1/tokens/000000000000/"),
        ("PATCH", "/v1/tokens"),
        ("GET", "/v1/tokens\t"),
    ]
    status, text = await _raw(served.base, "OPTIONS", "/v1/tokens", {})
    assert status == 204, text[-300:]
    assert text.endswith("\r\n\r\n"), text[-300:]  # no body
    seen = []
    for method, target in targets:
        for who, headers in (("none", {}), ("read", {"Authorization": f"Bearer {read}"})):
            status, text = await _raw(served.base, method, target, headers)
            seen.append((who, method, target, status))
            assert not (200 <= status < 300), (who, method, target, status, text[-300:])
