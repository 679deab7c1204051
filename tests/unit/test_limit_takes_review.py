"""Two defects a review of the take-at-start limits found (fix/pickupfix), kept: a
lowered rate puts its refused takes back in their order, and a taken permit moved to its
run's inbox waits the way back (PICKUP), not a LEASE (a slot granted twice)."""

from __future__ import annotations

from fusee.runtime.limits import Ask, LimitConfig, LimitState, Queued, Waiter


def _ask(seq: int, take: str) -> Ask:
    return Ask(key=f"k{seq}.1", run=f"r{seq}", partition=0, worker="w", fairness="", take=take)


def test_a_lowered_rate_puts_its_takes_back_in_their_order() -> None:
    """configure() refuses the takes too far from their token and _requeue()s each with
    appendleft, in the order they asked: the LAST one ends at the front. Takes 3, 4, 5
    asked in that order come back queued 5, 4, 3 (fairness: first come, first served
    within a key, broken by every lowering of the rate)."""
    s = LimitState()
    s.configure(LimitConfig(per_second=10.0, burst=1), 0.0)
    for seq in range(1, 6):
        s.request(Waiter(seq, f"k{seq}.1", f"r{seq}", 0, "w", ""), 0.0)
    granted = [g.waiter.seq for g in s.grants(0.0)]
    assert granted == [1, 2, 3, 4, 5]  # 1 token + 10/s * AHEAD
    got = [s.ask(_ask(seq, f"t{seq}"), 0.0) for seq in granted]
    assert got[0] is not None  # the one token
    assert not isinstance(got[0], Queued)
    assert all(isinstance(g, Queued) for g in got[1:])
    refused = s.configure(LimitConfig(per_second=0.5, burst=1), 0.0)
    assert refused, "some takes are too far at 0.5/s"
    queue = [w.seq for w in s.queues[""]]
    assert queue == sorted(queue), f"requeued in reverse: {queue} (refused {refused})"


def test_a_taken_permit_moved_to_the_inbox_gets_its_pickup_time() -> None:
    """request() of a take that took its permit (answer lost, limits.py:391) sends the
    grant through the run's inbox (take=False: start on it) but gives the holder only
    LEASE (2 s), not _pickup(): an inbox grant's way back takes over LEASE under load
    (PICKUP's own comment). Reclaimed at 2 s, the attempt then starts on a permit the
    limit no longer counts (its renewals and release are for a seq that is gone) and a
    second attempt is granted: concurrent=1 admits 2."""
    s = LimitState()
    s.configure(LimitConfig(concurrent=1), 0.0)
    a = Ask(key="k1.1", run="r1", partition=0, worker="w", take="t1")
    assert s.ask(a, 0.0) is not None  # taken by t1, the answer lost
    g = s.request(Waiter(1, "k1.1", "r1", 0, "w", "", "t1"), 1.0)  # its durable request
    assert g is not None
    assert g.taken  # the run starts on the inbox grant once it reads it
    s.request(Waiter(2, "k2.1", "r2", 0, "w", ""), 1.0)
    s.expire(3.1)  # the grant is read at 3.2 s (a loaded worker): the holder is gone
    s.renew([1], "w", 3.2)
    assert [w.waiter.seq for w in s.grants(3.2)] == [], "a second permit with concurrent=1"
