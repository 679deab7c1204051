"""What the review of the auth layer on the Litestar API found (rev-authport), kept:
OPTIONS needs no token, the document declares the stream token and the auth layer's
503, a token check without NATS answers the error table's code, and the auth sweeps
cover every documented method."""

from __future__ import annotations

from typing import Any

import httpx

import fusee
from fusee.adapters.http.auth import AuthMiddleware
from fusee.adapters.http.errors import ERROR_CODES, HTTP_CODES
from fusee.errors import ConnectionLost
from tests.e2e.test_auth import (  # noqa: F401  (fixtures)
    bearer,
    client,
    engine,
    operations,
    served,
)

STREAM_ROUTE = "/v1/runs/{run_id}/streams/{name}"


async def test_options_follows_the_route_s_own_scope(
    client: httpx.AsyncClient,  # noqa: F811
    engine: fusee.Engine,  # noqa: F811
) -> None:
    """OPTIONS is answered by AllowedMethods inside the auth layer, and OPTIONS has no
    rule, so it falls to the default "write": /healthz (open) answers 401, a read
    token gets 403 on OPTIONS of a read-only route, while a write token gets the Allow
    of an admin-only route (/v1/tokens)."""
    read = (await engine.tokens.create("read", name="rev-options")).token
    r = await client.options("/healthz")
    assert r.status_code == 204, (r.status_code, r.text)  # today: 401
    r = await client.options("/v1/runs", headers=bearer(read))
    assert r.status_code == 204, (r.status_code, r.text)  # today: 403 needs 'write'


async def test_the_document_declares_access_token_on_the_stream_route(
    client: httpx.AsyncClient,  # noqa: F811
) -> None:
    """The contract: SSE from a browser uses ?access_token=<stream token>. The document
    neither lists the query parameter nor a security scheme for it, so a generated
    client (or schemathesis) can never use the stream token."""
    doc = (await client.get("/openapi.json")).json()
    op = doc["paths"][STREAM_ROUTE]["get"]
    names = {p["name"] for p in op.get("parameters", [])}
    schemes = doc["components"]["securitySchemes"]
    in_query = [
        n for n, s in schemes.items() if s.get("type") == "apiKey" and s.get("in") == "query"
    ]
    assert "access_token" in names or in_query, (names, schemes)


async def test_the_document_lists_the_auth_layers_503(
    client: httpx.AsyncClient,  # noqa: F811
) -> None:
    """AuthMiddleware answers 503 when it cannot check a token (NATS down); no
    operation that needs a token documents a 503 (GET /v1/runs, for one)."""
    doc = (await client.get("/openapi.json")).json()
    assert "503" in doc["paths"]["/v1/runs"]["get"]["responses"]


class _Down:
    """engine.tokens while NATS does not answer (what Tokens.verify raises then)."""

    @staticmethod
    def is_stream_token(token: str) -> bool:
        return False

    async def verify(self, token: str) -> Any:
        raise ConnectionLost("nats: no servers available")


async def test_a_token_check_without_nats_answers_the_table_s_code() -> None:
    """The auth layer's 503 code is "unavailable": in neither HTTP_CODES (503:
    service_unavailable) nor ERROR_CODES (ConnectionLost: connection_lost), which is what
    the app answers for the same NATS outage one layer in. A client branching on the
    code sees two codes for one condition (and "unavailable" is in no table)."""
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not reached")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    mw = AuthMiddleware(app, _Down())  # type: ignore[arg-type]
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/runs",
        "raw_path": b"/v1/runs",
        "headers": [(b"authorization", b"Bearer fusee_0123456789ab_" + b"A" * 43)],
        "query_string": b"",
    }
    await mw(scope, receive, send)
    assert sent[0]["status"] == 503
    import msgspec

    code = msgspec.json.decode(sent[1]["body"])["error"]["code"]
    known = {c for _, c in ERROR_CODES.values()} | set(HTTP_CODES.values())
    assert code in known, code
    assert code == ERROR_CODES["ConnectionLost"][1], code


async def test_the_auth_tests_cover_every_documented_method(
    client: httpx.AsyncClient,  # noqa: F811
) -> None:
    """tests/e2e/test_auth.py's operations() keeps get/post/put/delete only, so
    PATCH /v1/objects/{object_type}/{key}/state is in none of its 401/403 sweeps: a rule
    ("PATCH", ...): None (or "read") would pass every auth test."""
    doc = (await client.get("/openapi.json")).json()
    documented = {(m, t) for t, item in doc["paths"].items() for m in item if m != "parameters"}
    swept = {(m, t) for m, t, _ in await operations(client)}
    assert documented <= swept, sorted(documented - swept)
