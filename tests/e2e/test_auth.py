"""API tokens against a real ``fusee api`` process (auth on, its default) and a worker:
every route refuses a request without a token, scopes are enforced, expired, revoked and
forged tokens are refused, a stream token reads its one stream and nothing else, tokens
never reach a log or the journal stream, and ``fusee tokens`` drives it all."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

import fusee
from fusee.adapters.http.auth import DEFAULT_RULES
from fusee.runtime.api_tokens import parse_token
from tests.helpers import run_cli
from tests.workers.procs import HERE, WorkerProc, api_server, wait_until

OPEN = {("get", "/healthz"), ("get", "/openapi.json"), ("get", "/v1/completions/{token}")}
OPEN |= {("post", "/v1/completions/{token}")}
STREAM = "model-0"  # the stream of tests/workers/tokens.py's tok_slow


class Served:
    def __init__(self, base: str, nats: str, namespace: str, api: WorkerProc, tmp: Path) -> None:
        self.base, self.nats, self.namespace, self.api, self.tmp = base, nats, namespace, api, tmp
        self.conn = ("--nats", nats, "--namespace", namespace)


@pytest.fixture(scope="module")
def served(nats_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from tests.workers.procs import Workers, started

    tmp = tmp_path_factory.mktemp("auth")
    namespace = f"t{secrets.token_hex(4)}"
    workers = Workers(nats_server.url, namespace, tmp, module=HERE / "tokens.py")
    with api_server(nats_server.url, namespace, tmp, auth=True) as server:
        try:
            worker = workers.spawn()
            serving = started(server, "api.serving")
            started(worker, "worker.started")
            yield Served(str(serving["url"]), nats_server.url, namespace, server, tmp)
        finally:
            workers.cleanup()


@pytest.fixture
async def engine(served: Served) -> AsyncIterator[fusee.Engine]:
    async with await fusee.connect(served.nats, namespace=served.namespace) as e:
        yield e


@pytest.fixture
async def client(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.base, timeout=20.0) as c:
        yield c


def secret_of(token: str) -> str:
    """The secret part of an API token (base64url: it may hold ``_`` itself)."""
    return parse_token(token).secret


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def refused(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, (r.request.method, r.request.url, r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"] == code
    assert error["request_id"] == r.headers["x-request-id"]
    if status == 401:
        assert r.headers["www-authenticate"].startswith("Bearer")
    return str(error["message"])


async def operations(client: httpx.AsyncClient) -> list[tuple[str, str, str]]:
    """``(method, template, a concrete path)`` of every documented operation."""
    doc = (await client.get("/openapi.json")).json()
    out = []
    for template, item in doc["paths"].items():
        path = re.sub(r"\{\w+\}", "nosuch", template)
        out += [(m, template, path) for m in item if m in ("get", "post", "put", "patch", "delete")]
    assert len(out) > 20, out
    return out


def needed(method: str, template: str) -> str | None:
    if (method, template) in OPEN:
        return None
    rule = DEFAULT_RULES.get((method.upper(), template), "missing")
    if rule != "missing":
        return rule
    return "read" if method == "get" else "write"


async def test_every_route_needs_a_token_but_the_open_ones(client: httpx.AsyncClient) -> None:
    for method, template, path in await operations(client):
        r = await client.request(method, path)
        if (method, template) in OPEN:
            assert r.status_code != 401, (method, path)
            continue
        refused(r, 401, "unauthorized")
        # a token of the right shape that names nothing, and one of no known shape
        fake = "fusee_0123456789ab_" + "A" * 43
        refused(await client.request(method, path, headers=bearer(fake)), 401, "unauthorized")
        refused(await client.request(method, path, headers=bearer("xyz")), 401, "unauthorized")
    assert (await client.get("/healthz")).status_code == 200


async def test_each_scope_opens_its_routes_and_no_more(
    client: httpx.AsyncClient, engine: fusee.Engine
) -> None:
    tokens = {s: (await engine.tokens.create(s, name=f"scope-{s}")).token for s in fusee_scopes()}
    for method, template, path in await operations(client):
        need = needed(method, template)
        if need is None:
            continue
        for scope, token in tokens.items():
            enough = fusee_scopes().index(scope) >= fusee_scopes().index(need)
            if not enough:
                message = refused(
                    await client.request(method, path, headers=bearer(token)), 403, "forbidden"
                )
                assert need in message
            elif need != "admin":  # admin operations on nothing real: left to the next test
                # (a call of no object type waits for its timeout: a short one)
                r = await client.request(
                    method, path, headers=bearer(token), params={"timeout": "100ms"}
                )
                assert r.status_code not in (401, 403), (scope, method, path, r.text)
    admin = bearer(tokens["admin"])
    assert (await client.get("/v1/tokens", headers=admin)).status_code == 200
    assert (await client.put("/v1/limits/auth-l", json={"concurrent": 2}, headers=admin)).is_success
    r = await client.delete("/v1/tokens/000000000000", headers=admin)
    assert r.status_code == 404


def fusee_scopes() -> tuple[str, ...]:
    return ("read", "write", "admin")


async def test_expired_revoked_and_forged_tokens_are_refused(
    client: httpx.AsyncClient, engine: fusee.Engine, served: Served
) -> None:
    short = await engine.tokens.create("read", ttl="300ms")

    async def expired() -> bool:
        r = await client.get("/v1/limits", headers=bearer(short.token))
        return r.status_code == 401 and "expired" in r.json()["error"]["message"]

    await wait_until(expired, timeout=10, what="the 300 ms token to expire")

    made = await engine.tokens.create("read", name="to-revoke")
    assert (await client.get("/v1/limits", headers=bearer(made.token))).status_code == 200
    # revoked by another process, while the API holds the token in its cache (10 s): the
    # watch of the bucket makes the API refuse it within milliseconds, not 10 s
    done = await run_cli("tokens", "revoke", made.id, *served.conn)
    assert done.returncode == 0, done.stderr

    async def revoked() -> bool:
        r = await client.get("/v1/limits", headers=bearer(made.token))
        return r.status_code == 401

    await wait_until(revoked, timeout=3, what="the API to refuse the revoked token", interval=0.01)
    message = refused(
        await client.get("/v1/limits", headers=bearer(made.token)), 401, "unauthorized"
    )
    assert "revoked" in message

    good = await engine.tokens.create("admin")
    other = secrets.token_urlsafe(32)
    forged = f"fusee_{good.id}_{other}"
    assert len(forged) == len(good.token)
    assert forged != good.token
    message = refused(await client.get("/v1/limits", headers=bearer(forged)), 401, "unauthorized")
    # the same refusal as an ID that names nothing: which IDs exist is not told
    fake = f"fusee_{secrets.token_hex(6)}_{other}"
    assert refused(await client.get("/v1/limits", headers=bearer(fake)), 401, "unauthorized") == (
        message
    )
    assert (await client.get("/v1/limits", headers=bearer(good.token))).status_code == 200
    # a token of another namespace names nothing here
    async with await fusee.connect(served.nats, namespace=f"t{secrets.token_hex(4)}") as elsewhere:
        theirs = await elsewhere.tokens.create("admin")
    refused(await client.get("/v1/limits", headers=bearer(theirs.token)), 401, "unauthorized")


async def _finished_run(engine: fusee.Engine, tmp: Path) -> str:
    run = f"auth-{secrets.token_hex(3)}"
    arg = {"tokens": 3, "delay": 0, "prefill": False, "log": str(tmp / f"{run}.log")}
    await engine.start("tok_slow", run, arg)
    await engine.run(run).result(timeout="20s")
    return run


async def test_a_stream_token_reads_its_stream_and_nothing_else(
    client: httpx.AsyncClient, engine: fusee.Engine, served: Served
) -> None:
    mine, other = await _finished_run(engine, served.tmp), await _finished_run(engine, served.tmp)
    reader = await engine.tokens.create("read", name="browser-backend")
    r = await client.post(
        f"/v1/runs/{mine}/streams/{STREAM}/token", json={"ttl": "2m"}, headers=bearer(reader.token)
    )
    assert r.status_code == 201, r.text
    access = r.json()["access_token"]
    assert access.startswith("fusees_")

    r = await client.get(f"/v1/runs/{mine}/streams/{STREAM}", params={"access_token": access})
    assert r.status_code == 200, r.text
    assert "w0 " in r.text
    assert "w2 " in r.text
    # the same stream name of another run, another stream of its run, any other route
    for path in (
        f"/v1/runs/{other}/streams/{STREAM}",
        f"/v1/runs/{mine}/streams/other",
        f"/v1/runs/{mine}",
        f"/v1/runs/{mine}/result",
        "/v1/runs",
        "/v1/limits",
    ):
        refused(await client.get(path, params={"access_token": access}), 403, "forbidden")
        refused(await client.get(path, headers=bearer(access)), 403, "forbidden")
    refused(await client.post(f"/v1/runs/{mine}/cancel", headers=bearer(access)), 403, "forbidden")
    # an API token does not go in a URL
    message = refused(
        await client.get(
            f"/v1/runs/{mine}/streams/{STREAM}", params={"access_token": reader.token}
        ),
        401,
        "unauthorized",
    )
    assert "stream token" in message
    # forged: another run in a token signed for this one, a flipped MAC
    parts = access.split(".")
    swapped = ".".join([parts[0].replace(parts[0][7:], _b64(other)), *parts[1:]])
    flipped = access[:-2] + ("A" if access[-2] != "A" else "B") + access[-1]
    for bad in (swapped, flipped):
        refused(
            await client.get(f"/v1/runs/{other}/streams/{STREAM}", params={"access_token": bad}),
            401,
            "unauthorized",
        )
    # an expired one (made in the library, 1 s)
    brief = engine.tokens.stream_token(mine, STREAM, ttl="1s")

    async def brief_expired() -> bool:
        r = await client.get(f"/v1/runs/{mine}/streams/{STREAM}", params={"access_token": brief})
        return r.status_code == 401

    await wait_until(brief_expired, timeout=10, what="the stream token to expire")
    # revoking the API token that asked for it ends it too
    await engine.tokens.revoke(reader.id)

    async def ended() -> bool:
        r = await client.get(f"/v1/runs/{mine}/streams/{STREAM}", params={"access_token": access})
        return r.status_code == 401

    await wait_until(ended, timeout=3, what="the stream token to die with its issuer")
    r = await client.post(
        "/v1/runs/nosuch/streams/x/token",
        headers=bearer((await engine.tokens.create("read")).token),
    )
    assert r.status_code == 404


def _b64(text: str) -> str:
    import base64

    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


async def test_fusee_tokens_cli_and_no_token_in_any_log_or_journal(
    client: httpx.AsyncClient, engine: fusee.Engine, served: Served
) -> None:
    made = await run_cli(
        "tokens",
        "create",
        "--scope",
        "write",
        "--name",
        "ci",
        "--ttl",
        "30d",
        "--json",
        *served.conn,
    )
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    assert set(created) == {"token", "id", "scope", "expires_at"}
    assert created["scope"] == "write"
    assert created["expires_at"].endswith("Z")
    token = created["token"]
    plain = await run_cli("tokens", "create", "--scope", "read", *served.conn)
    assert plain.returncode == 0, plain.stderr
    read_token = plain.stdout.strip()
    assert read_token.startswith("fusee_")
    assert "\n" not in read_token
    assert "shown only this once" in plain.stderr

    # used: a start through the token's scope, a read, a refused admin call
    run = f"auth-cli-{secrets.token_hex(3)}"
    arg = {"tokens": 2, "delay": 0, "prefill": False, "log": str(served.tmp / f"{run}.log")}
    await engine.start("tok_slow", run, arg)
    assert (await client.get(f"/v1/runs/{run}/result", headers=bearer(token))).status_code == 200
    assert (await client.get("/v1/limits", headers=bearer(read_token))).status_code == 200
    refused(await client.get("/v1/tokens", headers=bearer(token)), 403, "forbidden")
    admin = await engine.tokens.create("admin")
    r = await client.post(
        "/v1/tokens", json={"scope": "read", "name": "http"}, headers=bearer(admin.token)
    )
    assert r.status_code == 201
    http_made = r.json()

    listed = await run_cli("tokens", "ls", "--json", *served.conn)
    assert listed.returncode == 0, listed.stderr
    infos = {i["id"]: i for i in json.loads(listed.stdout)}
    assert infos[created["id"]]["name"] == "ci"
    assert infos[created["id"]]["scope"] == "write"
    assert http_made["id"] in infos
    table = await run_cli("tokens", "ls", *served.conn)
    assert created["id"] in table.stdout
    assert "ci" in table.stdout
    secrets_made = [token, read_token, admin.token, http_made["token"]]
    for shown in (listed.stdout, table.stdout):
        assert not any(secret_of(t) in shown for t in secrets_made)

    assert (await run_cli("tokens", "revoke", created["id"], *served.conn)).returncode == 0
    again = await run_cli("tokens", "revoke", created["id"], *served.conn)
    assert again.returncode == 3  # not found
    assert "no token" in again.stderr
    bad = await run_cli("tokens", "create", "--scope", "read", "--ttl", "soon", *served.conn)
    assert bad.returncode == 2
    assert "ttl" in bad.stderr
    refused(await client.get("/v1/limits", headers=bearer(token)), 401, "unauthorized")

    # no token's secret in the API's log (refusals included) or the worker's, nor in any
    # message of the namespace's streams
    logs = "".join(p.read_text(errors="replace") for p in served.tmp.glob("*.log"))
    assert "http.refused" in logs
    for t in secrets_made:
        assert secret_of(t) not in logs
    nc = await nats.connect(served.nats)
    try:
        js = nc.jetstream()
        for stream in (served.namespace.upper(), f"{served.namespace.upper()}_TOKENS"):
            info = await js.stream_info(stream)
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                try:
                    msg = await js.get_msg(stream, seq)
                except nats.js.errors.NotFoundError:
                    continue
                data = (msg.data or b"") + repr(msg.headers).encode()
                assert not any(secret_of(t).encode() in data for t in secrets_made)
        # the bucket holds hashes only
        kv = await js.key_value(f"{served.namespace}_auth")
        for key in await kv.keys():
            value = (await kv.get(key)).value or b""
            assert not any(secret_of(t).encode() in value for t in secrets_made)
    finally:
        await nc.close()
