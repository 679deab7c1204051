"""IDs in URL paths: each one percent-encoded as one path segment.

Run IDs, object keys and stream names may hold ``/`` (``chat-7/turn-3``), so a path
that took them as they come could not tell run ``amb/result`` from the result of run
``amb``. So every ID is one segment, with its ``/`` written ``%2F`` (what
``encodeURIComponent`` and ``urllib.parse.quote(id, safe="")`` give), and routes match
the path as the client sent it (``raw_path``), before ``%2F`` is decoded: the router
decodes a path parameter once it has matched.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote

__all__ = ("RawPath", "DecodedParams", "SAFE")

# what stays as it is in a path sent to the router: the segment separator, escapes, and
# the characters RFC 3986 allows in a segment
SAFE = "/%!$&'()*+,;=:@-._~"


class RawPath:
    """Route on the path as sent (``raw_path``): ``%2F`` stays inside its segment."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raw = scope.get("raw_path")
        if scope["type"] in ("http", "websocket") and isinstance(raw, bytes):
            scope = {**scope, "path": quote(raw, safe=SAFE)}
        await self.app(scope, receive, send)


class DecodedParams:
    """Once a route matched: its path parameters percent-decoded (``%2F`` is a ``/`` of
    the ID). Bytes that are not UTF-8 become lone surrogates, which ID checks refuse."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        params = scope.get("path_params")
        if params:
            scope["path_params"] = {
                k: unquote(v, errors="surrogateescape") if isinstance(v, str) else v
                for k, v in params.items()
            }
        await self.app(scope, receive, send)
