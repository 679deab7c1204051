"""Token streams on JetStream: a second stream per namespace, ``<NS>_TOKENS``.

One subject per stream, ``<ns>.tok.<run eid>.<escaped stream name>``, one message per
chunk of text (the kinds and headers are in ``fusee.runtime.tokens``). The writer is the
run's actor, alone: publishes are pipelined (a window of unacknowledged messages, never
one round trip per token) and every ack is awaited before the step commits.

Readers find where to start with a few single Direct Gets (an interpolation search
over stream sequences on the ``Fusee-Index`` header), catch up with batched Direct Get
(no server-side state), then follow with an ordered push consumer from the next
sequence. A second ordered consumer on the run's journal tells them when the stream is
over (``fusee.runtime.tokens.StreamEnd``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Final

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy, Placement, StorageType, StreamConfig

from fusee.adapters.jetstream.direct import direct_batch, direct_page, retrying
from fusee.errors import FuseeError, NotEncodable, RunNotFound, StreamNotFound
from fusee.runtime.ids import escape, unescape
from fusee.runtime.records import RunContinued, decode_record
from fusee.runtime.tokens import (
    ATTEMPT_HEADER,
    INDEX_HEADER,
    KIND_HEADER,
    StoredState,
    StreamEnd,
    TokenEvent,
    event_from,
    generation_stream,
    parse_invocation_stream,
)

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

    from fusee.adapters.jetstream.layout import Layout

__all__ = ("TokenStore", "TokenWriter", "DEFAULT_MAX_AGE")

DEFAULT_MAX_AGE: Final = 7 * 24 * 3600.0
"""How long token streams are kept, in seconds, unless configured: 7 days."""

WINDOW: Final = 1024  # unacknowledged publishes per writer (one on a replicated stream)
ACK_TIMEOUT: Final = 5.0  # seconds without progress before a writer gives up
FIRST_PAGE: Final = 8  # a small first page: the first token comes sooner (64: +1.5 ms)
PAGE: Final = 1000
FINAL_HEADROOM: Final = 4096  # bytes of an end marker's message left for its headers


class TokenStore:
    """The namespace's token streams: writers for the run actors, readers for anyone."""

    def __init__(
        self,
        nc: Client,
        js: JetStreamContext,
        layout: Layout,
        *,
        replicas: int = 1,
        max_age: float = DEFAULT_MAX_AGE,
    ) -> None:
        self.nc = nc
        self.js = js
        self.layout = layout
        self.replicas = replicas
        self.max_age = max_age
        # Publishes a writer leaves unacknowledged. Each checks the stream's claim
        # subject (Nats-Expected-Last-Subject-Sequence-Subject); a replicated stream's
        # leader refuses a check of a subject that another proposal in flight checks
        # (10164, "wrong last sequence"), so there a writer waits for each ack: about
        # one round of the stream's quorum per chunk (a model's 50-200 chunks a second
        # fit many times over). Set from the stream's replicas by ``ensure``.
        self.window = WINDOW if replicas == 1 else 1
        ns = layout.namespace
        self.namespace = ns
        self.stream = layout.tokens_stream
        self._direct = f"$JS.API.DIRECT.GET.{self.stream}"

    def follow(self, layout: Layout) -> None:
        """The namespace failed over (``NatsStore.follow_epoch``): the token streams of
        ``layout``'s epoch from now on (the old home's, promoted: offsets carry over)."""
        self.layout = layout
        self.stream = layout.tokens_stream
        self._direct = f"$JS.API.DIRECT.GET.{self.stream}"

    def subject(self, eid: str, name: str) -> str:
        """``<ns>.tok.<run eid>.<escaped name>``."""
        return f"{self.namespace}.tok.{eid}.{escape(name)}"

    async def names(self, eid: str) -> dict[str, int]:
        """The streams of run ``eid`` that hold anything (within the stream's
        ``max_age``), each with its message count (tokens and markers): the subjects
        the stream's info lists under the run's prefix (a writer's claim, one token
        deeper, left out), no message read."""
        prefix = f"{self.namespace}.tok.{eid}."
        info = await retrying(self.js.stream_info, self.stream, prefix + ">")
        out: dict[str, int] = {}
        for subject, count in sorted((info.state.subjects or {}).items()):
            rest = subject[len(prefix) :]
            if "." in rest:  # the writer's claim, `<stream subject>.w`: not the stream's
                continue
            out[unescape(rest)] = count
        return out

    def config(self) -> StreamConfig:
        replicas = self.replicas
        return StreamConfig(
            name=self.stream,
            description="fusee: token streams of model calls",
            subjects=[f"{self.namespace}.tok.>"],
            storage=StorageType.FILE,
            num_replicas=replicas,
            # a namespace with a home region keeps its streams inside that region's cluster
            placement=Placement(cluster=self.layout.home) if self.layout.home else None,
            max_age=self.max_age,
            allow_direct=True,
            deny_delete=True,
            deny_purge=True,
            duplicate_window=min(120.0, self.max_age),
            # R1 only (ADR-56): acks before the fsync. A token lost in a host crash is
            # rebuilt from the step's journaled result; see docs/design.md.
            persist_mode="async" if replicas == 1 else None,  # type: ignore[arg-type]  # nats-py takes the str value
        )

    async def ensure(self, refused: Callable[[], FuseeError | None] | None = None) -> None:
        """Create the tokens stream if it is missing (idempotent); a retention that
        differs from the configured one is updated (the rest of the config never is).
        Each call is tried again while NATS does not answer, unless ``refused()`` names
        a refusal (``retrying``)."""
        try:
            info = await retrying(self.js.stream_info, self.stream, refused=refused)
        except nats.js.errors.NotFoundError:
            with contextlib.suppress(nats.js.errors.BadRequestError):
                await retrying(self.js.add_stream, self.config(), refused=refused)
            self.window = WINDOW if self.replicas == 1 else 1
            return
        self.window = WINDOW if (info.config.num_replicas or 1) == 1 else 1
        if abs((info.config.max_age or 0.0) - self.max_age) > 0.001:
            info.config.max_age = self.max_age
            await retrying(self.js.update_stream, info.config, refused=refused)

    # -- writing ------------------------------------------------------------------

    async def open(self, eid: str, name: str) -> TokenWriter:
        """A writer for stream ``name`` of run ``eid``, positioned after what is stored.

        The writer first claims the stream: a message on ``<subject>.w``, appended only
        if that subject's last message is still the one it read (compare-and-set). Every
        token it publishes then carries an expected-last-sequence check on that claim
        subject, so once a newer writer has claimed the stream (the run moved to another
        worker while this one was stopped), this writer's publishes are refused instead
        of landing among the new writer's tokens. The check is the same for every
        publish of a writer, so publishes stay pipelined. The state is read after the
        claim: nothing an older writer sends can land after it.
        """
        subject = self.subject(eid, name)
        claim = await self._claim(f"{subject}.w")
        state = StoredState()
        async for event, data in self._stored(subject, 1, first_page=PAGE):
            state.feed(event, data)
        writer = TokenWriter(self, subject, state, claim=(f"{subject}.w", claim))
        await writer._start()
        return writer

    async def _claim(self, subject: str) -> int:
        js = self.js
        while True:
            try:
                last = await js.get_last_msg(self.stream, subject, direct=True)
                expected = last.seq or 0
            except nats.js.errors.NotFoundError:
                expected = 0
            try:
                ack = await js.publish(
                    subject,
                    b"",
                    headers={
                        KIND_HEADER: "claim",
                        "Nats-Expected-Last-Subject-Sequence": str(expected),
                    },
                    timeout=5.0,
                )
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code in (10071, 10164):  # (10164: a write in flight, R3)
                    continue  # another writer claimed in between: read again
                raise
            return ack.seq

    # -- reading ------------------------------------------------------------------

    async def read(self, eid: str, name: str, offset: int = 0) -> AsyncGenerator[TokenEvent, None]:
        """Every event of stream ``name`` of run ``eid`` from token index ``offset``:
        in order, no gap, no duplicate; stored events first, then live ones.

        Events with an index below ``offset`` are skipped; a marker at index ``offset``
        is included. The iterator ends at the stream's ``end`` marker (nothing is
        written after it: a new attempt of its step takes the stored text as its
        result), or once the stream is over without one (its step failed for good, or
        the run ended) and every stored event was given; a truncated stream ends
        without an ``end`` event. (A stream whose name is not its step's, as Pydantic
        AI's ``<step name>/<n>``, ends so while the run goes on.)

        Raises:
            RunNotFound: no run ``eid``.
            StreamNotFound: the run is over and never had a stream ``name``.
        """
        if offset < 0:
            raise ValueError("offset must be >= 0")
        subject = self.subject(eid, name)
        watch = StreamEnd(name)
        after = 0
        invocation = parse_invocation_stream(name) if unescape(eid).startswith("@") else None
        if invocation is not None:
            # an object invocation's stream: its records come after its inbox message
            after = invocation[0]
            watch = StreamEnd(invocation[1], started=True, invocation=after)
        # Both first: the journal must be read before the catch-up (see below), and
        # neither waits for the other, so the first token comes one round trip sooner.
        journal, (start, exists) = await asyncio.gather(
            direct_batch(self.nc, self.layout.stream, self.layout.tree(eid), after + 1),
            self._seek(subject, offset),
        )
        generation = 0
        for msg in journal:
            record = decode_record(msg.data)
            if invocation is None and isinstance(record, RunContinued):
                # a later generation: its own stream (``generation_stream``), its records
                generation, watch = msg.seq, StreamEnd(name, started=True)
                continue
            watch.feed(record)
        if not watch.started:
            raise RunNotFound(f"no run {unescape(eid)!r} in namespace {self.namespace!r}")
        if generation:
            # the run's current generation streams under another name: seek that one
            subject = self.subject(eid, generation_stream(generation, False, name))
            start, exists = await self._seek(subject, offset)
        journal_last = journal[-1].seq if journal else after
        last = start - 1
        async with contextlib.aclosing(self._catch_up(subject, start)) as stored:
            async for event in stored:
                last = event.cursor
                exists = True
                if event.index >= offset:
                    yield event
                if event.kind == "end":
                    return  # the stream's own end
        if watch.is_over():
            # The journal was read before the catch-up: everything was stored by then.
            if not exists:
                raise self._not_found(eid, name)
            return

        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        async def on_token(msg: Msg) -> None:
            queue.put_nowait(("token", msg))

        async def on_record(msg: Msg) -> None:
            queue.put_nowait(("record", msg))

        js = self.js
        subs = []
        try:
            subs.append(
                await js.subscribe(
                    self.layout.tree(eid),  # the journal and its end records
                    ordered_consumer=True,
                    cb=on_record,
                    stream=self.layout.stream,
                    config=ConsumerConfig(
                        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                        opt_start_seq=journal_last + 1,
                    ),
                )
            )
            subs.append(
                await js.subscribe(
                    subject,
                    ordered_consumer=True,
                    cb=on_token,
                    stream=self.stream,
                    config=ConsumerConfig(
                        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                        opt_start_seq=last + 1,
                    ),
                )
            )
            while True:
                what, msg = await queue.get()
                if what == "record":
                    watch.feed(decode_record(msg.data))
                    if not watch.is_over():
                        continue
                    # Every token was stored before this record: take what the consumer
                    # has not delivered yet straight from the stream, and stop.
                    async with contextlib.aclosing(self._catch_up(subject, last + 1)) as rest:
                        async for event in rest:
                            last = event.cursor
                            exists = True
                            if event.index >= offset:
                                yield event
                            if event.kind == "end":
                                return
                    if not exists:
                        raise self._not_found(eid, name)
                    return
                seq = msg.metadata.sequence.stream
                if seq <= last:
                    continue  # already given by the catch-up
                live = event_from(seq, dict(msg.headers or {}), msg.data)
                last = seq
                exists = True
                if live is not None and live.index >= offset:
                    yield live
                if live is not None and live.kind == "end":
                    return  # the stream's own end, whether or not its step is journaled
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    def _not_found(self, eid: str, name: str) -> StreamNotFound:
        return StreamNotFound(
            f"run {unescape(eid)!r} has no token stream {name!r} (the run is over, or the "
            f"step of that name ended without one, or it expired)"
        )

    async def _seek(self, subject: str, offset: int) -> tuple[int, bool]:
        """``(sequence to read from, whether the subject holds anything)``: the first
        message whose index is ``offset`` or more, or the one after the last."""
        if offset == 0:
            return 1, False  # the catch-up skips to the subject's first message
        last = await self._get_last(subject)
        if last is None:
            return 1, False
        if last.index < offset:
            return last.cursor + 1, True
        # Indexes never decrease along the subject. Interpolate between the nearest
        # known message below the target and the best one at or above it; tokens of one
        # writer are dense in the stream, so this lands in two or three probes.
        lo, lo_index = 1, -1  # candidates are >= lo; the message before lo has lo_index
        best, best_index = last.cursor, last.index  # the answer so far
        top = best - 1  # probes go up to here
        probes = 0
        while lo <= top:
            probes += 1
            if probes <= 6 and best_index > lo_index:
                span = best - lo
                guess = lo + (offset - 1 - lo_index) * span // max(1, best_index - lo_index)
                mid = min(top, max(lo, guess))
            else:
                mid = (lo + top) // 2
            found = await self._get_next(subject, mid)
            if found is None or found.cursor > top:
                top = mid - 1  # nothing of the subject in [mid, top]
            elif found.index >= offset:
                best, best_index = found.cursor, found.index
                top = mid - 1
            else:
                lo, lo_index = found.cursor + 1, found.index
        return best, True

    async def _get_last(self, subject: str) -> TokenEvent | None:
        return await self._get(f"{self._direct}.{subject}", b"")

    async def _get_next(self, subject: str, seq: int) -> TokenEvent | None:
        payload = json.dumps({"seq": seq, "next_by_subj": subject}).encode()
        return await self._get(self._direct, payload)

    async def _get(self, api: str, payload: bytes) -> TokenEvent | None:
        msg = await retrying(self.nc.request, api, payload, 2.0)
        headers = dict(msg.headers or {})
        status = headers.get("Status")
        if status == "404":
            return None
        if status is not None:
            raise FuseeError(f"direct get on {self.stream}: {status} {headers.get('Description')}")
        return event_from(int(headers["Nats-Sequence"]), headers, msg.data)

    async def _catch_up(
        self, subject: str, start: int, *, first_page: int = FIRST_PAGE
    ) -> AsyncGenerator[TokenEvent, None]:
        """Stored events of ``subject`` from sequence ``start``, by batched Direct Get,
        yielded as they arrive, until the end of what is stored."""
        async for event, _ in self._stored(subject, start, first_page=first_page):
            yield event

    async def _stored(
        self, subject: str, start: int, *, first_page: int
    ) -> AsyncIterator[tuple[TokenEvent, bytes]]:
        """``_catch_up``'s events with their messages' payloads."""
        batch = first_page
        seq = start
        while True:
            got = 0
            async for stored_seq, headers, data in direct_page(
                self.nc, self._direct, subject, seq, batch
            ):
                got += 1
                seq = stored_seq + 1
                event = event_from(stored_seq, headers, data)
                if event is not None:
                    yield event, data
            if got < batch:
                return
            batch = PAGE


class TokenWriter:
    """The single writer of one token stream, for one attempt of its step.

    Attributes:
        state: the stream as stored when the writer opened (see ``StoredState``); it
            follows the writes.
    """

    def __init__(
        self, tokens: TokenStore, subject: str, state: StoredState, *, claim: tuple[str, int]
    ) -> None:
        self.tokens = tokens
        self.claim_subject, self.claim_seq = claim
        self.nc = tokens.nc
        self.subject = subject
        self.state = state
        self._prefix = self.nc.new_inbox()
        self._sent = 0
        self._acked = 0
        self._error: str | None = None
        self._progress = asyncio.Event()
        self._sub: Any = None

    async def _start(self) -> None:
        self._sub = await self.nc.subscribe(f"{self._prefix}.*", cb=self._on_ack)

    async def _on_ack(self, msg: Msg) -> None:
        status = (msg.headers or {}).get("Status")
        if status is not None:
            self._error = self._error or f"{status} {(msg.headers or {}).get('Description')}"
        elif msg.data.startswith(b'{"error"') or b'"error":' in msg.data[:40]:
            self._error = self._error or msg.data.decode(errors="replace")
        self._acked += 1
        self._progress.set()

    @property
    def attempt(self) -> int:
        return self.state.attempt

    async def _publish(self, kind: str, data: bytes, index: int) -> None:
        if self._error is not None:
            raise FuseeError(f"token stream {self.subject}: a publish failed: {self._error}")
        while self._sent - self._acked >= self.tokens.window:
            await self._wait_progress()
        headers = {
            KIND_HEADER: kind,
            INDEX_HEADER: str(index),
            ATTEMPT_HEADER: str(self.state.attempt),
            # refused once a newer writer claimed the stream (see TokenStore.open)
            "Nats-Expected-Last-Subject-Sequence": str(self.claim_seq),
            "Nats-Expected-Last-Subject-Sequence-Subject": self.claim_subject,
        }
        self._sent += 1
        try:
            await self.nc.publish(
                self.subject, data, reply=f"{self._prefix}.{self._sent}", headers=headers
            )
        except (
            nats.errors.ConnectionClosedError,
            nats.errors.OutboundBufferLimitError,
        ) as exc:
            self._error = str(exc) or type(exc).__name__
            raise FuseeError(f"token stream {self.subject}: cannot publish ({exc})") from None

    async def _wait_progress(self) -> None:
        self._progress.clear()
        try:
            async with asyncio.timeout(ACK_TIMEOUT):
                await self._progress.wait()
        except TimeoutError:
            raise FuseeError(
                f"token stream {self.subject}: no ack from NATS for {ACK_TIMEOUT:g}s "
                f"({self._sent - self._acked} publishes unacknowledged)"
            ) from None

    async def write(self, text: str) -> None:
        """Append one chunk (pipelined: returns before it is stored)."""
        if not text:
            return
        try:
            data = text.encode()
        except UnicodeEncodeError as exc:
            raise NotEncodable(f"a chunk of {self.subject} is not valid Unicode: {exc}") from None
        await self._publish("token", data, self.state.next_index)
        self.state.next_index += 1
        self.state.chunks.append(text)

    async def restart(self) -> None:
        """Record an attempt boundary: what follows replaces the latest attempt's text."""
        self.state.attempt += 1
        await self._publish("attempt", b"", self.state.next_index)
        self.state.chunks = []
        self.state.broken = False
        self.state.ended = False
        self.state.final = b""

    async def end(self, final: bytes = b"") -> None:
        """Store the end marker, with ``final`` as its payload (see ``StoredState``),
        and wait until everything written is stored. A ``final`` too big for one message
        is left out (the marker is stored without it)."""
        if len(final) > self.nc.max_payload - FINAL_HEADROOM:
            final = b""
        await self._publish("end", final, self.state.next_index)
        await self.flush()
        self.state.ended = True
        self.state.final = final

    async def flush(self) -> None:
        """Wait until every publish so far is acknowledged.

        Raises:
            FuseeError: a publish failed, or NATS stopped acknowledging.
        """
        while self._acked < self._sent and self._error is None:
            await self._wait_progress()
        if self._error is not None:
            raise FuseeError(f"token stream {self.subject}: a publish failed: {self._error}")

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
