"""The HTTP API as an ASGI app: ``create_app(engine)``.

Starlette, because it is small, typed, and built on anyio like fusee: a streaming
response can own its reader in a task group and be cancelled by a client disconnect.
Bodies are encoded with msgspec. See ``docs/reference/http-api.md``.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from fusee import Engine
from fusee.adapters.http.auth import DEFAULT_RULES, AuthMiddleware
from fusee.adapters.http.errors import (
    HTTP_TYPES,
    ApiError,
    TrackedSend,
    error_response,
    status_of,
)
from fusee.adapters.http.limits import DEFAULT_MAX_BODY, BodyLimit
from fusee.adapters.http.paths import RawPath
from fusee.adapters.http.redact import redacted
from fusee.adapters.http.routes import (
    bulk,
    completions,
    limits,
    meta,
    objects,
    runs,
    streams,
    tokens,
)
from fusee.adapters.http.state import ApiState
from fusee.errors import FuseeError
from fusee.logs import get_logger

__all__ = ("create_app", "api_state_of")

log = get_logger()


def create_app(
    engine: Engine,
    *,
    keepalive: float = 15.0,
    max_body: int = DEFAULT_MAX_BODY,
    auth: bool = True,
) -> Starlette:
    """The HTTP API on ``engine``, as an ASGI app (serve it with uvicorn).

    The app uses the engine and does not close it: whoever connected it closes it.

    Args:
        engine: a connected engine; every request reads its namespace.
        keepalive: seconds between keep-alive comments of an idle event stream.
        max_body: the largest request body taken, in bytes (larger: ``413``, unread).
        auth: require a bearer token of the route's scope (``engine.tokens``; see
            ``docs/security.md``). ``False`` opens every route to anyone who can reach
            the port: for local development only.

    Example:
        ``uvicorn.run(create_app(await fusee.connect()))``
    """
    routes: list[BaseRoute] = [
        *meta.routes,
        *streams.routes,
        *bulk.routes,
        *runs.routes,
        *objects.routes,
        *completions.routes,
        *limits.routes,
        *tokens.routes,
    ]
    guard = (
        [Middleware(AuthMiddleware, verifier=engine.tokens, rules=DEFAULT_RULES)] if auth else []
    )
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(RawPath),
            Middleware(_LastResort),
            *guard,  # before the body is read: a refused request's body never is
            Middleware(BodyLimit, max_body=max_body),  # inside: its refusal is no bug
        ],
        exception_handlers={
            HTTPException: _http_error,
            ApiError: _api_error,
            FuseeError: _fusee_error,
        },
    )
    app.state.fusee = ApiState(engine=engine, keepalive=keepalive)
    return app


def api_state_of(app: Starlette) -> ApiState:
    """The state of an app made by :func:`create_app` (its engine, its open streams)."""
    state: ApiState = app.state.fusee
    return state


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    if status == 404:
        message = (
            f"no such endpoint: {request.method} {request.scope.get('path', request.url.path)}"
            " (an ID is one path segment: write its '/' as %2F)"
        )
    elif status == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"{request.method} is not allowed on {request.url.path} (allowed: {allowed})"
    else:
        message = exc.detail
    return error_response(status, HTTP_TYPES.get(status, "Error"), message, exc.headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.type, exc.message)


async def _fusee_error(request: Request, exc: Exception) -> Response:
    status = status_of(exc)
    if status >= 500:
        log.warning(
            "http.error", path=redacted(request.url.path), error=f"{type(exc).__name__}: {exc}"
        )
    return error_response(status, type(exc).__name__, str(exc))


class _LastResort:
    """Any other exception: log it with its traceback, answer a 500 without it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracked = TrackedSend(send)
        try:
            await self.app(scope, receive, tracked)
        except Exception:  # the server's boundary: a bug becomes a 500, logged once
            log.exception(
                "http.internal_error", method=scope["method"], path=redacted(scope["path"])
            )
            if not tracked.started:
                response = error_response(
                    500,
                    "InternalError",
                    "internal error; the server logged it as http.internal_error",
                )
                await response(scope, receive, send)
