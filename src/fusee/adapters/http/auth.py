"""Who may call what: bearer tokens with scopes, checked before a route runs.

``AuthMiddleware(app, verifier, rules)`` is plain ASGI (any framework's app fits). It
finds the rule of the request's method and route template, reads the token from
``Authorization: Bearer <token>`` (or, for a browser's ``EventSource``, a *stream* token
in ``?access_token=``, or, for the web UI, an API token in the ``fusee_ui`` cookie:
see below), and answers ``401 unauthorized`` (no token, or one that is
malformed, unknown, revoked, expired or forged) or ``403 forbidden`` (a scope too low;
a stream token used anywhere but its own stream) without calling the app. A request let
through carries the API token's info in ``scope["state"]["fusee_token"]``.

A request let through lasts no longer than its token: the app runs in a cancel scope
whose deadline is the token's expiry (a stream token's, or its issuer's if sooner) and
that :meth:`fusee.Tokens.on_revoke` cancels when the token (or a stream token's issuer)
is revoked. A response not started yet (a long ``GET /result``) becomes a ``401``; one
under way (an event stream) gets an ``error`` event if it is ``text/event-stream``, and
ends.

The web UI (``/ui``) keeps the API token it was given at its login in an ``HttpOnly``,
``SameSite=Strict`` cookie (:data:`UI_COOKIE`), which the browser sends with the UI's
own requests only. Against cross-site request forgery, a request other than ``GET`` or
``HEAD`` is let in on that cookie only if it also carries ``X-Fusee-UI: 1`` (a header
a cross-site page cannot send without a CORS preflight, which this API never grants);
an ``Authorization`` header, when sent, wins over the cookie.

Scopes: ``read`` < ``write`` < ``admin``. A route without a rule needs ``read`` for
``GET``/``HEAD`` and ``write`` for any other method, so a new route is never open by
mistake; :data:`DEFAULT_RULES` names the exempt routes (``None``) and the admin ones.
The scope a request needs is the strictest of those its path's views need: as sent
(``raw_path``), as ``scope["path"]`` has it, and each with doubled slashes, dot
segments and a trailing slash taken out. So an app that routes on any of them gets no
request that a weaker token was let through for. In fusee's own stack the raw-path
layer runs first (``app.py``: IDs hold ``%2F``), so both views are the raw path, which
is also what the router matches: ``/v1/%74okens`` is no route there (404).
"""

from __future__ import annotations

import posixpath
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import parse_qs, unquote

import anyio
import msgspec

from fusee import Tokens
from fusee.adapters.http.errors import code_of, request_id_of, status_of
from fusee.adapters.http.redact import redacted
from fusee.errors import FuseeError, Unauthorized
from fusee.logs import get_logger

__all__ = (
    "AuthMiddleware",
    "DEFAULT_RULES",
    "STREAM_ROUTE",
    "UI_COOKIE",
    "UI_HEADER",
    "Rules",
    "RequiredScope",
    "cookie_token",
)

log = get_logger()

RequiredScope = Literal["read", "write", "admin"] | None  # None: no token needed
Rules = Mapping[tuple[str, str], RequiredScope]

_ORDER = ("read", "write", "admin")

STREAM_ROUTE = "/v1/runs/{run_id}/streams/{name}"
"""The one route a stream token opens (``GET``), for its own run and stream."""

UI_COOKIE = "fusee_ui"
"""The cookie the web UI's login sets: the API token, ``HttpOnly; SameSite=Strict``."""
UI_HEADER = "X-Fusee-UI"
"""The header (value ``1``) the UI sends with every request that changes something."""

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
    # the web UI's page and files (no data in them), its login and logout (they check
    # the token themselves), and what its session is
    ("GET", "/ui"): None,
    ("GET", "/ui/static/{file}"): None,
    ("GET", "/ui/session"): None,
    ("POST", "/ui/login"): None,
    ("POST", "/ui/logout"): None,
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
        views = _views(scope)
        # OPTIONS is open: its Allow header tells nothing the document does not, and a
        # browser's CORS preflight never carries a token
        needed = None if method == "OPTIONS" else self._needed(method, views)
        if needed is None:
            await self.app(scope, receive, send)
            return
        try:
            verdict = await self._check(scope, method, views, needed)
        except FuseeError as exc:  # NATS did not answer, the API's NATS user may not read
            log.warning("http.auth_unavailable", error=f"{type(exc).__name__}: {exc}")
            verdict = _Refusal(
                status_of(exc), code_of(exc), f"cannot check the token: {type(exc).__name__}"
            )
        if isinstance(verdict, _Refusal):
            await _refuse(scope, send, verdict)
            return
        await self._serve(scope, receive, send, verdict)

    def _needed(self, method: str, views: list[str]) -> RequiredScope:
        """The strictest scope any view of the path needs."""
        strictest: RequiredScope = None
        for path in views:
            needed = self._needed_for(method, path)
            if needed is not None and (
                strictest is None or _ORDER.index(needed) > _ORDER.index(strictest)
            ):
                strictest = needed
        return strictest

    def _needed_for(self, method: str, path: str) -> RequiredScope:
        lookup = "GET" if method == "HEAD" else method
        for rule_method, _template, pattern, needed in self._rules:
            if rule_method == lookup and pattern.match(path):
                return needed
        return "read" if lookup == "GET" else "write"

    async def _check(
        self, scope: Any, method: str, views: list[str], needed: str
    ) -> _Refusal | _Grant:
        token, source = _token_of(scope)
        from_query = source == "query"
        if source == "cookie" and method not in ("GET", "HEAD") and not _has_ui_header(scope):
            return _Refusal(
                403,
                "forbidden",
                f"the UI's cookie is taken for {method} only with the header {UI_HEADER}: 1 "
                "(a guard against cross-site requests)",
            )
        if token is None:
            return _Refusal(
                401, "unauthorized", "this route needs a token: Authorization: Bearer <token>"
            )
        try:
            if self.verifier.is_stream_token(token):
                access = await self.verifier.verify_stream(token)
                if method not in ("GET", "HEAD") or not all(
                    self._names_stream(path, access.run_id, access.stream) for path in views
                ):
                    return _Refusal(
                        403,
                        "forbidden",
                        "a stream token reads only the stream it was made for "
                        f"(run {access.run_id!r}, stream {access.stream!r})",
                    )
                return _Grant(access.issuer, access.expires_at)
            if from_query:
                return _Refusal(
                    401,
                    "unauthorized",
                    "?access_token= takes a stream token only (POST "
                    "/v1/runs/{run_id}/streams/{name}/token); send an API token in the "
                    "Authorization header",
                )
            info = await self.verifier.verify(token)
        except Unauthorized as exc:
            return _Refusal(401, "unauthorized", str(exc))
        if _ORDER.index(info.scope) < _ORDER.index(needed):
            return _Refusal(
                403,
                "forbidden",
                f"{method} {redacted(views[0])} needs a token of scope {needed!r}; "
                f"this one ({info.id}) is {info.scope!r}",
            )
        scope.setdefault("state", {})["fusee_token"] = info
        return _Grant(info.id, info.expires_at)

    def _names_stream(self, path: str, run_id: str, stream: str) -> bool:
        m = self._stream.match(path)
        return m is not None and unquote(m["run_id"]) == run_id and unquote(m["name"]) == stream

    async def _serve(self, scope: Any, receive: Any, send: Any, grant: _Grant) -> None:
        """Run the app for as long as the token lets it: until it expires or is revoked."""
        response = _Response(send)
        ended: list[str] = []
        deadline = float("inf")
        if grant.expires_at is not None:
            left = grant.expires_at.timestamp() - time.time()
            deadline = anyio.current_time() + left
        with anyio.CancelScope(deadline=deadline) as bound:

            def revoked() -> None:
                ended.append("was revoked")
                bound.cancel()

            stop: Callable[[], None] | None = None
            if grant.token_id is not None:
                stop = self.verifier.on_revoke(grant.token_id, revoked)
            try:
                await self.app(scope, receive, response.send)
            finally:
                if stop is not None:
                    stop()
        if not bound.cancelled_caught or response.ended:
            return
        why = ended[0] if ended else "expired"
        message = f"the token {why} while the request was open"
        log.info(
            "http.token_ended",
            why=why,
            path=redacted(scope.get("path")),
            request_id=_request_id(scope),
            streaming=response.started,
        )
        with anyio.CancelScope(shield=True):
            if not response.started:
                await _refuse(scope, send, _Refusal(401, "unauthorized", message), logged=True)
            elif scope["type"] == "http":
                body = b""
                if response.event_stream:
                    error = {"code": "unauthorized", "message": message}
                    error["request_id"] = _request_id(scope)
                    body = b"event: error\ndata: " + msgspec.json.encode({"error": error})
                    body += b"\n\n"
                await send({"type": "http.response.body", "body": body, "more_body": False})
            else:
                await send({"type": "websocket.close", "code": 4401})


@dataclass(frozen=True)
class _Refusal:
    status: int
    code: str
    message: str


@dataclass(frozen=True)
class _Grant:
    """A request let through: the token whose revoke ends it, and when it expires."""

    token_id: str | None
    expires_at: datetime | None


class _Response:
    """The app's ``send``, noting how far its response got."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self.started = False
        self.ended = False
        self.event_stream = False

    async def send(self, message: Any) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.started = True
            for name, value in message.get("headers", ()):
                if name.lower() == b"content-type" and value.startswith(b"text/event-stream"):
                    self.event_stream = True
        elif kind == "websocket.accept":
            self.started = True
        elif (kind == "http.response.body" and not message.get("more_body")) or (
            kind == "websocket.close"
        ):
            self.ended = True
        await self._send(message)


def _normalised(path: str) -> str:
    """``path`` with doubled slashes, dot segments and a trailing slash taken out."""
    out = posixpath.normpath(re.sub(r"/+", "/", path))
    return "/" if out in (".", "//") else out


def _views(scope: Any) -> list[str]:
    """The path as sent and as the server decoded it (query and fragment cut), each as
    it is and normalised: each is a path some app routes on. The first is as sent."""
    raw = scope.get("raw_path")
    decoded = str(scope.get("path", "/"))
    sent = raw.decode("latin-1") if isinstance(raw, bytes) else decoded
    sent = sent.split("?", 1)[0].split("#", 1)[0]
    views = [sent]
    for view in (decoded, _normalised(sent), _normalised(decoded)):
        if view not in views:
            views.append(view)
    return views


def _token_of(scope: Any) -> tuple[str | None, str]:
    """The request's token and where it came from: ``header``, ``query``, ``cookie``."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            kind, _, token = value.decode("latin-1").strip().partition(" ")
            if kind.lower() == "bearer" and token.strip():
                return token.strip(), "header"
            break  # another scheme (a proxy's Basic): a stream token may be in the query
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    given = query.get("access_token")
    if given and given[0]:
        return given[0], "query"
    cookie = cookie_token(scope)
    if cookie is not None:
        return cookie, "cookie"
    return None, "header"


def cookie_token(scope: Any) -> str | None:
    """The API token in the UI's cookie (:data:`UI_COOKIE`), if the request has one."""
    # each ``name=value`` pair on its own: another app's cookie on this host (cookies
    # are shared across ports) holding a quote, a space or a backslash must not hide
    # ours (http.cookies.SimpleCookie drops the whole header then)
    for name, value in scope.get("headers", ()):
        if name != b"cookie":
            continue
        header: str = value.decode("latin-1")
        for pair in header.split(";"):
            key, eq, given = pair.strip().partition("=")
            if eq and key == UI_COOKIE and given:
                return given.strip('"')
    return None


def _has_ui_header(scope: Any) -> bool:
    wanted = UI_HEADER.lower().encode()
    return any(name == wanted and value == b"1" for name, value in scope.get("headers", ()))


def _request_id(scope: Any) -> str:
    """The ID the request-ID layer gave the request (``X-Request-ID``), else one of its own."""
    given = request_id_of(scope)
    if given:
        return given
    state = scope.get("state") or {}
    if isinstance(state.get("request_id"), str):
        return str(state["request_id"])
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id" and value:
            return str(value.decode("latin-1"))[:128]
    return secrets.token_hex(8)


async def _refuse(scope: Any, send: Any, refusal: _Refusal, *, logged: bool = False) -> None:
    status, code, message = refusal.status, refusal.code, refusal.message
    request_id = _request_id(scope)
    if status != 503 and not logged:
        # the route (a completion token cut out), never the token; the scope message
        # names the token's ID only
        path = redacted(scope.get("path"))
        log.info("http.refused", status=status, code=code, path=path, request_id=request_id)
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
