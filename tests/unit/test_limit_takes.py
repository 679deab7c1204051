"""Takes of granted permits (runtime/limits.py), driven in the order limit_actor.py
does: a worker of an earlier version starting on its grant is held to the rate, a take
asked again (its answer lost) is charged once, a lowered rate leaves no take waiting
past AHEAD, a take told to wait and gone does not make the actor look at once. (The
review of fix/pickup's repros: each failed on it.)"""

from __future__ import annotations

import bisect

from fusee.runtime.limits import (
    AHEAD,
    HOLD,
    LEASE,
    RENEW_EVERY,
    Ask,
    Grant,
    LimitConfig,
    LimitState,
    Queued,
    Waiter,
)


def _most_in(times: list[float], w: float) -> int:
    t = sorted(times)
    return max((bisect.bisect_right(t, x + w) - i for i, x in enumerate(t)), default=0)


def test_1_an_earlier_worker_starting_on_the_grant_is_held_to_the_rate() -> None:
    """Rolling upgrade. A worker of main's version decodes PermitGrant(take=True) as a
    plain grant (msgspec ignores the unknown field), starts at once, renews, releases:
    it never asks to take. renew()/release() of a not-taken holder spend no token and
    free the pickups slot, so grants flow at (tokens + per_second*AHEAD) per renewal
    period with the bucket never spent: 50/s, burst 10 -> ~87/s of starts."""
    rate, burst = 50.0, 10
    s = LimitState()
    s.configure(LimitConfig(per_second=rate, burst=burst), 0.0)
    seq, t = 0, 0.0
    starts: list[float] = []
    while t < 6.0:
        for _ in range(40):  # a deep queue
            seq += 1
            s.request(Waiter(seq, f"k{seq}.1", "r", 0, "old", ""), t)
        # the earlier worker starts each attempt as it reads its grant
        starts.extend(t for _ in s.grants(t))
        s.renew(list(s.holders), "old", t + 0.01)  # its worker's renewal ...
        for h in list(s.holders):
            s.release(h)  # ... and the attempt ends
        t += RENEW_EVERY
    most = _most_in(starts, 2.0)
    assert most <= 2 * rate + burst, f"{most} attempts started in 2 s against {2 * rate + burst}"


def test_2_a_take_whose_answer_was_lost_is_not_charged_twice() -> None:
    """core.py _ask(taking=True): no answer within ASK_PATIENCE -> ask again. The
    first take was journaled and spent a token; the re-ask (same take ID, nothing
    started) must not spend another (fix/pickup did: on a limit actor answering
    later than ASK_PATIENCE every time, tokens burnt at the full rate and no attempt
    started)."""
    s = LimitState()
    s.configure(LimitConfig(per_second=1.0, burst=2), 0.0)
    s.request(Waiter(1, "k.1", "r", 0, "w", ""), 0.0)
    assert [g.waiter.seq for g in s.grants(0.0)] == [1]
    ask = Ask(key="k.1", run="r", partition=0, worker="w", take="w1:1")
    assert isinstance(s.ask(ask, 0.0), Grant)  # taken, journaled; its answer is lost
    assert s.tokens == 1.0
    again = s.ask(ask, 0.0)  # the same step asks again at once: one start, one token
    assert isinstance(again, Grant)
    assert s.tokens == 1.0, f"one start charged {2.0 - s.tokens:.0f} tokens"
    # its answers lost until it gave up: its durable request names the take, and the
    # permit moves to it taken (the grant says start on it, no take)
    moved = s.request(Waiter(2, "k.1", "r", 0, "w", "", take="w1:1"), 0.0)
    assert moved is not None
    assert moved.moved
    assert moved.taken
    assert s.tokens == 1.0
    # a replay of the step (another acquire: a new take) is a new start: a token
    replay = s.ask(Ask(key="k.1", run="r", partition=0, worker="w2", take="w2:1"), 0.0)
    assert isinstance(replay, Grant)
    assert s.tokens == 0.0


def test_3_a_take_waits_about_AHEAD_also_after_the_rate_is_lowered() -> None:
    """limits.py AHEAD: 'a take waits for its token at most about this long'. Grants
    made at 50/s (10 + 25 ahead), then `fusee limits set --per-second 0.01`: the 25
    takes queue for 100 s each, in worker memory (acquire_permit's take loop never
    parks), re-asking every HOLD: the last waits ~2,500 s. Issue 12: 'a run waiting
    longer than a moment parks'."""
    s = LimitState()
    s.configure(LimitConfig(per_second=50.0, burst=10), 0.0)
    for i in range(1, 41):
        s.request(Waiter(i, f"k{i}.1", "r", 0, "w", ""), 0.0)
    granted = [g.waiter.seq for g in s.grants(0.0)]
    assert len(granted) == 35
    s.configure(LimitConfig(per_second=0.01, burst=1), 0.0)
    asked: dict[int, float] = {}
    for seq in granted:
        g = s.ask(Ask(key=f"k{seq}.1", run="r", partition=0, worker="w"), 0.0)
        if isinstance(g, Queued):
            asked[seq] = 0.0
    t, waited = 0.0, 0.0
    while asked and t < 5000:
        t += HOLD
        for seq in list(asked):  # re-asked every HOLD (its lease kept alive)
            s.ask(Ask(key=f"k{seq}.1", run="r", partition=0, worker="w"), t)
        for g in s.takes(t, asked):
            waited = max(waited, t - asked.pop(g.waiter.seq))
    assert waited <= AHEAD + 1 / 0.01 + HOLD, f"a take waited {waited:.0f} s in memory"


def test_4_the_actor_does_not_spin_while_a_take_it_told_to_wait_is_away() -> None:
    """limit_actor._serve: a take answered WAIT leaves `_taking` but stays in
    `state.taking`; takes(now, asking) skips it. Its step dead (worker SIGKILLed, run
    cancelled mid-take), it stays until its holder expires: ask() keeps
    max(expires, now + LEASE), so a fresh grant's PICKUP (10 s), not LEASE. Once the
    bucket has a token, next_look() says `now` (it ignores `asking`), the actor's wait
    is max(0, min(TICK, until - now)) = 0: a hot loop for up to PICKUP s. (The machine
    never passes `asking`, so its invariant 'a take waits only while the bucket is
    empty' holds there and not in the actor.)"""
    s = LimitState()
    s.configure(LimitConfig(per_second=10.0, burst=1), 0.0)
    s.request(Waiter(1, "a.1", "r", 0, "w", ""), 0.0)
    s.request(Waiter(2, "b.1", "r", 0, "w", ""), 0.0)
    assert len(s.grants(0.0)) == 2
    assert isinstance(s.ask(Ask(key="a.1", run="r", partition=0, worker="w"), 0.0), Grant)
    assert isinstance(s.ask(Ask(key="b.1", run="r", partition=0, worker="w"), 0.0), Queued)
    t = 0.05  # no token yet; HOLD passes later: told WAIT, out of `_taking`; its step is dead
    assert s.takes(t, {}) == []
    t = 0.6  # a token now; nobody asks
    assert s.takes(t, {}) == []
    look = s.next_look(t)
    assert look is not None
    assert look > t, (
        f"next_look {look} == now with nothing to do until the lease ends at "
        f"{s.holders[2].expires} (LEASE {LEASE}): the actor spins"
    )


def test_a_fast_grant_answered_late_is_started_on_with_one_token() -> None:
    """A fast grant (taken as it is granted) whose answer came after its step gave up:
    the step's durable request names its take, and the permit moves to it taken (the
    grant says start on it): one start, one token (not a second take)."""
    s = LimitState()
    s.configure(LimitConfig(per_second=1.0, burst=2), 0.0)
    fast = s.ask(Ask(key="k.1", run="r", partition=0, worker="w", take="w1:1"), 0.0)
    assert isinstance(fast, Grant)
    assert fast.waiter.seq < 0
    assert s.tokens == 1.0
    moved = s.request(Waiter(5, "k.1", "r", 0, "w", "", take="w1:1"), 0.0)
    assert moved is not None
    assert moved.taken
    assert s.holders[5].taken
    assert s.tokens == 1.0
    # a request of another take (a replay) moves it to be taken again: a new start
    again = s.request(Waiter(6, "k.1", "r", 0, "w2", "", take="w2:1"), 0.0)
    assert again is not None
    assert not again.taken
