"""One watch per connection on every journal's end records: how callers learn a result
is there.

``Run.result()`` waits for a run's end record, ``ObjectKey.result()`` for an
invocation's ``obj.done``. Each used to open a JetStream consumer of its own (an ordered
consumer on the journal), so 1,200 waiters hit the stream's consumer limit, and the
consumers outlived the calls. Here a connection has at most one consumer for all its
waiters, filtered on the subject only end records are stored on (``<ns>.run.*.end``,
``Layout.ends``), delivering new records only, bodies included: no step record is sent
to a waiting client, and the end record it waits for needs no read of its own. It is
made when the first waiter comes and deleted when the last one leaves, so a client that
waits for nothing holds nothing on the server.

The watch is a hint, the journal the truth: a waiter first registers, then the
consumer exists, then the waiter reads its journal's last record: a record stored
before the consumer was made is in that read, one stored after is delivered. When the
watch may have missed records (a reconnect; a gap in the consumer's sequence; no
heartbeat for a while: a server restart), the next waiter to notice makes a new
consumer and every waiter reads again. Journals of earlier versions have their end
records on ``.j``, which this watch does not hear: a waiter reads its journal again
when it has heard nothing for ``LOOK_AGAIN`` (a worker of an earlier version that ends
the run while a client of this one waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

import anyio
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from fusee.adapters.jetstream.direct import retrying
from fusee.adapters.jetstream.layout import KIND, StoredMsg
from fusee.runtime.regions import region_lease

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

    from fusee.adapters.jetstream.layout import Layout

__all__ = ("JournalWatch", "Waiter")

HEARTBEAT = 2.0  # the consumer's idle heartbeat, asked of the server
STALE = 3 * HEARTBEAT  # nothing heard for this long: the consumer is gone, make another
INACTIVE = 30.0  # the server deletes the consumer of a client that died this long ago
LOOK_AGAIN = 30.0  # a waiter that heard nothing for this long reads its journal again
# how long a watch of a regional namespace whose stream is gone waits for the store to
# follow the failover, beyond the region lease (the deletes, the lease wait and the
# promotions of a failover lie between)
FOLLOW_PATIENCE = 60.0


class Waiter:
    """One caller's interest in one journal: the end records of ``kinds`` stored since
    it last looked, and whether the watch may have missed some."""

    def __init__(self, kinds: frozenset[str]) -> None:
        self.kinds = kinds
        self._records: list[StoredMsg] = []
        self._missed = False
        self._event = anyio.Event()
        self._looked = time.monotonic()  # the last news, or the last read it was told to do

    def _note(self, record: StoredMsg) -> None:
        self._records.append(record)
        self._event.set()

    def _lost(self) -> None:
        self._missed = True
        self._event.set()

    def _take(self) -> tuple[list[StoredMsg], bool]:
        records, missed = self._records, self._missed
        self._records, self._missed = [], False
        if self._event.is_set():
            self._event = anyio.Event()
        now = time.monotonic()
        if records or missed:
            self._looked = now
        elif now - self._looked >= LOOK_AGAIN:
            missed, self._looked = True, now  # an end stored where the watch cannot hear
        return records, missed


class JournalWatch:
    """The connection's watch on its namespace's journals (see the module doc)."""

    def __init__(self, nc: Client, js: JetStreamContext, layout: Layout) -> None:
        self.nc, self.js, self.layout = nc, js, layout
        lay = layout
        self._filter = lay.ends("*")
        self._prefix, self._suffix = lay.ends("\0").split("\0")
        self._waiters: dict[str, set[Waiter]] = {}
        self._count = 0
        self._lock = anyio.Lock()
        self._sub: Any = None  # the core subscription on the consumer's deliver subject
        self._consumer = ""
        self._next = 1  # the consumer sequence expected next
        self._heard = 0.0  # time.monotonic() of the last message or heartbeat
        self._broken = False
        self._closing: asyncio.Task[None] | None = (
            None  # the consumer's delete, after the last waiter
        )
        self.consumers_made = 0  # for tests and benchmarks
        self.delivered = 0  # records the consumer delivered (for tests and benchmarks)
        # told when the journal stream is not found (the store checks for a failover);
        # True: wait for ``follow`` (a store that follows failovers)
        self.stream_gone: Callable[[], bool] = lambda: False
        self._followed = anyio.Event()  # set (and replaced) by each follow()

    @property
    def waiting(self) -> int:
        """How many callers wait (each holds no server state of its own)."""
        return self._count

    @contextlib.asynccontextmanager
    async def watching(self, eid: str, kinds: Iterable[str]) -> AsyncIterator[Waiter]:
        """Be told of records of ``kinds`` stored in ``eid``'s journal from now on: read
        what is already there after entering, then ``await next(waiter, ...)``."""
        waiter = Waiter(frozenset(kinds))
        self._waiters.setdefault(eid, set()).add(waiter)
        self._count += 1
        try:
            async with self._lock:
                if self._sub is None:
                    await self._open()
            yield waiter
        finally:
            waiting = self._waiters.get(eid)
            if waiting is not None:
                waiting.discard(waiter)
                if not waiting:
                    del self._waiters[eid]
            self._count -= 1
            if self._count == 0 and self._closing is None:
                # the last waiter leaves (returned, timed out or cancelled): nothing of
                # it stays on the server. Deleted in the background, so the waiter's
                # answer does not wait for it (a round trip); a waiter that comes in
                # the meantime keeps it (or waits for the lock and opens another).
                self._closing = asyncio.get_running_loop().create_task(
                    self._close_if_idle(), context=contextvars.Context()
                )

    async def _close_if_idle(self) -> None:
        try:
            with anyio.move_on_after(5.0):
                async with self._lock:
                    if self._count == 0:
                        await self._close()
        finally:
            self._closing = None

    async def settled(self) -> None:
        """Until a consumer delete begun by the last waiter's leaving is done (the
        store awaits it when it closes; tests, before counting consumers)."""
        task = self._closing
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(task)

    async def next(self, waiter: Waiter, timeout: float) -> tuple[list[StoredMsg], bool]:
        """Wait up to ``timeout`` seconds for news: ``(end records of the waiter's
        kinds, in order; whether records may have been missed: then read the journal
        again)``. Both empty and False when the time passed."""
        if not self._broken:  # (broken before this waiter came: renewed at once below)
            look = waiter._looked + LOOK_AGAIN - time.monotonic()
            with anyio.move_on_after(max(0.0, min(timeout, STALE, look))):
                await waiter._event.wait()
        if self._broken or time.monotonic() - self._heard > STALE:
            await self._renew()
        return waiter._take()

    # -- the consumer -------------------------------------------------------------

    async def _open(self) -> None:
        nc = self.nc
        inbox = nc.new_inbox()
        # subscribed first: the consumer delivers from the moment it exists
        sub = await nc.subscribe(inbox, cb=self._on_msg)
        config = ConsumerConfig(
            description="fusee: callers waiting for results (one per connection)",
            deliver_subject=inbox,
            filter_subject=self._filter,
            deliver_policy=DeliverPolicy.NEW,
            ack_policy=AckPolicy.NONE,
            headers_only=False,  # end records only: the waiter needs the body, not a read
            idle_heartbeat=HEARTBEAT,
            inactive_threshold=INACTIVE,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            info = await self._add_consumer(config)
        except BaseException:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            raise
        self._sub, self._consumer = sub, info.name
        self._next, self._heard, self._broken = 1, time.monotonic(), False
        self.consumers_made += 1

    async def _add_consumer(self, config: ConsumerConfig) -> Any:
        """The watch's consumer on the journal stream. A regional namespace's stream
        not found is a failover under way (its old home's streams deleted, the mirrors
        promoted next): the store is told to check, and the consumer is made on the
        stream it follows to (``follow``), within ``FOLLOW_PATIENCE``."""
        deadline = time.monotonic() + FOLLOW_PATIENCE + region_lease()
        while True:
            followed = self._followed
            try:
                return await retrying(
                    self.js.add_consumer, self.layout.stream, config, what="a watch"
                )
            except nats.js.errors.NotFoundError:
                if not self.layout.regional or time.monotonic() > deadline:
                    raise
                if not self.stream_gone():
                    raise
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                await followed.wait()

    async def _close(self) -> None:
        sub, consumer = self._sub, self._consumer
        self._sub, self._consumer = None, ""
        if sub is None:
            return
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        # Deleted now, not when the server finds it inactive (INACTIVE) a while later:
        # one round trip on the last waiter's return (an error: INACTIVE does it)
        with contextlib.suppress(nats.errors.Error, TimeoutError, OSError):
            await self.js.delete_consumer(self.layout.stream, consumer)

    async def _renew(self) -> None:
        """A new consumer, then every waiter reads its journal again."""
        async with self._lock:
            if (
                self._sub is not None
                and not self._broken
                and (time.monotonic() - self._heard <= STALE)
            ):
                return  # another waiter renewed it meanwhile
            if self._count == 0:
                return
            await self._close()
            await self._open()
        for waiting in self._waiters.values():
            for waiter in waiting:
                waiter._lost()

    async def _on_msg(self, msg: Msg) -> None:
        self._heard = time.monotonic()
        headers = msg.headers or {}
        if not msg.reply:
            # a status message: the idle heartbeat names the last consumer sequence
            last = headers.get("Nats-Last-Consumer")
            if last is not None and last.isdigit() and int(last) != self._next - 1:
                self._lose_all()
            return
        try:
            meta = msg.metadata
        except (ValueError, IndexError, nats.errors.Error):
            return
        if meta.sequence.consumer != self._next:
            self._lose_all()  # a message was dropped (a reconnect, a slow consumer)
            return
        self._next += 1
        self.delivered += 1
        subject = msg.subject
        if not (subject.startswith(self._prefix) and subject.endswith(self._suffix)):
            return
        eid = subject[len(self._prefix) : len(subject) - len(self._suffix)]
        kind = headers.get(KIND)
        record: StoredMsg | None = None
        for waiter in self._waiters.get(eid, ()):
            if kind in waiter.kinds:
                if record is None:
                    record = StoredMsg(meta.sequence.stream, subject, msg.data, dict(headers))
                waiter._note(record)

    def follow(self, layout: Layout) -> None:
        """The namespace failed over (``NatsStore.follow_epoch``): watch ``layout``'s
        journal stream; every waiter is told its watch was lost, so it reads again
        (from the new stream) and the next watch opens a consumer there."""
        self.layout = layout
        self._followed.set()
        self._followed = anyio.Event()
        if self._sub is not None:
            self._lose_all()

    def reconnected(self) -> None:
        """The connection came back: what was stored meanwhile may not be delivered (and
        after a server restart the consumer is gone), so renew it at once."""
        if self._sub is not None:
            self._lose_all()

    def _lose_all(self) -> None:
        self._broken = True
        for waiting in self._waiters.values():
            for waiter in waiting:
                waiter._lost()
