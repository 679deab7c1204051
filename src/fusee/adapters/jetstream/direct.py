"""Reading and retrying at the JetStream boundary, shared by the store, the token
streams and the journal watch: ``retrying`` (a call tried again while NATS does not
answer, for as long as the context's patience allows), batched Direct Get, which
nats-py 2.16 lacks, and ``publish_acked``, a JetStream publish that costs less than
nats-py's on every step commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from fusee.adapters.jetstream.layout import StoredMsg
from fusee.errors import ConnectionLost, FuseeError, StorageFull

__all__ = (
    "CLIENT_PATIENCE",
    "STORAGE_FULL",
    "retrying",
    "retrying_for",
    "storage_full",
    "direct_page",
    "direct_batch",
    "direct_last",
    "publish_acked",
    "publish_acked_once",
    "drop_consumer",
)

T = TypeVar("T")

# JetStream's "insufficient resources" (10023), and its storage (10047) and memory
# (10028) resources exceeded: nothing was stored, and retrying does not help.
STORAGE_FULL = frozenset({10023, 10028, 10047})

# How long a store call retries while NATS does not answer (unreachable, restarting,
# electing a leader) before it raises ConnectionLost: bounded for client calls, so a
# caller gets an answer; a worker's actors wait as long as it takes (``retrying_for``).
CLIENT_PATIENCE = 30.0
_patience: ContextVar[float] = ContextVar("fusee_store_patience", default=CLIENT_PATIENCE)

# nats-py errors that mean "no answer (yet)": the write may or may not have happened.
_NO_ANSWER = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
)


def storage_full(exc: BaseException, what: str) -> StorageFull | None:
    """The fusee error for a JetStream refusal for want of storage, else None."""
    code = getattr(exc, "err_code", None)  # KV errors are APIErrors without one
    if not isinstance(exc, nats.js.errors.APIError) or code not in STORAGE_FULL:
        return None
    return StorageFull(
        f"the NATS server has no storage left: {what} was not stored (JetStream: "
        f"{exc.description}, err_code={code}); free space on the server or raise "
        f"its JetStream max_file_store, then retry"
    )


# Batch refusals that stored nothing and pass (ADR-50, nats-server 2.15
# server/jetstream_batching.go): 10176 "atomic publish batch is incomplete" is also
# what a batch gets when the stream (50) or the server (1,000) already holds as many
# batches in flight as it takes, or when the server dropped it as abandoned. It is
# retried like a lost reply: with a new batch id, the same Msg-Id and the same fences.
BATCH_INCOMPLETE = 10176

# On a replicated stream, a publish whose Msg-Id another copy of it (a retry racing its
# first try, sent on a lost reply or across a leader change) is being proposed with is
# answered 10158 "duplicate message id is in process": neither stored nor refused yet.
# Sent again with the same Msg-Id and fences, it gets the stored one's duplicate ack
# (or the fence's refusal, which the caller reads back). R1 never answers it.
DUPLICATE_IN_PROCESS = 10158


def _refused_for_now(exc: BaseException) -> bool:
    """A write the server answered "not now" (see ``BATCH_INCOMPLETE`` and
    ``DUPLICATE_IN_PROCESS``): trying it again as it was settles it."""
    return getattr(exc, "err_code", None) in (BATCH_INCOMPLETE, DUPLICATE_IN_PROCESS)


def _gave_up(what: str, patience: float, exc: BaseException) -> ConnectionLost:
    if getattr(exc, "err_code", None) == BATCH_INCOMPLETE:
        return ConnectionLost(
            f"NATS refused the batch for {patience:g}s ({what}: err_code {BATCH_INCOMPLETE}, "
            f"{getattr(exc, 'description', '')}: too many batches in flight on the stream, "
            f"or one abandoned or cut short); "
            f"nothing was stored"
        )
    return ConnectionLost(
        f"NATS did not answer for {patience:g}s ({what}: {type(exc).__name__}); "
        f"the operation may or may not have happened"
    )


def _closed(what: str) -> ConnectionLost:
    return ConnectionLost(f"the connection to NATS is closed ({what})")


@contextlib.contextmanager
def retrying_for(seconds: float) -> Iterator[None]:
    """Store calls made in this context (and in tasks started from it) retry for up
    to ``seconds`` while NATS does not answer, instead of ``CLIENT_PATIENCE``:
    ``math.inf`` for a worker, whose actors must ride out an outage."""
    token = _patience.set(seconds)
    try:
        yield
    finally:
        _patience.reset(token)


def patience() -> float:
    """How long a call made now retries (``retrying_for``; ``CLIENT_PATIENCE`` by default)."""
    return _patience.get()


async def retrying(
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    what: str | Callable[[], str] = "",
    give_up: float | None = None,
    refused: Callable[[], FuseeError | None] | None = None,
) -> T:
    """``fn(*args)``, tried again while NATS does not answer, until ``give_up`` (a
    ``time.monotonic()`` instant) or for as long as the context allows
    (``retrying_for``; ``CLIENT_PATIENCE`` by default). ``what`` names the call in
    errors; a callable is called only for one (a step commit's name costs µs to make).

    An atomic batch refused for the batches in flight (``BATCH_INCOMPLETE``: nothing
    was stored), and a publish whose Msg-Id is being stored by another copy of it
    (``DUPLICATE_IN_PROCESS``, R3), are tried again the same way.

    A call with no answer is not tried again when ``refused()`` returns an error (the
    server refused this connection the call's subject: nats-py sees that as a
    timeout): that error is raised.

    Raises:
        StorageFull: a write the server refused for want of storage (not retried).
        ConnectionLost: no answer in time (or a batch refused until then), or the
            connection is closed.
    """
    started, delay = time.monotonic(), 0.05
    if give_up is None:
        give_up = started + _patience.get()
    while True:
        try:
            return await fn(*args)
        except nats.js.errors.APIError as exc:
            if (full := storage_full(exc, _named(what, fn, args))) is not None:
                raise full from None
            if not isinstance(exc, nats.js.errors.ServiceUnavailableError) and not (
                _refused_for_now(exc)
            ):
                raise
            # JetStream not ready (a restart, an election), a batch refused for the
            # batches in flight, or its Msg-Id in process: tried again as it was
            failed: BaseException = exc
        except _NO_ANSWER as exc:
            if refused is not None and (denied := refused()) is not None:
                raise denied from None
            failed = exc
        except nats.errors.ConnectionClosedError:
            raise _closed(_named(what, fn, args)) from None
        if time.monotonic() + delay >= give_up:
            raise _gave_up(_named(what, fn, args), give_up - started, failed) from None
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


def _named(what: str | Callable[[], str], fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
    if callable(what):
        return what()
    if what:
        return what
    # the call itself, e.g. "KeyValue.put('r1')"
    name = getattr(fn, "__qualname__", "") or getattr(fn, "__name__", "a call")
    return f"{name}({args[0]!r})" if args and isinstance(args[0], str) else name


class _Replies:
    """One reply subscription per connection (``<inbox>.<n>`` per request) for every
    batched Direct Get and every acked publish it makes: a subscribe and an unsubscribe
    per read cost two protocol round trips' worth of work on every journal and inbox
    read."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox()
        self.queues: dict[str, asyncio.Queue[Msg]] = {}
        self.acks: dict[str, asyncio.Future[Msg]] = {}
        self.sub: Any = None
        self.n = 0
        self.lock = asyncio.Lock()

    async def open(self) -> None:
        if self.sub is not None:
            return
        async with self.lock:
            if self.sub is None:
                self.sub = await self.nc.subscribe(f"{self.prefix}.*", cb=self._on_msg)

    async def _on_msg(self, msg: Msg) -> None:
        ack = self.acks.pop(msg.subject, None)
        if ack is not None:
            if not ack.done():
                ack.set_result(msg)
            return
        queue = self.queues.get(msg.subject)
        if queue is not None:
            queue.put_nowait(msg)

    def new(self) -> tuple[str, asyncio.Queue[Msg]]:
        self.n += 1
        subject = f"{self.prefix}.{self.n}"
        queue: asyncio.Queue[Msg] = asyncio.Queue()
        self.queues[subject] = queue
        return subject, queue

    def new_ack(self) -> tuple[str, asyncio.Future[Msg]]:
        self.n += 1
        subject = f"{self.prefix}.{self.n}"
        ack: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self.acks[subject] = ack
        return subject, ack


_REPLIES: weakref.WeakKeyDictionary[Client, _Replies] = weakref.WeakKeyDictionary()


async def _replies(nc: Client) -> _Replies:
    replies = _REPLIES.get(nc)
    if replies is None:
        replies = _REPLIES[nc] = _Replies(nc)
    if replies.sub is None:
        await replies.open()
    return replies


class _PubAck(msgspec.Struct):
    seq: int = 0
    duplicate: bool = False
    error: dict[str, Any] | None = None


_PUB_ACK = msgspec.json.Decoder(_PubAck)


async def publish_acked(
    nc: Client, subject: str, data: bytes, headers: dict[str, str], timeout: float
) -> int:
    """A JetStream publish: ``data`` on ``subject``, its stream sequence once stored (a
    duplicate's ack names the original's). It raises what ``JetStreamContext.publish``
    raises (``APIError`` and its subclasses with the server's ``err_code``,
    ``NoStreamResponseError``, nats ``TimeoutError``), at less cost per call: the reply
    comes on this connection's reply subscription and wakes the caller's future, where
    nats-py's request hops through ``asyncio.wait_for`` (one more trip through the event
    loop), draws random bytes for every reply subject and builds a ``PubAck`` by
    reflection. A step commit is one of these (see "A step's time beyond the floor" in
    docs/design.md)."""
    return (await _publish(nc, subject, data, headers, timeout)).seq


async def publish_acked_once(
    nc: Client, subject: str, data: bytes, headers: dict[str, str], timeout: float
) -> tuple[int, bool]:
    """:func:`publish_acked`, and whether the server took the message for a duplicate
    of one with the same ``Nats-Msg-Id`` (the sequence is then the earlier one's): the
    ``duplicate`` of nats-py's ``PubAck``, at the same round trip."""
    ack = await _publish(nc, subject, data, headers, timeout)
    return ack.seq, ack.duplicate


async def _publish(
    nc: Client, subject: str, data: bytes, headers: dict[str, str], timeout: float
) -> _PubAck:
    replies = await _replies(nc)
    inbox, ack = replies.new_ack()
    try:
        await nc.publish(subject, data, reply=inbox, headers=headers)
        try:
            async with asyncio.timeout(timeout):
                msg = await ack
        except TimeoutError:
            raise nats.errors.TimeoutError from None
    finally:
        replies.acks.pop(inbox, None)
    if msg.headers and msg.headers.get("Status") == "503":
        raise nats.js.errors.NoStreamResponseError
    reply = _PUB_ACK.decode(msg.data)
    if reply.error is not None:
        raise nats.js.errors.APIError.from_error(reply.error)
    return reply


async def direct_page(
    nc: Client, api: str, subject: str, start: int, batch: int
) -> AsyncIterator[tuple[int, dict[str, str], bytes]]:
    """One batched Direct Get (nats-py has no API for it) on ``api``
    (``$JS.API.DIRECT.GET.<stream>``): up to ``batch`` messages of ``subject`` from
    sequence ``start``, as ``(sequence, headers, data)``, yielded as they arrive, ending
    on the server's EOB. Shared by the journal reads (``direct_batch``) and the token streams.
    """
    request = {"seq": start, "next_by_subj": subject, "batch": batch}
    async for found in _direct_request(nc, api, request, subject):
        yield found


async def _direct_request(
    nc: Client, api: str, request: dict[str, Any], what: str
) -> AsyncIterator[tuple[int, dict[str, str], bytes]]:
    replies = await _replies(nc)
    inbox, queue = replies.new()
    try:
        await nc.publish(api, json.dumps(request).encode(), reply=inbox)
        while True:
            try:
                async with asyncio.timeout(5.0):
                    msg = await queue.get()
            except TimeoutError:
                raise nats.errors.TimeoutError from None
            headers = dict(msg.headers or {})
            status = headers.get("Status")
            if status is None:
                yield int(headers["Nats-Sequence"]), headers, msg.data
                continue
            if status in ("204", "404"):  # end of batch / nothing there
                return
            if status == "503":  # no responders: JetStream is (re)starting; retried
                raise nats.errors.NoRespondersError
            raise FuseeError(f"direct get {what}: {status} {headers.get('Description')}")
    finally:
        replies.queues.pop(inbox, None)


async def direct_batch(
    nc: Client, stream: str, subject: str, start: int, *, limit: int = 0
) -> list[StoredMsg]:
    """Every message on ``subject`` of ``stream`` from sequence ``start`` (the first
    ``limit`` only, if given), by batched Direct Get in pages of 1,000, each page
    retried while NATS does not answer."""
    out: list[StoredMsg] = []
    seq = start
    while True:
        page = await retrying(
            _page, nc, stream, subject, seq, 1000, what=f"direct_batch({subject!r})"
        )
        out.extend(page)
        if limit and len(out) >= limit:
            return out[:limit]
        if len(page) < 1000:
            return out
        seq = page[-1].seq + 1


async def direct_pages(
    nc: Client, stream: str, subject: str, start: int, page: int
) -> AsyncIterator[list[StoredMsg]]:
    """The messages on ``subject`` of ``stream`` from sequence ``start``, a page of at
    most ``page`` at a time (one batched Direct Get each, retried while NATS does not
    answer): for a reader that must not hold them all."""
    seq = start
    while True:
        found = await retrying(
            _page, nc, stream, subject, seq, page, what=f"direct_pages({subject!r})"
        )
        if found:
            yield found
        if len(found) < page:
            return
        seq = found[-1].seq + 1


async def _page(nc: Client, stream: str, subject: str, start: int, batch: int) -> list[StoredMsg]:
    api = f"$JS.API.DIRECT.GET.{stream}"
    return [
        StoredMsg(seq, headers.get("Nats-Subject", subject), data, headers)
        async for seq, headers, data in direct_page(nc, api, subject, start, batch)
    ]


async def direct_last(nc: Client, stream: str, subjects: list[str]) -> list[StoredMsg]:
    """The last message of each of ``subjects`` that has one (subjects with none are
    left out), by batched Direct Get (``multi_last``: one request per 1,000 subjects,
    the server answering 1,024 messages at most, else 413), each retried while NATS
    does not answer."""

    async def read(some: list[str]) -> list[StoredMsg]:
        api = f"$JS.API.DIRECT.GET.{stream}"
        request = {"multi_last": some, "batch": len(some)}
        return [
            StoredMsg(seq, headers.get("Nats-Subject", ""), data, headers)
            async for seq, headers, data in _direct_request(nc, api, request, "multi_last")
        ]

    out: list[StoredMsg] = []
    for i in range(0, len(subjects), 1000):
        some = subjects[i : i + 1000]
        out.extend(await retrying(read, some, what=f"the last messages of {len(some)} subjects"))
    return out


async def drop_consumer(nc: Client, stream: str, name: str) -> None:
    """Ask the server to delete the ephemeral consumer ``name`` of ``stream`` now, and
    wait for nothing: its ``inactive_threshold`` removes it anyway if the request is
    lost, or refused (the worker and client roles of ``nats/accounts.conf`` may not
    delete consumers; a refused request would wait for its timeout, in the caller's
    way). The reply goes to an inbox nobody reads. (The journal watch's delete runs in
    the background and waits for its answer: a test counts consumers after it.)"""
    with contextlib.suppress(nats.errors.Error, OSError):
        await nc.publish(f"$JS.API.CONSUMER.DELETE.{stream}.{name}", b"", reply=nc.new_inbox())
