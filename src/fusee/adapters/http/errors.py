"""One JSON shape for every error the HTTP API returns, and which status each error gets.

    {"error": {"code": "run_not_found", "message": "no run 'r1' in namespace 'fusee'",
               "request_id": "5f0c..."}}

``code`` is stable snake case: a fusee error's entry in :data:`ERROR_CODES`
(``RunNotFound`` is ``run_not_found``, ``InvalidId`` is ``invalid_id``), or one of the
HTTP codes below for errors that are not fusee's (``not_found`` for an unknown route). Clients branch on
``code``; ``message`` is for people; ``request_id`` is the response's ``X-Request-ID``
(also in the API's log lines). An object handler's failure adds ``handler`` and the
handler's own ``error_type``.

These are plain ASGI helpers (no framework types), so middleware that answers before
the framework does (the body limit, the request ID, the auth middleware) sends the same
shape: :func:`send_error`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import msgspec

__all__ = (
    "ApiError",
    "ERROR_CODES",
    "ErrorBody",
    "ErrorDetail",
    "HTTP_CODES",
    "TrackedSend",
    "code_of",
    "error_body",
    "error_bytes",
    "request_id_of",
    "send_error",
    "status_of",
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

# where the request-ID middleware keeps the request's ID in the ASGI scope
REQUEST_ID_KEY = "fusee.request_id"


class ErrorDetail(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The error: a stable ``code``, a ``message`` for people, the ``request_id``."""

    code: str
    message: str
    request_id: str = ""
    # an object handler's failure (handler_failed...): the handler and its own error type
    handler: str | msgspec.UnsetType = msgspec.UNSET
    error_type: str | msgspec.UnsetType = msgspec.UNSET


class ErrorBody(msgspec.Struct, kw_only=True):
    """Every error response's body."""

    error: ErrorDetail


class ApiError(Exception):
    """An error of the HTTP layer itself (a bad header, an unsupported ``Accept``), or
    one a route answers with a code of its own (``handler_failed``)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        *,
        handler: str | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or HTTP_CODES.get(status, "error")
        self.handler = handler
        self.error_type = error_type


# The ``code`` of errors that are not a fusee exception, by status.
HTTP_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    499: "client_closed",
    500: "internal_error",
    501: "not_implemented",
    503: "service_unavailable",
    504: "timeout",
}

# Every fusee error the API can answer, by class name: its status and its stable code.
# An explicit table (not derived from the class name), so renaming a class cannot change
# what clients branch on. Names, not classes: an error class of another module (the
# tokens' Unauthorized) maps without an import here. A class not listed takes the entry
# of its nearest listed base class (its MRO): ``fusee_error``, 500 at worst.
ERROR_CODES: dict[str, tuple[int, str]] = {
    "FuseeError": (500, "fusee_error"),
    "Unauthorized": (401, "unauthorized"),
    "Forbidden": (403, "forbidden"),
    "InvalidId": (400, "invalid_id"),
    "InvalidArgument": (400, "invalid_argument"),
    "ConfigError": (400, "config_error"),
    "NotEncodable": (400, "not_encodable"),
    "InvalidToken": (500, "invalid_token"),
    "ToolInputError": (500, "tool_input_error"),
    "RunNotFound": (404, "run_not_found"),
    "StreamNotFound": (404, "stream_not_found"),
    "UnknownLimit": (404, "unknown_limit"),
    "UnknownToken": (404, "unknown_token"),
    "UnknownTool": (500, "unknown_tool"),
    "RunExists": (409, "run_exists"),
    "NothingToCancel": (409, "nothing_to_cancel"),
    "NotPausedError": (409, "not_paused_error"),
    "Timeout": (504, "timeout"),
    "StepTimeout": (500, "step_timeout"),
    "ConnectionLost": (503, "connection_lost"),
    # the API's own NATS user may not do this: an operator's matter, not the caller's
    "PermissionDenied": (500, "permission_denied"),
    "StorageFull": (503, "storage_full"),
    "ServerNotFound": (500, "server_not_found"),
    "NobodyListens": (500, "nobody_listens"),
    "CommitterClosed": (500, "committer_closed"),
    "RunFailed": (500, "run_failed"),
    "RunCancelled": (500, "run_cancelled"),
    "HandlerFailed": (500, "handler_failed"),
    "HandlerCancelled": (500, "handler_cancelled"),
    "StepError": (500, "step_error"),
    "StepFailedError": (500, "step_failed_error"),
    "FatalError": (500, "fatal_error"),
    "DeterminismError": (500, "determinism_error"),
    "JournalGap": (500, "journal_gap"),
}


def _entry(exc: BaseException) -> tuple[int, str]:
    for cls in type(exc).__mro__:
        entry = ERROR_CODES.get(cls.__name__)
        if entry is not None:
            return entry
    return 500, "internal_error"


def code_of(exc: BaseException) -> str:
    """A fusee error's stable code (:data:`ERROR_CODES`: its class's, or its nearest
    listed base class's).

    Example:
        >>> from fusee.errors import RunNotFound, NotPausedError
        >>> code_of(RunNotFound("x")), code_of(NotPausedError("r", "running", "m"))
        ('run_not_found', 'not_paused_error')
    """
    return _entry(exc)[1]


def status_of(exc: BaseException) -> int:
    """The HTTP status for a fusee error (:data:`ERROR_CODES`); 500 if none."""
    return _entry(exc)[0]


def request_id_of(scope: Mapping[str, Any]) -> str:
    """The request's ID (``X-Request-ID``), as the request-ID middleware set it."""
    return str(scope.get(REQUEST_ID_KEY, ""))


def error_body(
    code: str,
    message: str,
    request_id: str = "",
    *,
    handler: str | None = None,
    error_type: str | None = None,
) -> ErrorBody:
    detail = ErrorDetail(code=code, message=message, request_id=request_id)
    if handler is not None:
        detail.handler = handler
    if error_type is not None:
        detail.error_type = error_type
    return ErrorBody(error=detail)


def error_bytes(code: str, message: str, request_id: str = "") -> bytes:
    """The error body as JSON bytes (an SSE ``error`` event's data too)."""
    return msgspec.json.encode(error_body(code, message, request_id))


async def send_error(
    scope: Scope,
    send: Send,
    status: int,
    code: str,
    message: str,
    *,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Answer the request with the error shape (from any ASGI middleware)."""
    body = error_bytes(code, message, request_id_of(scope))
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class TrackedSend:
    """An ASGI ``send`` that notes whether the response began (``started``): after
    that, an error can no longer be answered with an error response."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)
