"""The limit's decisions (runtime/limits.py) under every order of requests, releases,
renewals, leases running out, config changes, restarts from a snapshot and the clock,
permits asked on core NATS (the fast path: granted, its answer lost and the same
attempt's durable request sent; refused; answered late, after the durable request),
and granted permits taken by their attempts (at once, late, after a lease ran out,
waiting for a token): never more than ``concurrent`` held, never more than ``burst +
per_second * w`` attempts *started* (a permit taken, or granted and taken on core NATS)
in any window of ``w`` seconds, a grant spends no token, a take waits only while
there is no token, a request never granted twice (but a moved permit),
one permit at most per attempt, no fast grant while others wait, an expired holder
reclaimed once, keys served round-robin, and every waiter served once the clock runs
and holders release."""

from __future__ import annotations

import math

import msgspec
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fusee.runtime.limits import (
    AHEAD,
    HOLD,
    LEASE,
    PICKUP,
    Ask,
    Grant,
    LimitConfig,
    LimitState,
    Queued,
    Snapshot,
    Waiter,
)
from tests.machines import machine_settings


class Limits(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.config = LimitConfig(per_second=5.0, burst=3, concurrent=2)
        self.state = LimitState()
        self.state.configure(self.config, self.now)
        self.seq = 0
        self.times: list[float] = []  # when each attempt started (took its permit)
        self.lost_keys: list[str] = []  # attempts whose permit a lease took back
        self.granted: set[int] = set()  # request seqs granted
        self.reclaimed: set[int] = set()
        self.keys = 0
        self.queued_order: list[tuple[float, str]] = []  # (when, fairness) per grant
        self.rate_since = self.now  # the config's rate holds from here
        self.takes = 0  # take IDs made (one per acquire)
        # a permit not taken was renewed or released (a worker of an earlier version
        # started on its grant): the bound allows per_second * AHEAD more from then
        self.early = False
        self.fresh: set[int] = set()  # requests granted from the queue (not moved)
        self.fast_at: dict[int, float] = {}  # when each fast grant was answered

    def _grant(self) -> None:
        for g in self.state.takes(self.now):
            assert g.waiter.seq in self.state.holders
            assert self.state.holders[g.waiter.seq].taken
            self.times.append(self.now)  # a take that waited for its token: it starts
        tokens = self.state.tokens
        for g in self.state.grants(self.now):
            assert self.state.tokens >= tokens, "a grant spent a token"
            self._granted(g.waiter.seq, g.moved, g.waiter.fairness)

    def _granted(self, seq: int, moved: bool, fairness: str) -> None:
        assert seq not in self.granted, "a request granted twice"
        self.granted.add(seq)
        if not moved:
            assert self.config.concurrent is not None
            assert len(self.state.holders) <= self.config.concurrent, (
                f"{len(self.state.holders)} permits held, over concurrent"
            )
            if seq < 0:  # granted on core NATS: taken at once, its attempt starts
                self.times.append(self.now)
                self.fast_at[seq] = self.now
            else:
                self.fresh.add(seq)
            self.queued_order.append((self.now, fairness))

    @rule(fairness=st.sampled_from(["a", "b", "c"]), lost=st.booleans())
    def ask(self, fairness: str, lost: bool) -> None:
        """A new attempt asks on core NATS (or one whose permit a lease took back
        before it took it: a late pickup): granted only when nobody waits and there is
        room; refused, it sends its durable request (and waits its turn)."""
        held = {h.key for h in self.state.holders.values()}
        queued = {w.key for q in self.state.queues.values() for w in q}
        again = [k for k in self.lost_keys if k not in held | queued]
        if lost and again:
            key = again[0]
            self.lost_keys.remove(key)
        else:
            self.keys += 1
            key = f"k{self.keys}"
        waited = bool(self.state.queues)
        g = self.state.ask(
            Ask(key=key, run="r", partition=0, worker="w1", fairness=fairness), self.now
        )
        assert not isinstance(g, Queued), "an attempt holding nothing waits to take"
        if g is not None:
            assert not waited, "a fast grant jumped the waiters"
            assert g.waiter.seq < 0
            self._granted(g.waiter.seq, False, fairness)
            return
        self.seq += 1
        assert self.state.request(Waiter(self.seq, key, "r", 0, "w1", fairness), self.now) is None
        self._grant()

    @precondition(lambda self: any(s < 0 for s in self.state.holders))
    @rule(data=st.data())
    def fast_answer_lost(self, data: st.DataObject) -> None:
        """A fast grant's answer was lost: its step's durable request (same attempt)
        takes the permit over, no second one."""
        seq = data.draw(st.sampled_from(sorted(s for s in self.state.holders if s < 0)))
        h = self.state.holders[seq]
        n = len(self.state.holders)
        if not h.take and seq in self.fast_at:  # (not taken again since)
            # its answer lost: its attempt did not start then (it takes the move)
            self.times.remove(self.fast_at.pop(seq))
        self.seq += 1
        moved = self.state.request(Waiter(self.seq, h.key, h.run, 0, "w1", ""), self.now)
        assert moved is not None, "the fast grant was not moved"
        assert moved.moved
        assert len(self.state.holders) == n, "a lost answer made a second permit"
        self._granted(self.seq, True, "")
        self._grant()

    @precondition(lambda self: self.state.queues)
    @rule(data=st.data())
    def late_ask(self, data: st.DataObject) -> None:
        """A fast ask answered after its step gave up on it and sent its durable
        request (queued now): refused, nothing changes."""
        keys = [w.key for q in self.state.queues.values() for w in q]
        key = data.draw(st.sampled_from(sorted(keys)))
        before = self.state.snapshot(self.seq)
        taking = [(s, t.take, t.asked, t.asking) for s, t in self.state.taking.items()]
        g = self.state.ask(Ask(key=key, run="r", partition=0, worker="w1"), self.now)
        assert g is None, "a late ask of an attempt that waits was granted"
        assert self.state.snapshot(self.seq) == before, "a refused ask changed the state"
        after = [(s, t.take, t.asked, t.asking) for s, t in self.state.taking.items()]
        assert after == taking, "a refused ask changed the takes"

    @precondition(lambda self: self.state.holders)
    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        """An attempt holding a permit asks on core NATS (its run read its grant, or
        was woken by it, or an answer came late; at once or long after): it takes the
        permit it holds, now the asker's, a token spent as it starts; with no token it
        waits for one (answered by ``takes``). No second permit."""
        h = data.draw(st.sampled_from(sorted(self.state.holders.values(), key=lambda h: h.seq)))
        queued = self.state.taking.get(h.seq)
        same = h.take or (queued.take if queued else "")
        if same and data.draw(st.booleans()):
            take = same  # the same take asked again (an answer lost, or told to wait)
        else:
            self.takes += 1  # a new acquire (the step replayed): a new start
            take = f"t{self.takes}"
        was_taken = h.taken and take == h.take
        n = len(self.state.holders)
        g = self.state.ask(Ask(key=h.key, run="r", partition=0, worker="w2", take=take), self.now)
        if g is None:
            # its token further than AHEAD away: back to the front of its queue
            assert h.seq not in self.state.holders
            assert any(w.seq == h.seq for q in self.state.queues.values() for w in q)
            self.granted.discard(h.seq)  # (granted again later)
            return
        assert len(self.state.holders) == n, "a held attempt's ask made a second permit"
        assert self.state.holders[h.seq].worker == "w2", "the asker does not hold it"
        if isinstance(g, Queued):
            assert g.seq == h.seq
            assert h.seq in self.state.taking
        else:
            assert isinstance(g, Grant)
            assert g.moved
            assert g.waiter.seq == h.seq, "a held attempt's ask got another permit"
            assert self.state.holders[h.seq].taken
            if not was_taken:  # (the same take again: no second start)
                self.times.append(self.now)

    @precondition(lambda self: self.state.taking)
    @rule()
    def told_to_wait(self) -> None:
        """A take waited HOLD: told to ask again (its place kept)."""
        for seq in self.state.told_to_wait(self.now):
            assert not self.state.taking[seq].asking

    @precondition(
        lambda self: any(not h.taken and s in self.fresh for s, h in self.state.holders.items())
    )
    @rule(data=st.data(), release=st.booleans())
    def early_start(self, data: st.DataObject, release: bool) -> None:
        """A worker of an earlier version started on its grant (it never takes): its
        renewal or release of the permit not taken is a start, a token spent."""
        early = sorted(
            (h for s, h in self.state.holders.items() if not h.taken and s in self.fresh),
            key=lambda h: h.seq,
        )
        h = data.draw(st.sampled_from(early))
        self.state._refill(self.now)
        tokens = self.state.tokens
        if release:
            assert self.state.release(h.seq, self.now)
        else:
            self.state.renew([h.seq], h.worker, self.now)
            assert self.state.holders[h.seq].taken
        assert self.state.tokens <= tokens - 1.0 + 1e-9, "an early start spent no token"
        self.times.append(self.now)
        self.early = True
        self._grant()

    @rule(fairness=st.sampled_from(["a", "b", "c"]), again=st.booleans())
    def request(self, fairness: str, again: bool) -> None:
        self.seq += 1
        held = list(self.state.holders.values())
        if again and held:
            # the same attempt asks again (its run replayed elsewhere)
            h = held[0]
            w = Waiter(self.seq, h.key, h.run, 0, "w2", fairness)
            moved = self.state.request(w, self.now)
            assert moved is not None, "a held permit's attempt asking again is answered"
            assert len(self.state.holders) == len(held), "a move made a second permit"
            self.granted.add(self.seq)
        else:
            self.keys += 1
            w = Waiter(self.seq, f"k{self.keys}", "r", 0, "w1", fairness)
            assert self.state.request(w, self.now) is None
        self._grant()

    @precondition(lambda self: self.state.holders)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        taken = sorted(s for s, h in self.state.holders.items() if h.taken)
        if not taken:
            return
        seq = data.draw(st.sampled_from(taken))
        assert self.state.release(seq, self.now)
        assert not self.state.release(seq), "released twice"
        self._grant()

    @rule(dt=st.floats(0.0, 3.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        # (a worker renews the permits its attempts took)
        taken = [s for s, h in self.state.holders.items() if h.taken and s % 2]
        self.state.renew(taken, "w1", self.now - dt)
        for h in self.state.expire(self.now):
            assert h.seq not in self.reclaimed, "reclaimed twice"
            assert h.expires <= self.now
            assert h.seq not in self.state.taking, "a reclaimed permit's take waits on"
            self.reclaimed.add(h.seq)
            self.lost_keys.append(h.key)
        self._grant()

    @rule()
    def restart(self) -> None:
        """The limit actor's worker dies: a new activation restores the snapshot."""
        requests = {w.seq: w for q in self.state.queues.values() for w in q}
        snap = self.state.snapshot(self.seq)
        self.state = LimitState.restore(snap, requests)
        self.state.fresh_leases(self.now)
        self._grant()

    @rule(concurrent=st.integers(1, 4))
    def reconfigure(self, concurrent: int) -> None:
        self.config = LimitConfig(per_second=self.config.per_second, burst=3, concurrent=concurrent)
        for seq in self.state.configure(self.config, self.now):
            self.granted.discard(seq)  # (a take refused: granted again later)
        self._grant()

    @invariant()
    def rate(self) -> None:
        per, burst = 5.0, 3
        slack = per * AHEAD if self.early else 0.0
        t = sorted(self.times)
        for i in range(len(t)):
            for j in range(i, len(t)):
                w = t[j] - t[i]
                assert j - i + 1 <= burst + per * w + slack + 1e-6, (
                    f"{j - i + 1} attempts started in {w:.3f} s: over burst + rate"
                )

    @invariant()
    def a_take_waits_only_for_a_token(self) -> None:
        s = self.state
        assert all(seq in s.holders for seq in s.taking), "a take of a permit nobody holds"
        asking = [t for t in s.taking.values() if t.asking and self.now - t.asked < HOLD]
        if asking:
            assert s.tokens < 1.0, "a take left waiting while the bucket has a token"
            look = s.next_look(self.now)
            assert look is not None
            # (the bucket may owe tokens: an earlier worker's starts)
            assert look <= self.now + (1 - s.tokens) / 5.0 + 1e-9

    @invariant()
    def one_permit_per_attempt(self) -> None:
        held = [h.key for h in self.state.holders.values()]
        queued = [w.key for q in self.state.queues.values() for w in q]
        assert len(set(held)) == len(held), "an attempt holds two permits"
        assert not set(held) & set(queued), "an attempt holds a permit and waits for one"

    @invariant()
    def a_waiter_waits_only_for_room(self) -> None:
        s = self.state
        if not s.queues:
            return
        cfg = self.config
        full = cfg.concurrent is not None and len(s.holders) >= cfg.concurrent
        # grants ahead of tokens (none while earlier workers start on their grants)
        early = s.early is not None and self.now - s.early < PICKUP
        ahead = s.pickups() + 1 > s.tokens + (0.0 if early else 5.0 * AHEAD) + 1e-9
        assert full or ahead, "a waiter left waiting while the limit has room"
        look = s.next_look(self.now)
        # (waiting for a take, or a lease to run out, with tokens at the burst)
        assert look is not None, "a waiter and no time to look again"

    def teardown(self) -> None:
        # the clock runs: every take waiting for a token is answered
        for _ in range(100):
            if not self.state.taking:
                break
            self.now += 0.4
            for seq, take in list(self.state.taking.items()):  # each step asks again
                h = self.state.holders[seq]
                ask = Ask(key=h.key, run="r", partition=0, worker="w2", take=take.take)
                self.state.ask(ask, self.now)
            self._grant()
        assert not self.state.taking, "a take never answered"
        # everything released, the clock runs: every waiter is served, in turn
        for _ in range(1000):
            if not self.state.queues:
                break
            for seq in list(self.state.holders):
                self.state.release(seq)
            self.now += 1.0
            self._grant()
        assert not self.state.queues, "a waiter never served"


Limits.TestCase.settings = machine_settings(300, 40)
test_the_limit_machine = Limits.TestCase


def test_keys_are_served_round_robin() -> None:
    state = LimitState()
    state.configure(LimitConfig(concurrent=1), 0.0)
    for i in range(200):
        state.request(Waiter(i + 1, f"a{i}", "r", 0, "w", "A"), 0.0)
    first = state.grants(0.0)
    assert [g.waiter.fairness for g in first] == ["A"]
    for i in range(20):
        state.request(Waiter(1000 + i, f"b{i}", "r", 0, "w", "B"), 0.0)
    order = []
    for _ in range(60):
        (held,) = state.holders
        state.release(held)
        (g,) = state.grants(0.0)
        order.append(g.waiter.fairness)
    # B's 20 are served before A's 40th: alternating while both wait
    assert order[:40] == ["A", "B"] * 20 or order[:40] == ["B", "A"] * 20
    assert math.isclose(order.count("B"), 20)


def test_a_lease_not_renewed_is_reclaimed_once() -> None:
    """A permit sent to a run's inbox is kept PICKUP seconds for its run to take it
    (a parked run comes back first); once renewed, LEASE from each renewal."""
    state = LimitState()
    state.configure(LimitConfig(concurrent=1), 0.0)
    state.request(Waiter(1, "a", "r", 0, "w", ""), 0.0)
    state.request(Waiter(2, "b", "r", 0, "w", ""), 0.0)
    state.request(Waiter(3, "c", "r", 0, "w", ""), 0.0)
    assert [g.waiter.seq for g in state.grants(0.0)] == [1]
    assert state.expire(PICKUP - 0.1) == []
    assert [h.seq for h in state.expire(PICKUP)] == [1]
    assert state.expire(PICKUP + 1) == []
    t = PICKUP + 1
    assert [g.waiter.seq for g in state.grants(t)] == [2]
    state.renew([2], "w", t + 1)  # taken: LEASE from here, the pickup's time is over
    assert state.expire(t + 1 + LEASE - 0.1) == []
    assert [h.seq for h in state.expire(t + 1 + LEASE)] == [2]


def test_a_permit_never_taken_spends_no_token() -> None:
    """The bucket is spent as attempts take their permits (start), not as they are
    granted: grants to runs that never come back cost no token, and the takes wait
    for tokens in the order they asked."""
    state = LimitState()
    state.configure(LimitConfig(per_second=2.0, burst=2), 0.0)
    for i in range(1, 4):
        state.request(Waiter(i, f"a{i}", "r", 0, "w", ""), 0.0)
    # 2 tokens + 2/s * AHEAD granted ahead, none spent
    assert [g.waiter.seq for g in state.grants(0.0)] == [1, 2, 3]
    assert state.tokens == 2.0
    assert [h.seq for h in state.expire(PICKUP)] == [1, 2, 3]  # never taken
    assert state.tokens == 2.0
    for i in range(4, 7):
        state.request(Waiter(i, f"a{i}", "r", 0, "w", ""), PICKUP)
    assert [g.waiter.seq for g in state.grants(PICKUP)] == [4, 5, 6]
    t = PICKUP
    asks = [Ask(key=f"a{i}", run="r", partition=0, worker="w") for i in (6, 4, 5)]
    answers = [state.ask(a, t) for a in asks]
    assert [type(a).__name__ for a in answers] == ["Grant", "Grant", "Queued"]
    assert state.takes(t + 0.1) == []  # no token yet
    assert state.told_to_wait(t + 0.5) == [5]  # HOLD: its step asks again
    assert state.takes(t + 0.5) == []  # (not asking: no token spent for it)
    again = state.ask(asks[2], t + 0.5)  # asked again: its token, first in line
    assert isinstance(again, Grant)
    assert again.waiter.seq == 5


def test_a_snapshot_of_the_previous_version_restores_its_holders_as_not_taken() -> None:
    """A ``limit.state`` record journaled before holders said whether they were taken:
    each is read as not taken (its attempt, asking again, spends a token: at worst one
    too few, never one too many)."""
    old = (
        b'{"config":{"per_second":5.0,"burst":3},"tokens":2.0,"refilled_at":1.0,'
        b'"holders":[{"seq":7,"key":"k.1","run":"r","partition":0,"worker":"w",'
        b'"expires":3.0}],"queues":[],"seen":7,"fast":0,"untrimmed":1}'
    )
    state = LimitState.restore(msgspec.json.decode(old, type=Snapshot), {})
    assert [(h.seq, h.taken) for h in state.holders.values()] == [(7, False)]
    g = state.ask(Ask(key="k.1", run="r", partition=0, worker="w"), 1.0)
    assert isinstance(g, Grant)
    assert g.waiter.seq == 7
    assert state.tokens == 1.0
