"""Who may call what: bearer tokens with scopes, checked before a route runs.

``AuthMiddleware(app, verifier, rules)`` is plain ASGI (any framework's app fits). It
finds the rule of the request's method and route template, reads the token from
``Authorization: Bearer <token>`` (or, for a browser's ``EventSource``, a *stream* token
in ``?access_token=``), and answers ``401 unauthorized`` (no token, or one that is
malformed, unknown, revoked, expired or forged) or ``403 forbidden`` (a scope too low;
a stream token used anywhere but its own stream) without calling the app. A request let
through carries the API token's info in ``scope["state"]["fusee_token"]``.

Scopes: ``read`` < ``write`` < ``admin``. A route without a rule needs ``read`` for
``GET``/``HEAD`` and ``write`` for any other method, so a new route is never open by
mistake; :data:`DEFAULT_RULES` names the exempt routes (``None``) and the admin ones.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import parse_qs, unquote

import msgspec

from fusee import Tokens
from fusee.errors import ConnectionLost, Unauthorized
from fusee.logs import get_logger

__all__ = ("AuthMiddleware", "DEFAULT_RULES", "STREAM_ROUTE", "Rules", "RequiredScope")

log = get_logger()

RequiredScope = Literal["read", "write", "admin"] | None  # None: no token needed
Rules = Mapping[tuple[str, str], RequiredScope]

_ORDER = ("read", "write", "admin")

STREAM_ROUTE = "/v1/runs/{run_id}/streams/{name}"
"""The one route a stream token opens (``GET``), for its own run and stream."""

DEFAULT_RULES: dict[tuple[str, str], RequiredScope] = {
    # about the API itself
    ("GET", "/healthz"): None,
    ("GET", "/openapi.json"): None,
    # a completion's signed token is its authentication (the URL goes to a human)
    ("GET", "/v1/completions/{token}"): None,
    ("POST", "/v1/completions/{token}"): None,
    # operator actions: many runs at once, limits every worker obeys, credentials
    ("PUT", "/v1/limits/{name}"): "admin",
    ("POST", "/v1/runs/bulk/resume"): "admin",
    ("POST", "/v1/runs/bulk/cancel"): "admin",
    ("GET", "/v1/tokens"): "admin",
    ("POST", "/v1/tokens"): "admin",
    ("DELETE", "/v1/tokens/{token_id}"): "admin",
    # minting a stream token reads: it gives no more than the stream itself
    ("POST", "/v1/runs/{run_id}/streams/{name}/token"): "read",
}

_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


def _compile(template: str) -> re.Pattern[str]:
    out, last = [], 0
    for m in _PARAM.finditer(template):
        out += [re.escape(template[last : m.start()]), f"(?P<{m.group(1)}>[^/]+)"]
        last = m.end()
    out.append(re.escape(template[last:]))
    return re.compile("".join(out) + r"\Z")


class AuthMiddleware:
    """Refuse requests without a token good enough for their route (401/403).

    Args:
        app: the ASGI app to protect.
        verifier: the namespace's tokens (``engine.tokens``).
        rules: ``(method, route template) -> scope`` (``None``: no token needed); a
            template's parameters are ``{name}`` or ``{name:convertor}``, one path
            segment each. Routes without a rule need ``read`` (``GET``, ``HEAD``) or
            ``write``.

    Example:
        ``app = AuthMiddleware(app, engine.tokens, DEFAULT_RULES)``
    """

    def __init__(self, app: Any, verifier: Tokens, rules: Rules = DEFAULT_RULES) -> None:
        self.app = app
        self.verifier = verifier
        # literal templates first: /v1/runs/bulk/resume is not run "bulk"'s resume
        ordered = sorted(rules.items(), key=lambda kv: ("{" in kv[0][1], kv[0][1]))
        self._rules = [(m.upper(), t, _compile(t), s) for (m, t), s in ordered]
        self._stream = _compile(STREAM_ROUTE)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "GET").upper()
        raw = scope.get("raw_path")
        path = raw.decode("latin-1") if isinstance(raw, bytes) else scope["path"]
        path = path.split("?", 1)[0]
        needed = self._needed(method, path)
        if needed is None:
            await self.app(scope, receive, send)
            return
        try:
            refusal = await self._check(scope, method, path, needed)
        except ConnectionLost:
            refusal = (503, "unavailable", "cannot check the token: NATS does not answer")
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await _refuse(scope, send, *refusal)

    def _needed(self, method: str, path: str) -> RequiredScope:
        lookup = "GET" if method == "HEAD" else method
        for rule_method, _template, pattern, needed in self._rules:
            if rule_method == lookup and pattern.match(path):
                return needed
        return "read" if lookup == "GET" else "write"

    async def _check(
        self, scope: Any, method: str, path: str, needed: str
    ) -> tuple[int, str, str] | None:
        token, from_query = _token_of(scope)
        if token is None:
            return 401, "unauthorized", "this route needs a token: Authorization: Bearer <token>"
        try:
            if self.verifier.is_stream_token(token):
                access = await self.verifier.verify_stream(token)
                m = self._stream.match(path)
                if (
                    method not in ("GET", "HEAD")
                    or m is None
                    or unquote(m["run_id"]) != access.run_id
                    or unquote(m["name"]) != access.stream
                ):
                    return (
                        403,
                        "forbidden",
                        (
                            "a stream token reads only the stream it was made for "
                            f"(run {access.run_id!r}, stream {access.stream!r})"
                        ),
                    )
                return None
            if from_query:
                return (
                    401,
                    "unauthorized",
                    (
                        "?access_token= takes a stream token only (POST "
                        "/v1/runs/{run_id}/streams/{name}/token); send an API token in the "
                        "Authorization header"
                    ),
                )
            info = await self.verifier.verify(token)
        except Unauthorized as exc:
            return 401, "unauthorized", str(exc)
        if _ORDER.index(info.scope) < _ORDER.index(needed):
            return (
                403,
                "forbidden",
                (
                    f"{method} {path.split('?')[0]} needs a token of scope {needed!r}; "
                    f"this one ({info.id}) is {info.scope!r}"
                ),
            )
        scope.setdefault("state", {})["fusee_token"] = info
        return None


def _token_of(scope: Any) -> tuple[str | None, bool]:
    """The request's token and whether it came from the query string."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            kind, _, token = value.decode("latin-1").strip().partition(" ")
            if kind.lower() == "bearer" and token.strip():
                return token.strip(), False
            return None, False
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    given = query.get("access_token")
    if given and given[0]:
        return given[0], True
    return None, False


def _request_id(scope: Any) -> str:
    state = scope.get("state") or {}
    if isinstance(state.get("request_id"), str):
        return str(state["request_id"])
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id" and value:
            return str(value.decode("latin-1"))[:128]
    return secrets.token_hex(8)


async def _refuse(scope: Any, send: Any, status: int, code: str, message: str) -> None:
    request_id = _request_id(scope)
    if status != 503:
        # the route, never the token; the scope message names the token's ID only
        log.info(
            "http.refused", status=status, code=code, path=scope.get("path"), request_id=request_id
        )
    body = msgspec.json.encode(
        {"error": {"code": code, "message": message, "request_id": request_id}}
    )
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode("latin-1")),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="fusee"'))
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 4401 if status == 401 else 4403})
        return
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
