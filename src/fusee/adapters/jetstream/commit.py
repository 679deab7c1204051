"""Group commit: when many actors commit at once, their records share one atomic batch.

With ``sync_interval: always`` every stored write costs an fsync, and a single nats-server
does not group fsyncs across publishers (about 3-5k writes/s here, whatever the number
of publishers). An atomic batch (ADR-50) is stored with one fsync however many messages
it holds. A batch costs about 3.2 ms on an R1 file stream against 0.5 ms for one publish,
so it only pays when several commits wait. Which record goes out alone and which is
queued for the committer's own task is decided by ``fusee.runtime.commits.CommitQueue``
(pure code): no appender sends anyone else's records, so one that is cancelled or fails
(a run's cancel, its timeout, a drain) takes only itself away, and every queued record
gets its own outcome.

Each message keeps its own fence (``Nats-Expected-Last-Subject-Sequence`` on its own
run's subtree). One stale fence fails the whole batch; then every record of it is
appended alone, so the stale one gets its ``Fenced`` and the others land.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from fusee.adapters.jetstream.direct import publish_acked
from fusee.errors import Fenced, FuseeError
from fusee.logs import get_logger
from fusee.runtime.commits import CommitQueue, Route

log = get_logger()

__all__ = (
    "BATCHES_IN_FLIGHT",
    "GroupCommitter",
    "Pending",
    "CommitterClosed",
    "Message",
    "publish_batch",
)


class CommitterClosed(FuseeError):
    """The store closed while records waited to be committed: those queued were not
    sent; those of the lot in flight may have landed (the actor's next commit, fenced
    or not, tells)."""


BATCH_ID = "Nats-Batch-Id"
BATCH_SEQ = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"


Message = tuple[str, bytes, dict[str, str]]  # subject, data, headers


# Batches one connection keeps in flight at most (from its first message to the
# commit's ack). The server takes 50 per stream and 1,000 per server (ADR-50) and
# refuses a batch past them with 10176; several workers share a stream, so each
# stays well under.
BATCHES_IN_FLIGHT = 8


async def publish_batch(
    nc: Client,
    messages: list[Message],
    timeout: float,
    in_flight: asyncio.Semaphore,
) -> int:
    """Store ``messages`` as one atomic batch (all or none, one fsync); the stream
    sequence of the last. Raises what :func:`publish_acked` raises for the commit.

    ``in_flight``: the connection's bound on batches in flight (shared by every batch
    it sends), held from the first message until the commit is answered."""
    async with in_flight:
        return await _publish_batch(nc, messages, timeout)


async def _publish_batch(nc: Client, messages: list[Message], timeout: float) -> int:
    batch = secrets.token_hex(8)  # a new id for every try: a refused one is gone
    for i, (subject, data, headers) in enumerate(messages[:-1], start=1):
        await nc.publish(subject, data, headers={**headers, BATCH_ID: batch, BATCH_SEQ: str(i)})
    subject, data, headers = messages[-1]
    last = {**headers, BATCH_ID: batch, BATCH_SEQ: str(len(messages)), BATCH_COMMIT: "1"}
    return await publish_acked(nc, subject, data, last, timeout)


@dataclass
class Pending:
    subject: str
    data: bytes
    headers: dict[str, str]
    eid: str
    fence: int
    msg_id: str
    kind: str
    give_up: float  # when (time.monotonic()) its retries stop: math.inf for actors
    # messages stored with the record, in the same batch, after it (a run's start: its
    # active marker); its sequence stays the record's own
    riders: tuple[Message, ...] = ()
    done: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


Direct = Callable[[Pending], Awaitable[int]]  # append one record alone


class GroupCommitter:
    def __init__(self, nc: Client, direct: Direct, *, direct_limit: int = 4) -> None:
        self.nc = nc
        self.direct = direct  # append one record alone, with retries and read-back
        # the connection's batches in flight: the group's and every record's sent alone
        # with riders (``direct`` passes it to ``publish_batch``), so a failed group's
        # fallback sends its lot's batches a few at a time, not all at once
        self.in_flight = asyncio.Semaphore(BATCHES_IN_FLIGHT)
        self.plan: CommitQueue[Pending] = CommitQueue(direct_limit=direct_limit)
        self._committer: asyncio.Task[None] | None = None
        self.batches = 0  # for benchmarks: how many batches went out
        self.batched = 0  # and how many records they held
        self.fallbacks = 0  # batches that fell back to single publishes (each logged)

    @property
    def direct_limit(self) -> int:
        return self.plan.direct_limit

    @direct_limit.setter
    def direct_limit(self, limit: int) -> None:
        self.plan.direct_limit = limit

    async def append(self, item: Pending) -> int:
        route = self.plan.offer(item)
        if route is Route.ALONE:
            try:
                return await self.direct(item)
            finally:
                self.plan.sent_alone()
        # an appender that left (cancelled) does not read its outcome: nothing to report
        item.done.add_done_callback(lambda f: f.cancelled() or f.exception())
        if route is Route.START:
            # in a context of its own: not the first appender's (its log fields, its
            # patience); each record carries its own ``give_up``
            self._committer = asyncio.get_running_loop().create_task(
                self._commit_queued(), context=contextvars.Context()
            )
        # Shielded: an appender cancelled while it waits leaves its record to the
        # committer (it may land; the appender's next commit, fenced, finds out).
        return await asyncio.shield(item.done)

    async def _commit_queued(self) -> None:
        lot: list[Pending] = []
        try:
            while lot := self.plan.next_lot():
                try:
                    await self._send(lot)
                except Exception as exc:  # noqa: BLE001 - handed to each appender, which raises it
                    for item in lot:
                        if not item.done.done():
                            item.done.set_exception(exc)
        finally:
            self._committer = None
            left = [*lot, *self.plan.close()]
            for item in left:  # cancelled (the connection closes): nobody hangs
                if not item.done.done():
                    item.done.set_exception(CommitterClosed("the connection to NATS closed"))

    async def close(self) -> None:
        """Stop the committer task (the connection closes): whatever it still held
        fails with :class:`CommitterClosed`."""
        task = self._committer
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _send(self, lot: list[Pending]) -> None:
        if len(lot) == 1:
            await self._alone(lot[0])
            return
        messages: list[Message] = []
        at: list[int] = []  # each record's place in the batch (riders follow theirs)
        for item in lot:
            at.append(len(messages))
            messages.append((item.subject, item.data, item.headers))
            messages.extend(item.riders)
        try:
            seq = await publish_batch(self.nc, messages, 5.0, self.in_flight)
        except (
            nats.js.errors.BadRequestError,  # a stale fence, or a limit: nothing was stored
            nats.js.errors.APIError,
            nats.errors.TimeoutError,  # unknown: each record's own retry and read-back tell
            nats.errors.NoRespondersError,
            nats.js.errors.NoStreamResponseError,  # a 503: JetStream (re)starting, a leader election
            nats.errors.ConnectionReconnectingError,
            nats.errors.ConnectionClosedError,
            nats.errors.OutboundBufferLimitError,
        ) as exc:
            self.fallbacks += 1
            log.warning(
                "commit.batch_fallback",
                records=len(lot),
                messages=len(messages),
                error=f"{type(exc).__name__}: {exc}",
            )
            await asyncio.gather(*(self._alone(item) for item in lot))
            return
        self.batches += 1
        self.batched += len(lot)
        first = seq - len(messages) + 1  # a batch is stored contiguously
        for i, item in zip(at, lot, strict=True):
            if not item.done.done():
                item.done.set_result(first + i)

    async def _alone(self, item: Pending) -> None:
        try:
            seq = await self.direct(item)
        except (Exception, Fenced) as exc:  # noqa: BLE001 - handed to its appender, which raises it
            if not item.done.done():
                item.done.set_exception(exc)
            return
        if not item.done.done():
            item.done.set_result(seq)
