"""One JSON shape for every error the HTTP API returns, and which status each error gets.

    {"error": {"type": "RunNotFound", "message": "no run 'r1' in namespace 'fusee'", "status": 404}}

``type`` is stable: a fusee error's class name (``RunNotFound``, ``InvalidId``...), or
one of the HTTP names below for errors that are not fusee's (``NotFound`` for an
unknown route). Clients branch on ``type``; ``message`` is for people.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from starlette.responses import Response
from starlette.types import Message, Send

__all__ = (
    "ApiError",
    "ErrorBody",
    "ErrorDetail",
    "error_response",
    "error_body",
    "status_of",
    "HTTP_TYPES",
    "TrackedSend",
)


class ErrorDetail(msgspec.Struct, kw_only=True):
    type: str
    message: str
    status: int
    # an object handler's failure (HandlerFailed...): the handler and its own error type
    error_type: str | msgspec.UnsetType = msgspec.UNSET
    handler: str | msgspec.UnsetType = msgspec.UNSET


class ErrorBody(msgspec.Struct, kw_only=True):
    error: ErrorDetail


class ApiError(Exception):
    """An error of the HTTP layer itself (a bad header, an unsupported ``Accept``)."""

    def __init__(self, status: int, message: str, type_: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or HTTP_TYPES.get(status, "Error")


# The ``type`` of errors that are not a fusee exception, by status code.
HTTP_TYPES: dict[int, str] = {
    400: "BadRequest",
    404: "NotFound",
    409: "Conflict",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    500: "InternalError",
    501: "NotImplemented",
    503: "ServiceUnavailable",
    504: "Timeout",
}

# fusee errors by class name, looked up along the MRO: names, not classes, so an error
# class that another module adds later (``StreamNotFound``) maps without an import here.
_STATUS_BY_NAME: dict[str, int] = {
    "RunNotFound": 404,
    "StreamNotFound": 404,
    "UnknownLimit": 404,
    "UnknownToken": 404,
    "Unauthorized": 401,
    "InvalidId": 400,
    "InvalidArgument": 400,
    "ConfigError": 400,
    "NotEncodable": 400,
    "RunExists": 409,
    "NothingToCancel": 409,
    "NotPausedError": 409,
    "Timeout": 504,
    "ConnectionLost": 503,
    "StorageFull": 503,
}


def status_of(exc: BaseException) -> int:
    """The HTTP status for a fusee error: its class's, or its nearest base class's; 500 if none."""
    for cls in type(exc).__mro__:
        status = _STATUS_BY_NAME.get(cls.__name__)
        if status is not None:
            return status
    return 500


def error_response(
    status: int,
    type_: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    *,
    handler: str | None = None,
    error_type: str | None = None,
) -> Response:
    """The JSON error response: ``{"error": {"type", "message", "status"}}``; an object
    handler's failure adds ``handler`` and the handler's own ``error_type``."""
    detail = ErrorDetail(type=type_, message=message, status=status)
    if handler is not None:
        detail.handler = handler
    if error_type is not None:
        detail.error_type = error_type
    body = ErrorBody(error=detail)
    return Response(
        msgspec.json.encode(body),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def error_body(status: int, type_: str, message: str) -> dict[str, Any]:
    """The same shape as a plain dict (for an SSE ``error`` event)."""
    return {"error": {"type": type_, "message": message, "status": status}}


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
