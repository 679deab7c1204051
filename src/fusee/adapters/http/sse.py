"""Server-sent events for a run's token stream: framing, and the response that streams them.

Framing is pure (:func:`frame`). :class:`TokenEventStream` is an ASGI response that
owns its reader: one task group holds the reader of the token stream, a watcher of the
client's connection, and the writer. A client disconnect, a server shutdown or the end
of the stream cancels the group, and with it the reader.

Errors that are known before the first event (the stream of an ended run does not
exist) still get a JSON error response with their status code: for a run that is over,
the response waits a moment for the reader's first item before it commits to
``200 text/event-stream``. A live run's response starts at once (its reader may wait
for tokens for long); an error after the start is sent as an ``error`` event, then the
response closes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import msgspec
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from fusee.adapters.http.errors import (
    code_of,
    error_body,
    request_id_of,
    send_error,
    status_of,
)
from fusee.errors import FuseeError
from fusee.logs import get_logger

__all__ = (
    "TokenEventLike",
    "TokenEventStream",
    "StreamRegistry",
    "frame",
    "comment",
    "event_frame",
    "FIRST_ITEM_GRACE",
)

log = get_logger()

# How long the response of a run that is over waits for the reader's first item (or its
# error) before sending its headers: everything is stored, so it comes at once.
FIRST_ITEM_GRACE = 1.0


class TokenEventLike(Protocol):
    """What :meth:`fusee.Run.stream_events` yields (``fusee.TokenEvent``)."""

    @property
    def kind(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def attempt(self) -> int: ...


def frame(event: str, data: Any, *, id_: int | None = None) -> bytes:
    """One SSE event: optional ``id:``, ``event:``, one ``data:`` line of JSON, blank line.

    JSON escapes newlines inside strings, so the data is always one line.

    Example:
        >>> frame("token", {"text": "Hi"}, id_=0)
        b'id: 0\\nevent: token\\ndata: {"text":"Hi"}\\n\\n'
    """
    head = f"id: {id_}\n" if id_ is not None else ""
    return f"{head}event: {event}\n".encode() + b"data: " + msgspec.json.encode(data) + b"\n\n"


def comment(text: str) -> bytes:
    """An SSE comment line (clients ignore it; it keeps proxies from closing the connection)."""
    return f": {text}\n\n".encode()


def event_frame(ev: TokenEventLike) -> bytes:
    """A token event as SSE. Only tokens carry an ``id``: ``Last-Event-ID`` then always names
    the last token the client has, and resuming after it neither skips nor repeats one."""
    data = {"text": ev.text, "index": ev.index, "attempt": ev.attempt}
    return frame(ev.kind, data, id_=ev.index if ev.kind == "token" else None)


class StreamRegistry:
    """The open event streams of one app, so a server shutdown can end them at once
    (a client then reconnects with ``Last-Event-ID`` to another server)."""

    def __init__(self) -> None:
        self._scopes: set[anyio.CancelScope] = set()
        self.closing = False

    @contextlib.contextmanager
    def track(self, scope: anyio.CancelScope) -> Any:
        if self.closing:
            scope.cancel()
        self._scopes.add(scope)
        try:
            yield
        finally:
            self._scopes.discard(scope)

    def close_all(self) -> None:
        self.closing = True
        for scope in list(self._scopes):
            scope.cancel()


@dataclass
class _Failed:
    error: BaseException


_Item = TokenEventLike | _Failed


class TokenEventStream:
    """The ASGI response for ``GET /v1/runs/{id}/streams/{name}``.

    Args:
        open_events: opens the reader (``run.stream_events(name, offset)``); called
            inside the response's task group, so the group owns the reader.
        offset: the index of the first token asked for.
        grace: how long to wait for the first item before starting the response.
        registry: the app's open streams, for shutdown.
        keepalive: seconds between keep-alive comments while no event comes.
    """

    def __init__(
        self,
        open_events: Callable[[], AsyncIterator[TokenEventLike]],
        *,
        offset: int,
        grace: float,
        registry: StreamRegistry,
        keepalive: float,
        context: dict[str, Any],
    ) -> None:
        self.open_events = open_events
        self.next_index = offset
        self.attempt: int | None = None
        self.grace = grace
        self.registry = registry
        self.keepalive = keepalive
        self.context = context
        self._started = False
        self._completed = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        items, inbox = anyio.create_memory_object_stream[_Item](0)
        async with anyio.create_task_group() as tg:
            with self.registry.track(tg.cancel_scope):
                await tg.start(self._watch_client, receive, tg.cancel_scope)
                tg.start_soon(self._read, items)
                await self._write(inbox, scope, send)
                tg.cancel_scope.cancel()
        if self._started and not self._completed:
            # cut short by a server shutdown (or a gone client): end the body cleanly, so
            # a client sees the stream close and reconnects with its Last-Event-ID
            with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch_client(
        self,
        receive: Any,
        scope: anyio.CancelScope,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        task_status.started()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                log.debug("http.stream.disconnected", **self.context)
                scope.cancel()
                return

    async def _read(self, items: MemoryObjectSendStream[_Item]) -> None:
        async with items:
            events = self.open_events()
            try:
                async for ev in events:
                    await items.send(ev)
            except FuseeError as exc:
                await items.send(_Failed(exc))
            finally:
                aclose = getattr(events, "aclose", None)
                if aclose is not None:
                    with anyio.CancelScope(shield=True):
                        await aclose()

    async def _next(self, inbox: MemoryObjectReceiveStream[_Item], wait: float) -> _Next:
        with anyio.move_on_after(wait):
            try:
                return await inbox.receive()
            except anyio.EndOfStream:
                return _EOS
        return None

    async def _write(self, inbox: MemoryObjectReceiveStream[_Item], scope: Any, send: Any) -> None:
        item = await self._next(inbox, self.grace)
        if isinstance(item, _Failed):
            exc = item.error
            await send_error(scope, send, status_of(exc), code_of(exc), str(exc))
            self._completed = True
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    # nginx buffers responses unless told not to
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        self._started = True
        # a first byte at once, so a client knows the stream is open before any token
        body = comment("stream") if item is None else b""
        while True:
            if item is _EOS:
                # the reader ended without an end event: say so all the same
                end = {"text": "", "index": self.next_index, "attempt": self.attempt}
                body += frame("end", end)
                break
            if isinstance(item, _Failed):
                exc = item.error
                data = error_body(code_of(exc), str(exc), request_id_of(scope))
                body += frame("error", data)
                break
            if item is None:
                body += comment("keep-alive") if not body else b""
            else:
                assert not isinstance(item, _EndOfStream)
                body += event_frame(item)
                self.next_index = item.index + 1 if item.kind == "token" else item.index
                self.attempt = item.attempt
                if item.kind == "end":
                    break
            await send({"type": "http.response.body", "body": body, "more_body": True})
            body = b""
            item = await self._next(inbox, self.keepalive)
        await send({"type": "http.response.body", "body": body, "more_body": False})
        self._completed = True


class _EndOfStream:
    """The reader's iterator is exhausted."""


_EOS = _EndOfStream()
_Next = TokenEventLike | _Failed | _EndOfStream | None
