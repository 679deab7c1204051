"""What a ``Run`` or ``ObjectKey`` handle needs of the engine it talks through.

The handles depend on this narrow interface, not on ``Engine``: the engine module builds
them (``engine.run(id)``, ``engine.object(t, k)``), so it imports them, never the other
way round. Its ``store`` is ``fusee.actors.ports.HandleStore``, the store operations the
handles use, so they import no adapter. ``Replies`` and ``Answered`` are the per-connection state the object callers
share: the reply subscription and when each object last answered.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from fusee.errors import FuseeError

if TYPE_CHECKING:
    from fusee.actors.ports import HandleStore

__all__ = ("Client", "Replies", "Answered", "current_client", "enter_client", "leave_client")


class Client(Protocol):
    """A connection to one namespace, as the handles see it (``fusee.Engine`` is one)."""

    @property
    def store(self) -> HandleStore:
        """Exactly the store operations the handles use (``NatsStore`` is one)."""
        ...

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

    def __init__(self, store: HandleStore) -> None:
        self.store = store
        self.prefix = store.reply_prefix()
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


# The engine of the innermost ``async with await fusee.connect() as engine:`` block of
# this task (and of the tasks it starts): what ``chats.key(k)`` uses without ``engine=``.
_current: ContextVar[Client | None] = ContextVar("fusee_engine", default=None)


def enter_client(client: Client) -> Token[Client | None]:
    """Make ``client`` the current one; ``leave_client`` with the token undoes it."""
    return _current.set(client)


def leave_client(token: Token[Client | None]) -> None:
    # A block left in another context than it was entered in (an async fixture's
    # teardown, say) has nothing to undo in this one.
    with contextlib.suppress(ValueError):
        _current.reset(token)


def current_client(what: str) -> Client:
    """The engine of the enclosing ``async with await fusee.connect() as engine:``.

    Raises:
        FuseeError: there is none; the message says how to give one.
    """
    client = _current.get()
    if client is None:
        raise FuseeError(
            f"{what} has no engine: pass one (`obj.key(k, engine=engine)` or "
            f"`engine.object(obj, k)`), or use it inside "
            f"`async with await fusee.connect() as engine:`"
        )
    return client
