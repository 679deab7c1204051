"""The ASGI layers around the API's router: the request's ID, and the last resort.

Both wrap the whole app (an unknown route gets its ID and the error shape too):

- :class:`RequestId`: every response carries ``X-Request-ID``, the client's own if it
  sent a usable one (1 to 128 visible ASCII characters), else a new random one; the ID
  is in the scope (:func:`fusee.adapters.http.errors.request_id_of`), in every error
  body, and bound into structlog's context for the request, so each log line the API
  writes while serving it names it (``request_id=...``).
- :class:`LastResort`: any exception that is not fusee's is logged with its traceback
  (``http.internal_error``) and answered ``500 internal_error`` without it.
- :class:`Unserved`: paths below a prefix that the router must not answer (Litestar's
  OpenAPI router, which answers unknown paths with an HTML page) get ``404 not_found``.
"""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

import structlog

from fusee.adapters.http.errors import REQUEST_ID_KEY, TrackedSend, send_error
from fusee.adapters.http.redact import redacted
from fusee.logs import get_logger

__all__ = ("RequestId", "LastResort", "Unserved", "HEADER")

log = get_logger()

HEADER = "X-Request-ID"
_USABLE = re.compile(r"[\x21-\x7e]{1,128}")


class RequestId:
    """Give each HTTP request an ID: the client's ``X-Request-ID`` or a new one."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(HEADER.lower().encode(), b"")
        text = sent.decode("latin-1")
        request_id = text if _USABLE.fullmatch(text) else secrets.token_hex(8)
        scope[REQUEST_ID_KEY] = request_id
        header = (HEADER.lower().encode(), request_id.encode())
        status = [0]
        began = time.monotonic()

        async def tagged(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() != header[0]]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=request_id):
            try:
                await self.app(scope, receive, tagged)
            finally:
                log.debug(
                    "http.request",
                    method=scope["method"],
                    path=redacted(scope["path"]),
                    status=status[0],
                    ms=round((time.monotonic() - began) * 1000, 1),
                )


class LastResort:
    """Any other exception: log it with its traceback, answer a 500 without it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
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
                await send_error(
                    scope,
                    send,
                    500,
                    "internal_error",
                    "internal error; the server logged it as http.internal_error",
                )


class Unserved:
    """``404 not_found`` (the error shape) for ``prefix`` and every path below it."""

    def __init__(self, app: Any, prefix: str) -> None:
        self.app = app
        self.prefix = prefix.rstrip("/")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == self.prefix or path.startswith(self.prefix + "/")):
            message = f"no such endpoint: {scope['method']} {path} (the document is /openapi.json)"
            await send_error(scope, send, 404, "not_found", message)
            return
        await self.app(scope, receive, send)
