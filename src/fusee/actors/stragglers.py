"""The steps of tasks the workflow started itself (outside ``ctx.all``) running now:
when the code's execution ends while some still run, the actor stops them and waits,
so a task nobody awaits any more commits nothing after that end (or into the next
execution's journal). See "Concurrent calls outside ctx.all" in docs/design.md."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio

from fusee.runtime.history import Abandoned

__all__ = ("Stragglers",)


class Stragglers:
    """The steps of lanes other than the root running now. When the code's execution
    ends while some still run (a task the code started and did not await, or one
    ``asyncio.gather`` left running when another raised), they are cancelled and
    waited for, so nothing of theirs is committed after that end."""

    def __init__(self) -> None:
        self._scopes: set[anyio.CancelScope] = set()
        self._gone: anyio.Event | None = None

    def __bool__(self) -> bool:
        return bool(self._scopes)

    @contextmanager
    def running(self, what: str) -> Iterator[None]:
        """Around a step of a lane of its own. Raises ``Abandoned`` if the step was
        stopped because the code's execution ended."""
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                yield
        finally:
            self._scopes.discard(scope)
            if not self._scopes and self._gone is not None:
                self._gone.set()
        if scope.cancel_called:
            raise Abandoned(f"{what} was stopped: the code's execution ended first")

    async def stop(self) -> None:
        """Cancel the steps still running and wait until they stopped (shielded)."""
        if not self._scopes:
            return
        with anyio.CancelScope(shield=True):
            self._gone = anyio.Event()
            for scope in list(self._scopes):
                scope.cancel()
            await self._gone.wait()
            self._gone = None
