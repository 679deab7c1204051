"""IDs in URL paths: each one percent-encoded as one path segment.

Run IDs, object keys and stream names may hold ``/`` (``chat-7/turn-3``), so a path
that took them as they come could not tell run ``amb/result`` from the result of run
``amb``. So every ID is one segment, with its ``/`` written ``%2F`` (what
``encodeURIComponent`` and ``urllib.parse.quote(id, safe="")`` give), and routes match
the path as the client sent it (``raw_path``), before ``%2F`` is decoded: a route
parameter is decoded only once it has matched, by the ``id`` convertor.
"""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import quote, unquote

from starlette.convertors import Convertor, register_url_convertor
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ("RawPath", "IdConvertor", "SAFE")

# what stays as it is in a path sent to the router: the segment separator, escapes, and
# the characters RFC 3986 allows in a segment
SAFE = "/%!$&'()*+,;=:@-._~"


class IdConvertor(Convertor[str]):
    """One path segment, percent-decoded (``%2F`` is a ``/`` of the ID)."""

    regex: ClassVar[str] = "[^/]+"

    def convert(self, value: str) -> str:
        # bytes that are not UTF-8 become lone surrogates, which ID checks refuse (400)
        return unquote(value, errors="surrogateescape")

    def to_string(self, value: str) -> str:
        return quote(value, safe="")


register_url_convertor("id", IdConvertor())


class RawPath:
    """Route on the path as sent (``raw_path``): ``%2F`` stays inside its segment."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path")
        if scope["type"] in ("http", "websocket") and isinstance(raw, bytes):
            scope = {**scope, "path": quote(raw, safe=SAFE)}
        await self.app(scope, receive, send)
