"""``HEAD`` and ``OPTIONS`` on every route, as HTTP has them.

- :class:`HeadAsGet` (around the router): a ``HEAD`` request is served as the ``GET`` of
  its path, and answered with that response's status and headers and no body (what
  ``curl -I`` and load balancers' health checks send). An event stream's ``HEAD`` ends
  once its headers are sent.
- :class:`AllowedMethods` (inside the router, once a route matched): ``OPTIONS`` answers
  ``204`` with ``Allow`` listing every method of the route (``HEAD`` with ``GET``).
  Litestar's own ``OPTIONS`` answer lists only the methods of the first handler
  registered on a path (a route of ``POST`` and ``GET`` answers ``OPTIONS, POST``).
"""

from __future__ import annotations

from typing import Any

import anyio

__all__ = ("HeadAsGet", "AllowedMethods", "allowed")


def allowed(methods: set[str] | list[str]) -> str:
    """An ``Allow`` header's value: the methods, ``HEAD`` beside ``GET``, ``OPTIONS``."""
    out = {m.upper() for m in methods} | {"OPTIONS"}
    if "GET" in out:
        out.add("HEAD")
    return ", ".join(sorted(out))


class HeadAsGet:
    """Serve ``HEAD`` as ``GET``, without the body."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        done = False
        async with anyio.create_task_group() as tg:

            async def headers_only(message: Any) -> None:
                nonlocal done
                if done or message["type"] != "http.response.start":
                    return
                done = True
                await send(message)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()  # the body (an event stream's too) is not sent

            await self.app({**scope, "method": "GET"}, receive, headers_only)
            tg.cancel_scope.cancel()


class AllowedMethods:
    """Answer ``OPTIONS`` with every method of the matched route."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await self.app(scope, receive, send)
            return
        by_path = scope["app"].route_handler_method_map
        methods: set[str] = set()
        for path in scope["route_handler"].paths:
            methods |= set(by_path.get(path, {}))
        value = allowed(methods).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 204,
                "headers": [(b"allow", value), (b"content-length", b"0")],
            }
        )
        await send({"type": "http.response.body", "body": b"", "more_body": False})
