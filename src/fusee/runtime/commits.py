"""Group commit, sans I/O: which record goes out alone, which waits for a batch, and
who sends the batches.

The JetStream adapter (``adapters/jetstream/commit.py``) performs it. While fewer than
``direct_limit`` appends are in flight, each goes out alone (a batch costs more than a
lone publish until several commits wait). Past that, records queue, and the queue's
own **committer** (one at a time, started when the queue fills, gone when it is empty)
sends what is queued as one batch, then the next lot. No appender ever sends another's
records: one that leaves (its run is cancelled, its timeout passes) takes only itself
away, and every queued record gets its own outcome. ``tests/unit/test_commit_queue.py``
drives this with appenders that leave at any point, and puts back the defect where the
first appender to queue sent the lot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

__all__ = ("CommitQueue", "Route", "MAX_BATCH", "BATCH_MESSAGES", "RECORD_MESSAGES")

T = TypeVar("T")

BATCH_MESSAGES = 1_000  # the most messages the server takes in one atomic batch
# The most messages one record carries: itself and its riders (an end's: its listing
# entry and its marker's tombstone; ``adapters/jetstream/store.py``'s ``end_run``).
RECORD_MESSAGES = 3
MAX_BATCH = BATCH_MESSAGES // RECORD_MESSAGES  # records in a batch, their riders with them


class Route(Enum):
    ALONE = "alone"  # the appender sends it now, alone
    QUEUED = "queued"  # the committer sends it; one runs already
    START = "start"  # the committer sends it; the caller starts one


@dataclass
class CommitQueue(Generic[T]):
    direct_limit: int = 4
    max_batch: int = MAX_BATCH
    in_flight: int = 0  # appends going out alone
    queue: list[T] = field(default_factory=list)
    committing: bool = False  # a committer runs

    def offer(self, item: T) -> Route:
        """An appender has ``item`` to commit: how it goes out."""
        if self.in_flight < self.direct_limit and not self.queue and not self.committing:
            self.in_flight += 1
            return Route.ALONE
        self.queue.append(item)
        if self.committing:
            return Route.QUEUED
        self.committing = True
        return Route.START

    def sent_alone(self) -> None:
        """An append that went out alone is over (landed or not)."""
        self.in_flight -= 1

    def next_lot(self) -> list[T]:
        """The committer's next batch; empty: the queue is empty and the committer
        ends (the next record queued starts another)."""
        lot, self.queue = self.queue[: self.max_batch], self.queue[self.max_batch :]
        if not lot:
            self.committing = False
        return lot

    def close(self) -> list[T]:
        """The connection closes: what was still queued (to fail, never sent)."""
        left, self.queue = self.queue, []
        self.committing = False
        return left
