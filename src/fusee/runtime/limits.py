"""Rate and concurrency limits, sans I/O: one limit's state and every decision on it.

A limit (``engine.limit("openai", per_second=50, burst=50, concurrent=20)``) is served
by one single-writer actor (``actors/limit_actor.py``). Its shell feeds this machine
what happened (a request read from the limit's inbox, a release or a renewal heard, the
config set, the time now) and performs what it answers: the grants to journal and then
send, the time to look again. Nothing here awaits or reads a clock.

- **Concurrency**: at most ``concurrent`` permits held at once.
- **Rate**: a token bucket of ``burst`` tokens refilled at ``per_second``, spent as
  each attempt *takes* its permit (starts), not as it is granted: over any window of
  ``w`` seconds at most ``burst + per_second * w`` attempts start. A permit granted
  through a run's inbox (the durable path) is taken by the attempt's ask on core NATS
  (:meth:`LimitState.ask`) once its run has it; with no token then, the take waits
  in :attr:`LimitState.taking` (answered by :meth:`LimitState.takes`, first come
  first served). Grants run ahead of the tokens by at most ``per_second * AHEAD``
  permits not taken yet (so a woken run's way back overlaps the bucket's refill, and
  a take waits at most about ``AHEAD``); a permit never taken spends no token.
- **Fairness**: waiters queue per fairness key; keys are served round-robin (the key
  after the one served last, in the order keys first queued).
- **Leases**: a permit is held until released, or until its lease (``LEASE`` seconds
  from the grant or the last renewal) runs out: the holder's worker renews every
  ``RENEW_EVERY`` while the attempt runs, so a dead worker's permits come back within
  the lease. A permit sent to a run's inbox (the durable path) is kept ``PICKUP``
  seconds until its first renewal: a parked run must come back for it. Reclaiming an
  expired holder happens once (it is gone from ``holders``).
- **The same attempt asking again** (its run replayed on another worker, or woken from
  a park) names the same ``key``: a held permit moves to the new request (no second
  permit), a queued one keeps its place.
- **Asked on core NATS** (:meth:`LimitState.ask`, the fast path: no durable request):
  an attempt holding a permit already takes it (a run woken by its grant, or one
  that read it in its inbox: a token then, or it waits for one);
  else granted only when nobody waits, the limit has room and the attempt waits for no
  permit; its permit is named by a negative number (``-1``, ``-2``, ..., counted in the
  snapshot). Anything else is answered "no", and the step sends its durable request
  (which moves a permit its attempt holds, as above): a fast grant whose answer was
  lost, and the same attempt's durable request, are one permit.

``tests/unit/test_limit_machine.py`` drives it with hypothesis.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

import msgspec

from fusee.errors import InvalidArgument

__all__ = (
    "LimitConfig",
    "Waiter",
    "Holder",
    "Grant",
    "Queued",
    "LimitState",
    "Snapshot",
    "Ask",
    "Permit",
    "AskOp",
    "ShowOp",
    "RenewOp",
    "ReleaseOp",
    "CoreOp",
    "Answer",
    "Shown",
    "encode_core",
    "decode_core",
    "check_config",
    "LEASE",
    "RENEW_EVERY",
    "PICKUP",
    "AHEAD",
    "HOLD",
    "ASK_PATIENCE",
    "Take",
)

# How long a permit is held without a renewal; its holder's worker renews it this often.
LEASE = 2.0
RENEW_EVERY = 0.4
# How long a permit sent to a run's inbox is kept for that run to take it (its first
# renewal, then LEASE): a parked run has to be woken and replayed first, which took
# over LEASE under load, and a permit reclaimed before its run came back cost a token
# and a turn at the back of the queue (a 1,000-run flood fell to 7.5 /s of 100).
PICKUP = 10.0
# How far (in seconds of the rate) grants run ahead of the tokens: at most
# ``per_second * AHEAD`` permits granted and not taken beyond the tokens in the bucket.
# A parked run woken by its grant comes back while the bucket refills (by Little's law
# the rate holds while a woken run's way back takes under burst / per_second + AHEAD:
# it took over 1.5 s for the 1,000-run bench's runs); a take then waits for its token
# at most about this long (answered ``wait`` meanwhile, its step asks again).
AHEAD = 0.5
# How long a take waiting for its token is held before it is told to ask again
# (``wait``: a long poll, under the step's patience, ASK_PATIENCE).
HOLD = 0.5
# How long a step waits for the live limit actor's answer to a permit asked on core
# NATS. A take told to wait that is not asked again within HOLD + ASK_PATIENCE is
# gone (its worker died, its run was cancelled): it loses its place, and is not
# waited for (its permit stays held until its pickup time or lease runs out).
ASK_PATIENCE = 1.0


class LimitConfig(msgspec.Struct, frozen=True, omit_defaults=True):
    """``per_second`` (None: no rate), ``burst`` (tokens the bucket holds),
    ``concurrent`` (None: no cap on permits held at once)."""

    per_second: float | None = None
    burst: int | None = None
    concurrent: int | None = None


def check_config(
    name: str, per_second: float | None, burst: int | None, concurrent: int | None
) -> LimitConfig:
    """The config of limit ``name``; ``burst`` defaults to one second's worth (at
    least 1).

    Raises:
        InvalidArgument: a rate or count that is negative, zero, not a number, or none
            given at all.
    """
    if per_second is None and concurrent is None:
        raise InvalidArgument(f"limit {name!r}: give per_second=, concurrent= or both")
    if per_second is not None and (
        isinstance(per_second, bool)
        or not isinstance(per_second, int | float)
        or not _finite(per_second)
        or per_second <= 0
    ):
        raise InvalidArgument(
            f"limit {name!r}: per_second must be a positive number, not {per_second!r}"
        )
    for what, value in (("burst", burst), ("concurrent", concurrent)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise InvalidArgument(
                f"limit {name!r}: {what} must be a whole number of at least 1, not {value!r}"
            )
    if burst is not None and per_second is None:
        raise InvalidArgument(f"limit {name!r}: burst= needs per_second=")
    if per_second is not None and burst is None:
        burst = max(1, math.ceil(per_second))
    return LimitConfig(
        per_second=float(per_second) if per_second else None, burst=burst, concurrent=concurrent
    )


def _pickup() -> float:
    return max(PICKUP, LEASE)


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


class Waiter(msgspec.Struct, frozen=True):
    """A request read from the limit's inbox at ``seq``: attempt ``key`` of run
    ``run`` (escaped ID, in ``partition``), asked by ``worker``, under fairness key
    ``fairness``."""

    seq: int
    key: str
    run: str
    partition: int
    worker: str
    fairness: str = ""
    # the take its step asked and got no answer to in time (see PermitRequest.take)
    take: str = ""


class Holder(msgspec.Struct):
    seq: int
    key: str
    run: str
    partition: int
    worker: str
    expires: float
    # its attempt took it (started: a token spent, if the limit has a rate); a permit
    # granted and not taken yet spends none
    taken: bool = False
    # the take (an ID per acquire, see Ask.take) that took it: the same take asking
    # again (its answer lost) gets it back with no second token
    take: str = ""


class Ask(msgspec.Struct, frozen=True, kw_only=True):
    """A permit asked for on core NATS (the fast path): attempt ``key`` of run ``run``
    (escaped ID, in ``partition``), run by ``worker``, under fairness key ``fairness``.
    ``take``: an ID per acquire (a step's acquire_permit call): the same take asking
    again, its answer lost, is answered with the permit it took, no second token; a
    replay of the step is a new take (a new start, a token)."""

    key: str
    run: str
    partition: int
    worker: str = ""
    fairness: str = ""
    take: str = ""


class Permit(msgspec.Struct, frozen=True):
    """A permit a run's actor holds: of the limit actor ``limit`` (its eid), named
    ``seq`` there (a request's inbox sequence, or a fast grant's number < 0: numbered
    per limit, so only the pair names one)."""

    limit: str
    seq: int


# -- the messages on core NATS (``core_subject``): request/reply, or one way ----------


class AskOp(msgspec.Struct, frozen=True, tag_field="op", tag="ask"):
    """Request: grant ``ask`` now (answered by :class:`Answer`)."""

    ask: Ask


class ShowOp(msgspec.Struct, frozen=True, tag_field="op", tag="show"):
    """Request: the holders and waiters as they are now (answered by :class:`Shown`)."""


class RenewOp(msgspec.Struct, frozen=True, tag_field="op", tag="renew"):
    """The permits ``seqs`` that ``worker``'s attempts still hold (their leases go on)."""

    worker: str
    seqs: list[int]


class ReleaseOp(msgspec.Struct, frozen=True, tag_field="op", tag="release"):
    """The attempt holding permit ``seq`` ended."""

    seq: int


CoreOp = AskOp | ShowOp | RenewOp | ReleaseOp


class Answer(msgspec.Struct, frozen=True, omit_defaults=True):
    """The answer to an :class:`AskOp`: the fast grant's number (< 0) or the permit
    taken, or None: not granted (the step sends its durable request); ``wait``: the
    attempt's take waits for a token still, its place kept: the step asks again (a
    long poll, each ask under the step's patience; an earlier version reads it as
    "no" and takes the durable path)."""

    grant: int | None = None
    wait: bool = False


class Shown(msgspec.Struct, frozen=True):
    """The answer to a :class:`ShowOp`."""

    config: LimitConfig | None = None
    holders: int = 0
    waiters: dict[str, int] = msgspec.field(default_factory=dict)


_core_encoder = msgspec.json.Encoder()
_core_decoder = msgspec.json.Decoder(CoreOp)


def encode_core(msg: CoreOp | Answer | Shown) -> bytes:
    return _core_encoder.encode(msg)


def decode_core(data: bytes) -> CoreOp | None:
    """A message to a limit actor on core NATS; None: not one (another version's)."""
    try:
        return _core_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


@dataclass
class Take:
    """A take waiting for its token: its ID (``Ask.take``), its fairness key, when
    its step last asked, and whether that ask waits for its answer now (``asking``;
    False once told to ask again)."""

    take: str
    fairness: str
    asked: float
    asking: bool = True


@dataclass(frozen=True)
class Queued:
    """An attempt holding permit ``seq`` asked to take it and waits for a token:
    :meth:`LimitState.takes` answers it."""

    seq: int


@dataclass(frozen=True)
class Grant:
    """Send the grant of request ``waiter.seq`` to its run's inbox (after the state
    that holds it was journaled). ``moved``: the attempt held it already (asked
    again)."""

    waiter: Waiter
    moved: bool = False
    taken: bool = False  # its attempt took it already: it starts on it (no take)


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What the limit actor journals: the config, the bucket, the holders, the
    waiters' inbox sequences per fairness key (the key served next first) and the
    last inbox sequence read. Waiters are rebuilt from their requests in the inbox."""

    config: LimitConfig | None = None
    tokens: float = 0.0
    refilled_at: float = 0.0
    holders: list[Holder] = msgspec.field(default_factory=list)
    queues: list[tuple[str, list[int]]] = msgspec.field(default_factory=list)
    seen: int = 0
    fast: int = 0  # permits granted on core NATS so far (the last one is named -fast)
    # inbox messages read since the inbox was last trimmed (kept across activations:
    # a limit that parks between uses reads a few each time)
    untrimmed: int = 0


@dataclass
class LimitState:
    config: LimitConfig | None = None
    tokens: float = 0.0
    refilled_at: float = 0.0
    holders: dict[int, Holder] = field(default_factory=dict)  # request seq -> holder
    queues: dict[str, deque[Waiter]] = field(default_factory=dict)  # the front served next
    fast: int = 0  # permits granted on core NATS (ask): the next one is named -(fast + 1)
    # holders (request seqs) whose attempts asked to take them and wait for a token,
    # first come first served (not journaled: an ask is not, and its step asks again)
    taking: dict[int, Take] = field(default_factory=dict)
    # when a permit not taken was last renewed or released: a worker of an earlier
    # version starts on the grant (it never takes): grants do not run ahead then
    early: float | None = None

    # -- events -------------------------------------------------------------------------

    def configure(self, config: LimitConfig, now: float) -> list[int]:
        """Set (or change) the config; the bucket keeps what it had, up to the new
        burst. The takes waiting that the new rate cannot serve within ``AHEAD`` are
        refused (returned: their asks are answered "no"), their attempts put back at
        the front of their fairness queues: their steps send their durable requests
        and park (a lowered rate leaves no take waiting long in a worker's memory)."""
        if self.config is None or self.config.per_second is None:
            self.tokens = float(config.burst or 0)
            self.refilled_at = now
        else:
            self._refill(now)
        self.config = config
        self.tokens = min(self.tokens, float(config.burst or 0))
        if config.per_second is None:
            return []  # no rate: each take is served at once by the next turn
        refused = []
        for pos, seq in enumerate(list(self.taking)):
            if self._too_far(pos, now):
                refused.append(seq)
        for seq in reversed(refused):  # each goes to its queue's front: the first last
            take = self.taking[seq]
            self._requeue(seq, take.fairness)
        return refused

    def request(self, waiter: Waiter, now: float) -> Grant | None:
        """A request read. The attempt asking again: a held permit moves to this
        request (granted at once), a queued request keeps its place."""
        for seq, holder in list(self.holders.items()):
            if holder.key == waiter.key:
                del self.holders[seq]
                # its step gave up on that ask (no answer in time): the take it asked
                # took the permit already, or it takes the new grant (its place kept)
                taken = holder.taken and bool(waiter.take) and holder.take == waiter.take
                if seq in self.taking:  # (the same place, under the new request)
                    self.taking = {
                        (waiter.seq if s == seq else s): t for s, t in self.taking.items()
                    }
                    self.taking[waiter.seq].asking = False
                self.holders[waiter.seq] = Holder(
                    waiter.seq,
                    waiter.key,
                    waiter.run,
                    waiter.partition,
                    waiter.worker,
                    # sent to its run's inbox, taken or not: it waits the way back
                    # (the first renewal shortens it to LEASE)
                    now + _pickup(),
                    taken,
                    holder.take if taken else "",
                )
                return Grant(waiter, moved=True, taken=taken)
        for queue in self.queues.values():
            for i, queued in enumerate(queue):
                if queued.key == waiter.key:
                    queue[i] = waiter  # the newest request of the attempt is answered
                    return None
        self.queues.setdefault(waiter.fairness, deque()).append(waiter)
        return None

    def ask(self, ask: Ask, now: float) -> Grant | Queued | None:
        """A permit asked for on core NATS. Attempt ``ask.key`` holding one already
        (its run read its grant, or was woken by it and replayed, or was replayed
        elsewhere) takes it: now the asker's, a token spent (each take is an attempt
        starting), answered with it (``moved``; no second permit); with no token now
        (or other takes waiting for theirs) it waits for one (:class:`Queued`,
        answered by :meth:`takes`). Else granted and taken at once (a new holder, named
        by the next negative number) when nobody waits, the limit has room and a token,
        and the attempt waits for none; else None and nothing changes (the step sends
        its durable request instead)."""
        config = self.config
        if config is None:
            return None  # unknown: the durable request is told why
        for holder in self.holders.values():
            if holder.key == ask.key:
                holder.run, holder.partition = ask.run, ask.partition
                holder.worker = ask.worker
                holder.expires = max(holder.expires, now + LEASE)
                w = Waiter(holder.seq, ask.key, ask.run, ask.partition, ask.worker, ask.fairness)
                if holder.taken and ask.take and holder.take == ask.take:
                    # the same take asked again (its answer lost): its permit, and
                    # no second token (one start)
                    holder.expires = now + LEASE
                    return Grant(w, moved=True)
                take = self.taking.get(holder.seq)
                if take is not None:  # asked again: its place kept (and a token now,
                    # if none that waits before it asks: it has it)
                    take.take, take.asked, take.asking = ask.take, now, True
                    got = self.takes(now, (holder.seq,))
                    return got[0] if got else Queued(holder.seq)
                if not self._token(now):
                    if config.per_second is not None and self._too_far(len(self.taking), now):
                        # its token is further than AHEAD away (the rate was lowered):
                        # back to the front of its queue; its step parks
                        self._requeue(holder.seq, ask.fairness)
                        return None
                    self.taking[holder.seq] = Take(ask.take, ask.fairness, now)
                    return Queued(holder.seq)
                holder.taken, holder.expires, holder.take = True, now + LEASE, ask.take
                return Grant(w, moved=True)
        if self.queues:
            return None  # others wait
        if config.concurrent is not None and len(self.holders) >= config.concurrent:
            return None
        if not self._token(now):
            return None
        self.fast += 1
        waiter = Waiter(-self.fast, ask.key, ask.run, ask.partition, ask.worker, ask.fairness)
        self.holders[waiter.seq] = Holder(
            waiter.seq,
            waiter.key,
            waiter.run,
            waiter.partition,
            waiter.worker,
            now + LEASE,
            True,
            ask.take,
        )
        return Grant(waiter)

    def takes(self, now: float, asking: Collection[int] | None = None) -> list[Grant]:
        """The takes waiting for a token (:class:`Queued`) answered now, in the order
        they asked, while the bucket has a token for each; only those whose step waits
        for the answer now (asked under ``HOLD`` ago and not told to ask again; and in
        ``asking`` when given): one told to ask again keeps its place, and is not
        answered, nor spends a token, meanwhile."""
        out: list[Grant] = []
        for seq, take in list(self.taking.items()):
            if not self._asking(take, now) or (asking is not None and seq not in asking):
                continue
            if not self._token(now, queued=True):
                break
            del self.taking[seq]
            holder = self.holders[seq]
            holder.taken, holder.expires, holder.take = True, now + LEASE, take.take
            w = Waiter(holder.seq, holder.key, holder.run, holder.partition, holder.worker)
            out.append(Grant(w, moved=True))
        return out

    def told_to_wait(self, now: float) -> list[int]:
        """The takes whose step waited ``HOLD`` for its token: answered ``wait`` now
        (their places kept; their steps ask again)."""
        out = [s for s, t in self.taking.items() if t.asking and now - t.asked >= HOLD]
        for seq in out:
            self.taking[seq].asking = False
        return out

    def release(self, seq: int, now: float | None = None) -> bool:
        """The holder of request ``seq`` is done (success, raise or cancel). A permit
        not taken (of a worker of an earlier version, which starts on the grant) was
        an attempt started: a token spent (see :meth:`renew`)."""
        self._untake(seq)
        holder = self.holders.pop(seq, None)
        if holder is not None and not holder.taken and now is not None:
            self._started_early(now)
        return holder is not None

    def renew(self, seqs: list[int], worker: str, now: float) -> None:
        for seq in seqs:
            holder = self.holders.get(seq)
            if holder is not None and holder.worker == worker:
                # taken (a grant with no rate is taken as its run reads it): a
                # pickup's time ends. Renewed and not taken: a worker of an earlier
                # version started its attempt on the grant: a token spent now
                if not holder.taken:
                    self._untake(seq)
                    self._started_early(now)
                holder.expires, holder.taken = now + LEASE, True

    def expire(self, now: float) -> list[Holder]:
        """Reclaim the holders whose lease ran out (each once: they are gone), and
        forget the takes told to wait and not asked again within ``HOLD +
        ASK_PATIENCE`` (their steps are gone: nobody is waited for; the permit stays
        held until its time runs out, and a step asking later queues again)."""
        gone = [h for h in self.holders.values() if h.expires <= now]
        for h in gone:
            del self.holders[h.seq]
            self._untake(h.seq)
        for seq, take in list(self.taking.items()):
            if now - take.asked >= HOLD + ASK_PATIENCE:  # (told to wait by then)
                del self.taking[seq]
        return gone

    def fresh_leases(self, now: float) -> None:
        """An activation took the limit over: renewals sent to the old one are lost,
        so each holder's lease starts again."""
        for h in self.holders.values():
            h.expires = max(h.expires, now + LEASE)

    # -- decisions ----------------------------------------------------------------------

    def grants(self, now: float) -> list[Grant]:
        """The waiters served now: round-robin across fairness keys while the limit
        has room (a permit free; with a rate, fewer permits granted and not taken than
        the tokens in the bucket plus ``per_second * AHEAD``). A grant spends no token:
        its attempt does as it takes it."""
        out: list[Grant] = []
        config = self.config
        if config is None:
            return out
        if config.per_second is not None:
            self._refill(now)
        while self.queues:
            if config.concurrent is not None and len(self.holders) >= config.concurrent:
                break
            if config.per_second is not None and not self._may_grant(config.per_second, now):
                break
            # round-robin: the key at the front is served, then goes to the back
            key = next(iter(self.queues))
            queue = self.queues.pop(key)
            waiter = queue.popleft()
            if queue:
                self.queues[key] = queue
            self.holders[waiter.seq] = Holder(
                waiter.seq,
                waiter.key,
                waiter.run,
                waiter.partition,
                waiter.worker,
                now + _pickup(),  # sent to its run's inbox
            )
            out.append(Grant(waiter))
        return out

    def next_look(self, now: float) -> float | None:
        """When to look again with nothing read meanwhile: a token for a take whose
        step waits for it (asking), the end of a take's ``HOLD`` (told to wait) or of
        the time a take told to wait has to ask again (forgotten), the tokens a
        waiter's grant waits for (one a take spends comes as an event), the first
        lease to run out; None: never."""
        times = [h.expires for h in self.holders.values()]
        for take in self.taking.values():
            times.append(take.asked + (HOLD if self._asking(take, now) else HOLD + ASK_PATIENCE))
        config = self.config
        if config is None or config.per_second is None:
            return min(times) if times else None
        rate, burst = config.per_second, float(config.burst or 1)
        self._refill(now)
        if any(self._asking(t, now) for t in self.taking.values()):
            times.append(now + max(0.0, 1.0 - self.tokens) / rate)
        if self.queues and (config.concurrent is None or len(self.holders) < config.concurrent):
            # the tokens a grant needs in the bucket
            want = self.pickups() + 1 - self._ahead(rate, now)
            if want <= burst:
                times.append(now + max(0.0, want - self.tokens) / rate)
        return min(times) if times else None

    def pickups(self) -> int:
        """Permits a token is owed for: granted and not taken yet, or taken and asked
        for by a new take waiting for its token (a replay of the step)."""
        return sum(1 for h in self.holders.values() if not h.taken or h.seq in self.taking)

    def waiting(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def waiters_by_key(self) -> dict[str, int]:
        return {k: len(q) for k, q in self.queues.items()}

    def refuse_all(self) -> list[Waiter]:
        """No such limit: every waiter is told so (and forgotten)."""
        out = [w for q in self.queues.values() for w in q]
        self.queues.clear()
        return out

    # -- the journal ----------------------------------------------------------------------

    def snapshot(self, seen: int, untrimmed: int = 0) -> Snapshot:
        return Snapshot(
            untrimmed=untrimmed,
            config=self.config,
            tokens=self.tokens,
            refilled_at=self.refilled_at,
            holders=list(self.holders.values()),
            queues=[(k, [w.seq for w in q]) for k, q in self.queues.items()],
            seen=seen,
            fast=self.fast,
        )

    @classmethod
    def restore(cls, snap: Snapshot, requests: dict[int, Waiter]) -> LimitState:
        """The state journaled in ``snap``, its waiters found in ``requests`` (the
        limit's inbox requests by sequence; one missing is dropped)."""
        state = cls(
            config=snap.config,
            tokens=snap.tokens,
            refilled_at=snap.refilled_at,
            holders={h.seq: h for h in snap.holders},
            fast=snap.fast,
        )
        for key, seqs in snap.queues:
            queue = deque(requests[s] for s in seqs if s in requests)
            if queue:
                state.queues[key] = queue
        return state

    # -- inside ---------------------------------------------------------------------------

    def _token(self, now: float, *, queued: bool = False) -> bool:
        """Spend a token for a take now, if the bucket has one and (``queued``: but
        for the takes waiting) no take whose step asks waits for one; True with no
        rate."""
        config = self.config
        if config is None or config.per_second is None:
            return True
        if not queued and any(self._asking(t, now) for t in self.taking.values()):
            return False  # those first (one told to ask again and not back yet: not)
        self._refill(now)
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def _may_grant(self, rate: float, now: float) -> bool:
        return self.pickups() + 1 <= self.tokens + self._ahead(rate, now) + 1e-9

    def _ahead(self, rate: float, now: float) -> float:
        """How many permits grants run ahead of the tokens: ``rate * AHEAD``, none
        while workers of an earlier version start on their grants (one seen within
        ``PICKUP``)."""
        if self.early is not None and now - self.early < _pickup():
            return 0.0
        return rate * AHEAD

    def _started_early(self, now: float) -> None:
        """A permit not taken was renewed or released: its attempt started on the
        grant (a worker of an earlier version): its token is spent now (the bucket
        may owe it), and grants stop running ahead for a while."""
        config = self.config
        if config is None or config.per_second is None:
            return
        self._refill(now)
        self.tokens -= 1.0
        self.early = now

    def _asking(self, take: Take, now: float) -> bool:
        return take.asking and now - take.asked < HOLD

    def _too_far(self, pos: int, now: float) -> bool:
        """A take behind ``pos`` others would wait for its token longer than AHEAD."""
        config = self.config
        if config is None or config.per_second is None:
            return False
        self._refill(now)
        return (pos + 1 - self.tokens) / config.per_second > AHEAD + 1e-9

    def _requeue(self, seq: int, fairness: str) -> None:
        """The permit ``seq`` (granted, not taken) goes back: its attempt waits again at
        the front of its fairness queue (its request, the same inbox sequence)."""
        self._untake(seq)
        holder = self.holders.pop(seq)
        waiter = Waiter(seq, holder.key, holder.run, holder.partition, holder.worker, fairness)
        self.queues.setdefault(fairness, deque()).appendleft(waiter)

    def _untake(self, seq: int) -> None:
        self.taking.pop(seq, None)

    def _refill(self, now: float) -> None:
        config = self.config
        if config is None or config.per_second is None:
            return
        if now > self.refilled_at:
            self.tokens = min(
                float(config.burst or 1),
                self.tokens + (now - self.refilled_at) * config.per_second,
            )
            self.refilled_at = now


# -- names ------------------------------------------------------------------------------

LIMIT_PREFIX = "@fusee.limit/"  # a limit's actor ID: "@" is kept from run IDs


def limit_actor_id(name: str) -> str:
    """The actor ID of limit ``name`` (reserved: run IDs cannot start with ``@``)."""
    return LIMIT_PREFIX + name


def parse_limit_id(actor_id: str) -> str | None:
    """The limit's name of a limit actor's ID, or None."""
    return actor_id[len(LIMIT_PREFIX) :] if actor_id.startswith(LIMIT_PREFIX) else None


def core_subject(namespace: str, eid: str) -> str:
    """Core NATS: where the holders' workers send a limit actor renewals and releases."""
    return f"_fusee.{namespace}.limit.{eid}"


def limit_key(eid: str) -> str:
    """The work bucket's key of a limit's config (for listings and ``limits ls``)."""
    return f"limit.{eid}"
