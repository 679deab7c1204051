"""A request body larger than the API takes is refused with ``413``, before it is read.

A body declared larger (``Content-Length``) is refused without being kept (up to 16 MiB
it is read and dropped first, so a client still sending reads the answer; past that
the connection closes); one sent in chunks is counted as it comes and refused as soon
as it passes the limit. The server never holds more than the limit of any request. The default, 1 MiB, is
what one NATS message holds on a default server: a larger call or state could not be
stored anyway.
"""

from __future__ import annotations

from typing import Any

from fusee.adapters.http.errors import TrackedSend, send_error

__all__ = ("BodyLimit", "DEFAULT_MAX_BODY", "parse_size")

DEFAULT_MAX_BODY = 1 << 20
# a body declared larger than the limit but at most this large is read and dropped
# before the 413 (the client can read it); a larger one gets the 413 and a closed socket
DRAIN_LIMIT = 16 << 20

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20}
_UNITS |= {"mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_size(text: str, what: str) -> int:
    """``"1MiB"``, ``"512k"``, ``"2000000"``: bytes (units are powers of 1,024).

    Raises:
        ValueError: not a size; the message names ``what``.
    """
    s = text.strip().lower().replace("_", "")
    digits = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(digits) :]
    try:
        size = float(digits) * _UNITS[unit]
    except (ValueError, KeyError):
        raise ValueError(
            f"{what} {text!r}: not a size (write bytes, or with a unit: 512KiB, 1MiB)"
        ) from None
    if size < 1:
        raise ValueError(f"{what} {text!r}: must be at least 1 byte")
    return int(size)


class _TooLarge(BaseException):
    pass


class BodyLimit:
    """Refuse request bodies over ``max_body`` bytes with ``413 payload_too_large``."""

    def __init__(self, app: Any, max_body: int = DEFAULT_MAX_BODY) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            size = int(declared)
            if size <= DRAIN_LIMIT:
                # read and dropped as it comes, so the client, still sending, reads the
                # answer (closing on it would cut its write); past DRAIN_LIMIT: closed
                while (await receive()).get("more_body", False):
                    pass
            await self._refuse(scope, receive, send, size, close=size > DRAIN_LIMIT)
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise _TooLarge
            return message

        tracked = TrackedSend(send)
        try:
            await self.app(scope, counted, tracked)
        except _TooLarge:
            if not tracked.started:
                await self._refuse(scope, receive, send, None, close=True)

    async def _refuse(
        self, scope: Any, receive: Any, send: Any, size: int | None, *, close: bool
    ) -> None:
        told = f"{size:,} bytes" if size is not None else "more"
        await send_error(
            scope,
            send,
            413,
            "payload_too_large",
            f"the request body is {told}; this API takes at most {self.max_body:,} bytes "
            f"(fusee api --max-body)",
            headers={"Connection": "close"} if close else None,
        )
