"""A handle on one run, by ID: ``engine.run("support-42")``.

It reads the run's journal and sends to its inbox through the narrow ``Client``
interface (``_client.py``), so it needs nothing private of the engine.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncGenerator
from datetime import timedelta
from typing import Any

import anyio
import msgspec

from fusee._client import Client
from fusee.actors.ports import SCHEDULER, StoredMessage, scheduled_by
from fusee.actors.starts import start_marker
from fusee.errors import (
    FuseeError,
    InvalidArgument,
    JournalGap,
    NotPausedError,
    RunCancelled,
    RunFailed,
    RunNotFound,
    Timeout,
)
from fusee.logs import get_logger
from fusee.runtime.codec import decode_value
from fusee.runtime.durations import parse_duration
from fusee.runtime.history import History, load_journal
from fusee.runtime.ids import escape, partition_of, validate_id, validate_name
from fusee.runtime.inbox import Cancel, Resume, encode_message, signal_message
from fusee.runtime.index import RunInfo, decode_info, info_from_history
from fusee.runtime.records import RunCancelled as RunCancelledRecord
from fusee.runtime.records import RunCompleted, decode_record, unfold
from fusee.runtime.records import RunFailed as RunFailedRecord
from fusee.runtime.tokens import TokenEvent

__all__ = ("Run", "ENDED", "DurationLike")

DurationLike = str | float | int | timedelta

# The kinds of the records that end a run.
ENDED = ("run.completed", "run.failed", "run.cancelled")


log = get_logger()


class Run:
    """A handle on one run, by ID."""

    def __init__(self, engine: Client, run_id: str, *, exists: bool = False) -> None:
        self.engine = engine
        self.run_id = run_id
        self.eid = escape(run_id)
        # The run was seen to exist (started by this handle's engine, or its journal
        # read): a signal or cancel need not ask again, since a journal is never deleted.
        self._exists = exists
        # Set by ``Engine.start``: True when that start made the run, False when the run
        # was there already (same workflow and input); None on a handle of ``run()``.
        self.created: bool | None = None
        self._first: bytes | None = None  # the journal's first record, as last read
        self._last = 0  # the journal's last sequence, as last read
        self.partition = partition_of(run_id, engine.partitions)

    def __repr__(self) -> str:
        return f"Run({self.run_id!r})"

    async def _read(self) -> tuple[History, JournalGap | None]:
        """The journal, folded up to its first break no forced resume accepted (and
        that break, or None)."""
        history = History(self.run_id)
        self._first, self._last = None, 0
        messages = await self.engine.store.read_journal(self.eid)
        if messages:
            self._first, self._last = messages[0].data, messages[-1].seq
        try:
            load_journal(
                history, [(m.seq, m.data) for m in messages], scheduled=scheduled_by(messages)
            )
        except JournalGap as gap:
            return history, gap
        if history.started is None:
            raise RunNotFound(f"no run {self.run_id!r} in namespace {self.engine.namespace!r}")
        return history, None

    async def _history(self) -> History:
        history, gap = await self._read()
        if gap is not None:
            raise gap
        return history

    async def describe(self) -> RunInfo:
        """The run's status, from its journal (and the worker's note when it waits). A
        run whose journal's chain is broken is ``paused``, its ``reason`` naming the
        break (as its worker notes it once it meets the break)."""
        history, gap = await self._read()
        if gap is not None:
            return await self._broken(history, gap)
        info = info_from_history(history, now=time.time())
        entry = await self.engine.store.get_index_entry(self.eid)
        noted = decode_info(entry[0]) if entry is not None and entry[0] else None
        if noted is not None:
            info.updated_at = noted.updated_at
        if info.ended or info.status == "paused":
            return info
        if noted is not None and noted.ended:
            info.status = "running"  # the index is ahead of what was read: reread
        elif noted is not None and entry is not None and entry[1] >= history.last_seq:
            # the worker's note (waiting, or why nobody runs it) on all of the journal
            info.status, info.reason = noted.status, noted.reason
        elif await self.engine.store.owner_alive(info.partition):
            info.status = "running"  # its partition's owner lives: it runs or will at once
        return info

    async def _broken(self, history: History, gap: JournalGap) -> RunInfo:
        """What ``describe()`` says of a run whose chain breaks at ``gap``: paused, from
        what was read before the break (or its index entry, when nothing was)."""
        entry = await self.engine.store.get_index_entry(self.eid)
        noted = decode_info(entry[0]) if entry is not None and entry[0] else None
        if history.started is not None:
            info = info_from_history(history, now=time.time())
        elif noted is not None:
            info = noted
        else:  # (not even its first record can be read)
            info = RunInfo(
                run_id=self.run_id, workflow="", status="paused", partition=self.partition
            )
        info.status, info.reason = "paused", str(gap)
        info.error_type = info.message = info.step = info.attempts = None
        if noted is not None:
            info.updated_at = noted.updated_at
        return info

    async def resume(self, *, force: bool = False, dry_run: bool = False) -> None:
        """Resume the run where it paused: a step whose attempts ran out under
        ``Retry(on_exhausted="pause")`` runs again with a fresh retry budget; a run
        paused because its code no longer matched its journal is replayed by the code
        deployed now (it pauses again if that does not match either). Durable once it
        returns. Not idempotent across what follows: two resumes of one pause resume it
        once, and a resume retried after a lost reply while the run is still in that
        pause stores nothing new; once the first took, a retry raises NotPausedError
        while the run is running or after it ended, and resumes the new pause if the
        run has paused again (a caller cannot tell its own resume from another's).
        ``force``: resume a run paused on a broken journal chain (a record missing or
        replaced), taking the chain as it is at every break it has now (what the
        missing records held is lost to its replay); a break that comes later needs
        another ``force``. ``dry_run``: the same checks (one read of the journal),
        raising what a resume would raise now, and nothing stored (what
        ``bulk_resume(dry_run=True)`` asks of each run).

        Raises:
            RunNotFound: no such run.
            NotPausedError: the run is not paused (running, waiting, ended: nothing is
                stored), or it is paused on a broken chain and ``force`` is not set.

        Example:
            ``await engine.run("support-42").resume()``
        """
        for name, flag in (("force", force), ("dry_run", dry_run)):
            if not isinstance(flag, bool):
                raise InvalidArgument(f"{name}={flag!r}: must be a bool")
        try:
            history = await self._history()
        except JournalGap as gap:
            if not force:
                raise NotPausedError(
                    self.run_id,
                    "paused",
                    f"run {self.run_id!r} is paused on a broken journal chain ({gap}); "
                    f"resume(force=True) (fusee runs resume --force) runs it on from the "
                    f"journal as it is, without what the missing records held",
                ) from None
            # every break up to the journal's end as read now is taken, not only the
            # first (a second one would pause it again, and a retry be the same message);
            # a later break needs a later force, a new message
            msg = Resume(force=True, gap=self._last)
            msg_id = f"{self.eid}:resume:gap:{self._last}"
        else:
            if history.paused is None:
                status = info_from_history(history, now=time.time()).status
                if status == "pending":
                    status = "running"
                raise NotPausedError(
                    self.run_id,
                    status,
                    f"run {self.run_id!r} is not paused ({status}): nothing to resume",
                )
            msg = Resume(paused=history.paused_seq)
            msg_id = f"{self.eid}:resume:{history.paused_seq}"
        if dry_run:
            return  # (an end that lands before a real resume's write: NotPausedError then)
        store = self.engine.store
        body = encode_message(msg)
        if (
            await store.send_unless_ended(self.partition, self.eid, "resume", body, msg_id=msg_id)
            is None
        ):
            raise NotPausedError(
                self.run_id, "ended", f"run {self.run_id!r} ended: nothing to resume"
            )
        # the paused run left the active runs: its marker brings it back to an owner,
        # who reads the message (also after a restart, with no consumer to deliver it)
        assert self._first is not None
        await store.mark_run_active(
            self.partition, self.eid, start_marker(self.run_id, self._first, now=time.time())
        )

    async def journal(self, *, after: int = 0) -> list[tuple[int, Any]]:
        """The run's records as ``(sequence, record)``, oldest first (those stored
        above stream sequence ``after``: the rest of a journal read before). A wait's
        end that rode on a later record (its ``waited``) is listed as its own
        ``WaitDone`` at that record's sequence, just before it, as if it had been
        journaled alone.

        Raises:
            JournalGap: a record cannot be read (emptied or replaced, e.g. by a
                ``Nats-Rollup`` header on its subject), naming its sequence.
        """
        out: list[tuple[int, Any]] = []
        for m in await self.engine.store.read_journal(self.eid, after):
            if (by := m.headers.get(SCHEDULER)) is not None:
                raise JournalGap(
                    f"run {self.run_id!r}: the journal record at sequence {m.seq} was "
                    f"written by a message schedule (on {by}), never by fusee: forged",
                    seq=m.seq,
                )
            try:
                record = decode_record(m.data)
            except msgspec.DecodeError as exc:
                raise JournalGap(
                    f"run {self.run_id!r}: the journal record at sequence {m.seq} cannot be "
                    f"read ({exc}): emptied or replaced since it was written",
                    seq=m.seq,
                ) from None
            out += [(m.seq, r) for r in unfold(record)]
        return out

    async def signal(self, name: str, payload: Any = None, *, key: str | None = None) -> bool:
        """Send the run the signal ``name`` with ``payload``; durable once it returns.

        The run's ``ctx.wait_for(name)`` returns the payload; signals that come before the
        wait are kept, in order. ``key`` makes a retried send (within 2 minutes) store
        nothing new. Returns False (and stores nothing) when the run had already ended.

        Raises:
            RunNotFound: no such run.
            NotEncodable: the payload is not JSON-encodable.

        Example:
            ``await engine.run("refund-9").signal("approval", {"approved": True})``
        """
        name = validate_name(name, "signal name")
        body = signal_message(
            name, payload, what=f"the payload of signal {name!r}", limit=self.engine.store.max_value
        )
        msg_id = f"{self.eid}:signal:{validate_id(key, 'signal key')}" if key is not None else None
        return await self._send("signal", body, msg_id)

    async def _send(self, kind: str, body: bytes, msg_id: str | None = None) -> bool:
        """Put a signal or a cancel in the run's inbox unless the run has ended (the
        server checks that in the same write, see ``send_unless_ended``); the journal is
        read first only to tell a missing run from a live one, and an ended one of an
        earlier version (its end on ``.j``, where the write's check does not look)."""
        if not self._exists and not await self._live():
            return False
        store, partition = self.engine.store, self.partition
        if await store.send_unless_ended(partition, self.eid, kind, body, msg_id=msg_id) is None:
            return False
        # The owner's inbox consumer is handed the stored message, usually before this
        # hint arrives (the hint then costs the worker a read that finds nothing new).
        # The hint is what remains when the consumer does not deliver: after a server
        # restart nats-py recreates it only once two heartbeats are missed (10-17 s
        # measured), and nothing else brings a parked run back meanwhile.
        await store.wake(partition, self.eid)
        return True

    async def _live(self) -> bool:
        """Whether the run exists and has not ended (one read of its last record).

        Raises:
            RunNotFound: no such run.
        """
        last = await self.engine.store.last_in_journal(self.eid)
        if last is None:
            raise RunNotFound(f"no run {self.run_id!r} in namespace {self.engine.namespace!r}")
        self._exists = True
        return last.headers.get("Fusee-Kind") not in ENDED

    async def cancel(self, reason: str = "cancelled", *, dry_run: bool = False) -> bool:
        """Ask the run to stop: the running step's ``s.signal`` is set and its task
        cancelled, and the run ends ``cancelled`` with ``reason``. Durable once it
        returns: a worker that dies meanwhile leaves it to the next one.

        Returns False (and does nothing) when the run had already ended. ``dry_run``:
        whether it would cancel the run now (one read of its last record), and nothing
        stored (what ``bulk_cancel(dry_run=True)`` asks of each run).

        A paused run is not left paused: one paused at a step whose attempts ran out
        is resumed to be cancelled (replayed to that step, where it stops and runs its
        compensations); one paused because its code or its journal no longer matches
        ends ``cancelled`` without running its code (its compensations are not run: a
        replay could not find them safely).

        Raises:
            RunNotFound: no such run.

        Example:
            ``await engine.run("chat-7/turn-3").cancel("interrupted")``
        """
        if not isinstance(reason, str):
            raise InvalidArgument(f"reason={reason!r}: must be a str")
        if not isinstance(dry_run, bool):
            raise InvalidArgument(f"dry_run={dry_run!r}: must be a bool")
        if dry_run:
            return await self._live()
        if not await self._send("cancel", encode_message(Cancel(reason=reason))):
            return False
        await self._mark_if_paused()
        return True

    async def _mark_if_paused(self) -> None:
        """After a cancel is stored: a paused run has no active marker, so one is
        written; its owner activates it (also after a restart, or once a worker that
        read the cancel died), reads the cancel and ends it (the machine's rule)."""
        store = self.engine.store
        last = await store.last_in_journal(self.eid)
        if last is None or last.headers.get("Fusee-Kind") != "run.paused":
            entry = await store.get_index_entry(self.eid)  # (a broken chain journals nothing)
            if entry is None or not entry[0] or decode_info(entry[0]).status != "paused":
                return
        first = (await store.read_journal(self.eid))[0].data
        marker = start_marker(self.run_id, first, now=time.time())
        await store.mark_run_active(self.partition, self.eid, marker)

    async def result(self, *, timeout: DurationLike | None = None) -> Any:
        """Wait for the run to end; return its result or raise its error.

        Raises:
            RunFailed: the run failed (``error_type`` and ``message`` are the remote ones).
            RunCancelled: the run was cancelled or timed out.
            RunNotFound: no such run.
            Timeout: ``timeout`` passed first.

        Example:
            ``answer = await engine.run("support-42").result(timeout="30s")``
        """
        limit = parse_duration(timeout, "timeout") if timeout is not None else None
        # read before the time counts: an ended run answers even with timeout=0
        last = await self.engine.store.last_in_journal(self.eid)
        if last is None:
            raise RunNotFound(f"no run {self.run_id!r} in namespace {self.engine.namespace!r}")
        self._exists = True
        if (outcome := _outcome_of(self.run_id, last)) is not None:
            return outcome()
        with anyio.move_on_after(limit if limit is not None else math.inf):
            return await self._wait_end()
        raise Timeout(f"run {self.run_id!r} did not end within {timeout}")

    async def _wait_end(self) -> Any:
        """The run's outcome, once its end record is stored. The engine's journal watch
        hands over the end records of the runs waited for (no consumer per waiter, no
        step record sent); the journal's last record is read only when the watch may
        have missed one."""
        store = self.engine.store
        watch = store.journal_watch
        async with watch.watching(self.eid, ENDED) as waiter:
            reread = True  # what was stored before the watch began, or while it was blind
            while True:
                if reread:
                    last = await store.last_in_journal(self.eid)
                    if last is not None and (outcome := _outcome_of(self.run_id, last)):
                        return outcome()
                records, reread = await watch.next(waiter, math.inf)
                for record in records:
                    if (outcome := _outcome_of(self.run_id, record)) is not None:
                        return outcome()

    # -- token streams (issue #5) ------------------------------------------------------

    async def stream_events(self, name: str, offset: int = 0) -> AsyncGenerator[TokenEvent, None]:
        """Follow the run's token stream ``name`` from token index ``offset``, from any
        process, while the step runs and after the run ended.

        Every stored event with an index of ``offset`` or more, in order, no gap, no
        duplicate: tokens, ``attempt`` boundaries (the step restarted from scratch:
        drop the text of earlier attempts) and the ``end`` marker. The iterator ends once
        the stream is over: after ``end`` when the step's result is journaled, or after
        the last stored token when the step failed or the run ended without finishing it.
        A reader that reconnects with ``offset=last token index + 1`` continues exactly.
        A stream the run does not have yet is waited for while the run is running.
        After ``continue_as_new`` it is the stream ``name`` of the run's current
        generation (one generation's stream ends when the run continues).

        Raises:
            RunNotFound: no such run.
            StreamNotFound: the run is over and never had a stream ``name``.
            InvalidArgument: ``offset`` is not an int >= 0.

        Example:
            ``async for ev in engine.run("chat-7").stream_events("model-0", offset=120): ...``
        """
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidArgument(f"offset={offset!r}: a token index, an int >= 0")
        name = validate_name(name, "stream name")
        tokens = self.engine.store.tokens
        if tokens is None:
            raise FuseeError(f"{self!r}: this engine's store keeps no token streams")
        # closed here, not by the garbage collector, when the caller stops early
        async with contextlib.aclosing(tokens.read(self.eid, name, offset)) as it:
            async for event in it:
                yield event

    async def streams(self) -> dict[str, int]:
        """The run's token streams that hold anything, by name, each with how many
        messages it holds (tokens and attempt/end markers): what the web UI offers to
        follow. A stream older than the tokens stream's ``max_age`` is gone from it.

        Raises:
            RunNotFound: no such run.

        Example:
            ``await engine.run("chat-7").streams()`` -> ``{"model-0": 41}``
        """
        tokens = self.engine.store.tokens
        if tokens is None:
            raise FuseeError(f"{self!r}: this engine's store keeps no token streams")
        found = await tokens.names(self.eid)
        if not found:
            await self.describe()  # RunNotFound
        return found

    async def stream(self, name: str, offset: int = 0) -> AsyncGenerator[str, None]:
        """The text of the run's token stream ``name`` from token index ``offset``, chunk
        by chunk (tokens only; see :meth:`stream_events` for attempt boundaries).

        Raises:
            RunNotFound: no such run.
            StreamNotFound: the run is over and never had a stream ``name``.
            InvalidArgument: ``offset`` is not an int >= 0.

        Example:
            ``async for token in engine.run(id).stream(f"model-{turn}"): print(token, end="")``
        """
        async with contextlib.aclosing(self.stream_events(name, offset)) as events:
            async for event in events:
                if event.kind == "token":
                    yield event.text


def _outcome_of(run_id: str, msg: StoredMessage) -> Any:
    """The run's outcome if ``msg`` is its end record (else None; nothing decoded). A
    record a message schedule wrote is not: forged (its replay pauses the run)."""
    if msg.headers.get("Fusee-Kind") not in ENDED:
        return None
    if (by := msg.headers.get(SCHEDULER)) is not None:
        log.warning("run.forged_record", run=run_id, seq=msg.seq, scheduler=by)
        return None
    return _outcome(run_id, msg.data)


def _outcome(run_id: str, data: bytes) -> Any:
    record = decode_record(data)
    if isinstance(record, RunCompleted):
        value = decode_value(bytes(record.result))
        return lambda: value
    if isinstance(record, RunFailedRecord):
        err = RunFailed(run_id, record.error_type, record.message)

        def fail() -> Any:
            raise err

        return fail
    if isinstance(record, RunCancelledRecord):
        cancelled = RunCancelled(run_id, record.reason)

        def cancel() -> Any:
            raise cancelled

        return cancel
    return None
