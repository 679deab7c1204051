"""What a ``Run`` or ``ObjectKey`` handle needs of the engine it talks through.

The handles depend on this narrow interface, not on ``Engine``: the engine module builds
them (``engine.run(id)``, ``engine.object(t, k)``), so it imports them, never the other
way round. ``Replies`` and ``Answered`` are the per-connection state the object callers
share: the reply subscription and when each object last answered.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any, Protocol

import anyio

if TYPE_CHECKING:
    from fusee.adapters.jetstream.store import NatsStore

__all__ = ("Client", "Replies", "Answered")


class Client(Protocol):
    """A connection to one namespace, as the handles see it (``fusee.Engine`` is one)."""

    @property
    def store(self) -> NatsStore: ...

    @property
    def namespace(self) -> str: ...

    @property
    def partitions(self) -> int: ...

    @property
    def replies(self) -> Replies:
        """The subscription the callers of exclusive handlers wait on for replies."""
        ...

    @property
    def answered(self) -> Answered:
        """When each object last answered a caller of this connection."""
        ...


class Replies:
    """One subscription per connection for the replies its callers wait on."""

    def __init__(self, store: NatsStore) -> None:
        self.store = store
        self.prefix = store.layout.replies(secrets.token_hex(8))
        self.waiting: dict[str, anyio.Event] = {}
        self.got: dict[str, bytes] = {}
        self._sub: Any = None
        self._n = 0

    async def open(self) -> None:
        if self._sub is not None:
            return

        async def on_reply(subject: str, data: bytes, _reply: str | None) -> None:
            event = self.waiting.get(subject)
            if event is not None:
                self.got[subject] = data
                event.set()

        self._sub = await self.store.subscribe_core(f"{self.prefix}.*", on_reply)

    def new(self) -> str:
        self._n += 1
        subject = f"{self.prefix}.{self._n}"
        self.waiting[subject] = anyio.Event()
        return subject

    async def wait(self, subject: str, timeout: float) -> bytes | None:
        event = self.waiting[subject]
        with anyio.move_on_after(timeout):
            await event.wait()
        return self.got.get(subject)

    def drop(self, subject: str) -> None:
        self.waiting.pop(subject, None)
        self.got.pop(subject, None)


REMEMBERED = 10_000  # objects a connection keeps the last answer of (oldest go first)


class Answered:
    """When (``time.monotonic()``) each object last answered this connection: an
    object that answered moments ago still has its active marker, so the next call
    need not ensure it. Bounded: the oldest answers are forgotten first."""

    def __init__(self, limit: int = REMEMBERED) -> None:
        self._at: dict[str, float] = {}
        self._limit = limit

    def get(self, eid: str) -> float | None:
        return self._at.get(eid)

    def note(self, eid: str, at: float) -> None:
        self._at.pop(eid, None)  # to the end: the oldest answered is first
        self._at[eid] = at
        if len(self._at) > self._limit:
            del self._at[next(iter(self._at))]
