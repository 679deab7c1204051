"""What every route reads from the app: the engine, settings, open streams; JSON bodies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import msgspec
from litestar import Request

from fusee import Engine
from fusee.adapters.http.errors import ApiError
from fusee.adapters.http.redact import redacted
from fusee.adapters.http.sse import StreamRegistry
from fusee.errors import InvalidArgument
from fusee.logs import get_logger

__all__ = ("ApiState", "api_state", "json_body", "until_disconnect")

log = get_logger()
T = TypeVar("T")


@dataclass
class ApiState:
    """The app's shared state, in ``app.state.fusee``.

    Attributes:
        engine: the engine every route uses (the app does not own it: whoever made the
            app closes it).
        keepalive: seconds between SSE keep-alive comments.
        streams: the open SSE responses, ended at once on shutdown.
        auth: whether requests need a token (``create_app(auth=)``).
    """

    engine: Engine
    keepalive: float = 15.0
    auth: bool = True
    streams: StreamRegistry = field(default_factory=StreamRegistry)


def api_state(request: Request[Any, Any, Any]) -> ApiState:
    state: ApiState = request.app.state.fusee
    return state


async def json_body(request: Request[Any, Any, Any], what: str) -> Any:
    """The request body as JSON; an empty body is ``None``.

    Raises:
        InvalidArgument: it is not JSON, or nests too deeply to be read; the message
            names ``what``.
    """
    data = await request.body()
    if not data.strip():
        return None
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise InvalidArgument(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidArgument(f"{what} nests too deeply to be read") from None


async def until_disconnect(request: Request[Any, Any, Any], wait: Callable[[], Awaitable[T]]) -> T:
    """Await ``wait()``, but give up as soon as the client goes away.

    A long poll (``/result?timeout=5m``) otherwise holds a journal consumer for a client
    that left long ago.

    Raises:
        ApiError: the client disconnected (no one reads the response).
    """
    result: list[T] = []
    try:
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                while (await request.receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            async def run() -> None:
                result.append(await wait())
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            tg.start_soon(run)
    except BaseExceptionGroup as group:
        # one error from the wait (RunNotFound...) is that error, not a group of one
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    if not result:
        log.debug("http.client_gone", method=request.method, path=redacted(request.url.path))
        raise ApiError(499, "the client closed the connection", "client_closed")
    return result[0]
