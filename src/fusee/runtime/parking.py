"""The worker's parked actors, sans I/O: parking, the re-read that follows, wake-ups,
and the wake-ups the worker dropped.

An actor that waits with nothing to do leaves memory (``runtime/waits.py`` decides
when); the worker keeps it here, and a message to it (through the wake loop) brings it
back. ``tests/unit/test_wait_machine.py`` drives this with the waits' machine.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field

__all__ = ("ParkingLot",)


@dataclass
class ParkingLot:
    """The actors a worker parked: they left memory to wait for their inbox, and a
    message to them (through the wake loop) brings them back.

    The worker's inbox consumer hands a message to the actor in memory; one that comes
    after the actor's last read and before it is parked reaches nobody. So an actor is
    parked first (from then on a wake finds it here), and its inbox read once more above
    ``left_at`` (:meth:`looked`). A wake-up the worker dropped (its queue full) marks
    the lot ``missed``: the next reconcile reads every parked inbox (:meth:`to_recheck`).
    """

    parked: dict[str, tuple[int, int]] = field(default_factory=dict)  # eid: (partition, left_at)
    missed: bool = False
    drops: int = 0  # how many drops so far: a recheck clears ``missed`` only for those it covers

    def leave(self, eid: str, partition: int, left_at: int) -> None:
        """``eid`` left memory having read its inbox up to ``left_at``: the caller reads
        the inbox above it next, and tells :meth:`looked`."""
        self.parked[eid] = (partition, left_at)

    def looked(self, eid: str, left_at: int, news: bool) -> bool:
        """The inbox of ``eid`` was read above ``left_at``; True: there is news and it
        is still parked as it left (not brought back meanwhile), so it comes back now."""
        if not news or self.parked.get(eid, (0, -1))[1] != left_at:
            return False
        del self.parked[eid]
        return True

    def look_failed(self, eid: str) -> None:
        """The read after :meth:`leave` failed: not parked (a reconcile brings it back),
        and any parked actor may have missed its message the same way."""
        self.parked.pop(eid, None)
        self.dropped()

    def wake(self, eid: str) -> bool:
        """A message to ``eid`` came: True when it was parked (it comes back)."""
        return self.parked.pop(eid, None) is not None

    def dropped(self) -> None:
        """A wake-up or an inbox message was dropped: some parked actor may be due."""
        self.missed = True
        self.drops += 1

    def is_parked(self, eid: str) -> bool:
        return eid in self.parked

    def to_recheck(self, partitions: Container[int]) -> tuple[list[tuple[str, int, int]], int]:
        """After a drop: ``(eid, partition, left_at)`` of every parked actor to look
        at (none when nothing was dropped), and the drops they cover (for
        :meth:`rechecked`)."""
        if not self.missed:
            return [], self.drops
        return [(e, p, s) for e, (p, s) in self.parked.items() if p in partitions], self.drops

    def rechecked(self, complete: bool, covered: int) -> None:
        """The reads of :meth:`to_recheck` are done; ``complete``: all of them answered
        (else the next reconcile looks again). A drop that came while they were read
        (after ``covered``) may concern an actor read before it: ``missed`` stays."""
        if complete and self.drops == covered:
            self.missed = False

    def forget(self, partitions: Container[int], listed: Iterable[str]) -> None:
        """Forget the actors of ``partitions`` whose marker is gone (an idle object's
        expired): a message to them comes with a wake, which activates them."""
        marked = set(listed)
        for eid in [e for e, (p, _) in self.parked.items() if p in partitions and e not in marked]:
            del self.parked[eid]

    def drop_partition(self, partition: int) -> None:
        for eid in [e for e, (p, _) in self.parked.items() if p == partition]:
            del self.parked[eid]
