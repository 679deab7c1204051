"""A limit's actor: the single writer of one rate/concurrency limit.

Its journal is ``<ns>.run.<eid>.j`` (``eid``: the escaped ``@fusee.limit/<name>``),
fenced like a run's; each record is a :class:`~fusee.runtime.limits.Snapshot` of the
whole state, so an activation reads the last one only. Requests, config changes come
to its inbox (``permit``, ``limit``); renewals and releases come on core NATS from the
holders' workers (a lost one: the lease runs out). A step first asks on core NATS
(``ask``, request/reply: the fast path); it is answered with a grant, journaled first,
or "no" (the limit full, others waiting, the attempt holding one already), and then
sends its durable request. ``show`` (request/reply) answers the holders and waiters as
they are now. With a rate, a grant sent to a run's inbox is *taken* by its attempt's
ask as it starts (the token spent then); a take with no token waits here, answered
``wait`` after ``HOLD`` (runtime/limits.py; its step asks again). A grant is journaled (the snapshot holding it landed) before it is sent
to the run's inbox or answered, so a permit is never granted twice, also across a crash
of this actor. The decisions are :class:`fusee.runtime.limits.LimitState`'s; this
performs them.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec

from fusee.actors.core import ActorCore
from fusee.actors.outcomes import Outcome
from fusee.actors.ports import ClusterStore
from fusee.errors import Evicted
from fusee.logs import get_logger
from fusee.runtime.ids import escape
from fusee.runtime.inbox import LimitSet, PermitGrant, PermitRequest, encode_message
from fusee.runtime.limits import (
    Answer,
    Ask,
    AskOp,
    Grant,
    LimitConfig,
    LimitState,
    Queued,
    ReleaseOp,
    RenewOp,
    Shown,
    ShowOp,
    Snapshot,
    Waiter,
    core_subject,
    decode_core,
    encode_core,
)

__all__ = ("LimitActor",)

log = get_logger()

_snapshot = msgspec.json.Decoder(Snapshot)
_encode = msgspec.json.Encoder()
NO = encode_core(Answer(None))  # a fast ask refused: the step sends its durable request
WAIT = encode_core(Answer(None, wait=True))  # a take still waiting: its step asks again
# Looked at again at least this often (an eviction asked for, a lease to expire).
TICK = 0.25
# The inbox is trimmed (below its oldest waiter's request and what the last snapshot
# read) once this many messages were read since it was last trimmed.
TRIM_AFTER = 256
# Every this many snapshots one replaces the earlier ones (a rollup: the server purges
# them as it stores it), so the journal holds at most this many.
ROLLUP_EVERY = 32


def _waiter(seq: int, msg: PermitRequest) -> Waiter:
    return Waiter(seq, msg.key, msg.run, msg.partition, msg.worker, msg.fairness, msg.take)


class LimitActor:
    def __init__(self, *, name: str, core: ActorCore, store: ClusterStore) -> None:
        self.name = name
        self.core = core
        self.store = store
        self.state = LimitState()
        self._heard: list[RenewOp | ReleaseOp] = []  # renewals and releases, in order
        self._asks: list[tuple[Ask, str]] = []  # permits asked on core NATS, reply subjects
        # the reply subjects of the takes waiting for a token, by the permit taken
        # (which wait, and how long, is the state's: LimitState.taking)
        self._replies: dict[int, str] = {}
        self._shows: list[str] = []  # reply subjects of `show` requests
        self._seen = 0
        self._resend: list[Waiter] = []
        self._untrimmed = 0  # inbox messages read since the inbox was last trimmed (journaled)

    async def run(self) -> Outcome:
        core = self.core
        core.start()
        await self._load()
        subject = core_subject(core.namespace, core.eid)
        unsubscribe = await self.store.subscribe_core(subject, self._on_core)
        try:
            return await self._serve()
        finally:
            with anyio.CancelScope(shield=True):
                await unsubscribe()
                # asked as it left: told "no" now rather than by their patience
                asks, self._asks = self._asks, []
                replies, self._replies = self._replies, {}
                for reply in [r for _, r in asks] + list(replies.values()):
                    await self.store.publish_core(reply, NO)

    async def _on_core(self, _subject: str, data: bytes, reply: str | None) -> None:
        op = decode_core(data)
        if isinstance(op, AskOp) and reply:
            self._asks.append((op.ask, reply))
        elif isinstance(op, ShowOp) and reply:
            self._shows.append(reply)
        elif isinstance(op, RenewOp | ReleaseOp):
            self._heard.append(op)
        else:
            if reply:  # not one this version knows: an ask is told "no"
                await self.store.publish_core(reply, NO)
            return
        if self.core.woken is not None:
            self.core.woken.set()

    async def _load(self) -> None:
        core = self.core
        last = await self.store.last_in_journal(core.eid)
        snap = None
        if last is not None:
            snap = _snapshot.decode(last.data)
            core.fence = last.seq
        self._seen = snap.seen if snap is not None else 0
        self._untrimmed = snap.untrimmed if snap is not None else 0
        queued = [s for _, seqs in snap.queues for s in seqs] if snap is not None else []
        core.read_again(min([self._seen, *(s - 1 for s in queued)]))
        requests: dict[int, Waiter] = {}
        fresh: list[tuple[int, Any]] = []
        for seq, msg in await core.inbox_messages():
            if seq <= self._seen:
                if isinstance(msg, PermitRequest):
                    requests[seq] = _waiter(seq, msg)
            else:
                fresh.append((seq, msg))
        now = core.clock()
        self.state = LimitState.restore(snap, requests) if snap else LimitState()
        self.state.fresh_leases(now)
        self._pending = fresh
        # a grant journaled and then not sent (a crash between) would leave its run
        # waiting until the lease took it back: each holder's grant is sent again (its
        # Msg-Id dedupes; a run that had it ignores a grant it did not ask for)
        # (a fast grant is not: its step asked again in its inbox, which moves it)
        self._resend = [
            Waiter(h.seq, h.key, h.run, h.partition, h.worker)
            for h in self.state.holders.values()
            if h.seq > 0
        ]

    async def _serve(self) -> Outcome:
        core, state = self.core, self.state
        # releases ride on the next grant's record, or the one written as it parks (a
        # crash before: their holders come back from the journal, and the leases run out)
        dirty = False
        idle_since: float | None = None
        for waiter in self._resend:
            await self._send(waiter, "")
        self._resend = []
        while True:
            now = core.clock()
            grants = []
            refused_takes: list[int] = []
            self._untrimmed += len(self._pending)
            for seq, msg in self._pending:
                self._seen = max(self._seen, seq)
                if isinstance(msg, LimitSet):
                    config = LimitConfig(msg.per_second, msg.burst, msg.concurrent)
                    refused_takes += state.configure(config, now)
                    dirty = True
                    log.info("limit.set", limit=self.name, **msgspec.structs.asdict(config))
                elif isinstance(msg, PermitRequest):
                    moved = state.request(_waiter(seq, msg), now)
                    dirty = True
                    if moved is not None:
                        grants.append(moved)
            self._pending = []
            heard, self._heard = self._heard, []
            for op in heard:
                if isinstance(op, ReleaseOp):
                    dirty = state.release(op.seq, now) or dirty
                else:
                    state.renew(op.seqs, op.worker, now)
            refused = state.refuse_all() if state.config is None else []
            # the takes that waited for a token first, then the waiters: an ask does
            # not jump either queue
            fast: list[tuple[Grant, str]] = [
                (g, self._replies.pop(g.waiter.seq, "")) for g in state.takes(now)
            ]
            grants += state.grants(now)
            asks, self._asks = self._asks, []
            for ask, reply in asks:
                g = state.ask(ask, now)
                if g is None:  # (a take too far from its token: back in its queue)
                    dirty = True
                    await self.store.publish_core(reply, NO)
                elif isinstance(g, Queued):
                    self._replies[g.seq] = reply  # (asked again: the newest reply)
                else:
                    fast.append((g, reply))
            # (after the asks: a take asked again, read in this turn, keeps its lease)
            for holder in state.expire(now):
                dirty = True
                log.warning(
                    "limit.reclaimed", limit=self.name, request=holder.seq, worker=holder.worker
                )
            for seq in refused_takes:  # (the rate lowered: its step parks)
                if seq in self._replies:
                    await self.store.publish_core(self._replies.pop(seq), NO)
            for seq in state.told_to_wait(now):  # ask again (the place is kept)
                if seq in self._replies:
                    await self.store.publish_core(self._replies.pop(seq), WAIT)
            # a take its step gave up on (its durable request moved the permit, or it
            # was reclaimed, or forgotten) is answered by nobody
            self._replies = {
                s: r
                for s, r in self._replies.items()
                if s in state.taking and state.taking[s].asking
            }
            if grants or refused or fast:
                # journaled before any grant is sent or answered: never granted twice
                await self._commit()
                dirty = False
            for g, reply in fast:
                if reply:
                    await self._answer(g, reply)
            # (one at a time: 32 side by side woke the runs in bunches, and the steps
            # saw up to 116 in 2 s of the 300-run test against 104-110)
            for g in grants:
                await self._send(g.waiter, "", taken=g.taken)
            for w in refused:
                await self._send(w, f"there is no limit {self.name!r} (engine.limit() sets one)")
            shows, self._shows = self._shows, []
            for reply in shows:
                await self.store.publish_core(reply, self._show())
            if state.config is None:
                return "ended"  # no such limit: its requests were told
            if state.waiting() or state.holders:
                idle_since = None
            elif idle_since is None:
                idle_since = now
            elif now - idle_since >= core.park_after:
                # nothing held or queued for a while: releases journaled, then it leaves
                # (its marker stays; a request brings it back)
                if dirty:
                    await self._commit()
                core.left_at = core.view.seen
                return "parked"
            if core.evict_requested():
                if dirty:
                    await self._commit()
                raise Evicted
            until = state.next_look(core.clock())
            wait = TICK if until is None else max(0.0, min(TICK, until - core.clock()))
            assert core.woken is not None
            with anyio.move_on_after(wait):
                await core.woken.wait()
            core.woken = anyio.Event()
            self._pending = [
                (seq, msg) for seq, msg in await core.inbox_messages() if seq > self._seen
            ]

    async def _commit(self) -> None:
        """Journal the state (a snapshot; an activation reads the last only), the first
        of each activation and every ``ROLLUP_EVERY``-th after it replacing the earlier
        ones; then, once ``TRIM_AFTER`` inbox messages were read since the last trim
        (counted across activations, in the snapshot), trim the inbox below what this
        snapshot still needs (its waiters' requests, what it has not read)."""
        core = self.core
        trim = self._untrimmed >= TRIM_AFTER
        if trim:
            self._untrimmed = 0
        snap = self.state.snapshot(self._seen, self._untrimmed)
        core.commits += 1
        msg_id = f"{core.eid}:{core.commits}:{core.writer}"
        core.fence = await self.store.append(
            core.eid,
            "limit.state",
            _encode.encode(snap),
            fence=core.fence,
            msg_id=msg_id,
            # the first of each activation (a limit that parks between uses writes a
            # few a time), then every ROLLUP_EVERY-th
            rollup=(core.commits - 1) % ROLLUP_EVERY == 0,
        )
        if trim:  # (a crash before: trimmed after the next TRIM_AFTER messages)
            below = min([snap.seen + 1, *(s for _, seqs in snap.queues for s in seqs)])
            await self.store.purge_inbox(core.partition, core.eid, below)

    async def _answer(self, grant: Grant, reply: str) -> None:
        """Answer a fast ask with its grant (journaled): a lost answer is the asker's
        durable request, which moves the permit."""
        await self.store.publish_core(reply, encode_core(Answer(grant.waiter.seq)))

    def _show(self) -> bytes:
        state = self.state
        return encode_core(Shown(state.config, len(state.holders), state.waiters_by_key()))

    async def _send(self, waiter: Waiter, error: str, *, taken: bool = False) -> None:
        # with a rate, its attempt takes it (asks on core NATS) as it starts: the token
        # is spent then (``taken``: its take took it already, its answer lost)
        config = self.state.config
        take = not error and not taken and config is not None and config.per_second is not None
        grant = PermitGrant(limit=self.name, request=waiter.seq, error=error, take=take)
        body = encode_message(grant)
        await self.store.send_inbox(
            waiter.partition,
            waiter.run,
            "grant",
            body,
            msg_id=f"grant:{escape(self.name)}:{waiter.seq}",
        )
