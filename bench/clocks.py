"""Clock reads patched into a running process for the path scripts (``step_path``,
``signal_path``): a name and ``perf_counter_ns`` per hop, while ``ON[0]`` is set.
Nothing of it is in fusee's own path; only the script that imports it patches."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from nats.aio import transport

__all__ = ("EVENTS", "ON", "around", "around_sync", "tag", "time_socket_writes")

EVENTS: list[tuple[str, int]] = []
ON = [False]


def tag(name: str) -> None:
    if ON[0]:
        EVENTS.append((name, time.perf_counter_ns()))


def around(owner: Any, attr: str, before: str, after: str | None) -> None:
    """Wrap the coroutine function ``owner.attr`` with a clock read on each side."""
    inner: Callable[..., Any] = getattr(owner, attr)

    async def timed(*args: Any, **kwargs: Any) -> Any:
        tag(before)
        result = await inner(*args, **kwargs)
        if after is not None:
            tag(after)
        return result

    setattr(owner, attr, timed)


def around_sync(owner: Any, attr: str, before: str) -> None:
    """Wrap the function ``owner.attr`` with a clock read before it."""
    inner: Callable[..., Any] = getattr(owner, attr)

    def timed(*args: Any, **kwargs: Any) -> Any:
        tag(before)
        return inner(*args, **kwargs)

    setattr(owner, attr, timed)


def time_socket_writes() -> None:
    """A clock read ``"write"`` at each socket write of nats-py (a message on its way)."""
    writelines: Callable[..., Any] = transport.TcpTransport.writelines

    def timed_writelines(self: Any, payload: Any) -> Any:
        tag("write")
        return writelines(self, payload)

    setattr(transport.TcpTransport, "writelines", timed_writelines)  # noqa: B010 - a method
