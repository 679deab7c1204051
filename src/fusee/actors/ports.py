"""What the actors need from storage, as Protocols: the JetStream adapter implements them."""

from __future__ import annotations

from typing import Protocol

__all__ = ("Stored", "RunStore")


class Stored(Protocol):
    @property
    def seq(self) -> int: ...
    @property
    def data(self) -> bytes: ...


class RunStore(Protocol):
    """A run's journal, the run index and the active markers, for one namespace."""

    async def append(self, eid: str, kind: str, data: bytes, *, fence: int, msg_id: str) -> int:
        """Append under the fence; raises ``Fenced`` when another writer moved it."""
        ...

    async def read_journal(self, eid: str, after: int = 0) -> list[Stored]: ...  # type: ignore[misc]

    async def put_index(self, eid: str, value: bytes) -> None: ...

    async def get_index(self, eid: str) -> bytes | None: ...

    async def mark_active(self, partition: int, eid: str) -> None: ...

    async def clear_active(self, partition: int, eid: str) -> None: ...
