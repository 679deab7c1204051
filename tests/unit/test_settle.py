"""``ctx.all`` / ``ctx.race`` settle the same way whatever order their branches end in.

On replay every journaled branch ends at once, in whatever order the event loop runs
them; live, a branch's end is journaled as it comes. Settling takes ends in journal
order, so for one journal every arrival order must give the same decision, the one a
reader of the journal would give: a race goes to the first end in the journal, an
``all`` fails with its first failure in the journal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusee.runtime import settle as settle_module
from fusee.runtime.history import History
from fusee.runtime.settle import BranchState, Ended, Settle, may_park


@st.composite
def journals(draw: st.DrawFn) -> tuple[list[Ended], list[int | None], list[int], bool, bool]:
    """Branches' ends, which of them the journal holds (in which order), an arrival
    order, and the combinator: (ends, journal order rank or None for live, arrival)."""
    n = draw(st.integers(1, 5))
    ends = draw(st.lists(st.sampled_from([Ended.VALUE, Ended.ERROR]), min_size=n, max_size=n))
    journaled = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    order = draw(st.permutations(range(n)))
    ranks: list[int | None] = [None] * n
    for rank, i in enumerate(i for i in order if journaled[i]):
        ranks[i] = rank
    arrival = draw(st.permutations(range(n)))
    race = draw(st.booleans())
    return_exceptions = draw(st.booleans())
    return ends, ranks, list(arrival), race, return_exceptions


def _settle(
    ends: list[Ended], ranks: list[int | None], arrival: list[int], race: bool, rex: bool
) -> tuple[int | None, dict[int, int]]:
    """Run the settling with branches ending in ``arrival`` order; the index of the
    deciding branch, and the journal sequence each branch's end got."""
    history = History("r")
    seq = 100
    for i, rank in enumerate(ranks):  # replayed ends: in the journal already
        if rank is not None:
            history.ends[i + 1] = seq + rank
    live_seq = seq + len(ranks)
    states: list[BranchState] = []
    for i in range(len(ends)):
        states.append(BranchState(i, states, positions=[(i + 1, "step", f"s{i}")]))
    settle = Settle(history, states, race=race, return_exceptions=rex)
    for i in arrival:
        if ranks[i] is None:  # a live branch's end is journaled as it comes
            live_seq += 1
            history.ends[i + 1] = live_seq
        states[i].ended = ends[i]
        decided = settle.ended(states[i])
        if decided is not None:
            return decided.index, dict(history.ends)
        if settle.over:
            break
    return None, dict(history.ends)


def _reading_the_journal(
    ends: list[Ended], seqs: dict[int, int], race: bool, rex: bool
) -> int | None:
    """What a reader of the journal decides: ends in journal order."""
    for i in sorted((i for i in range(len(ends)) if i + 1 in seqs), key=lambda i: seqs[i + 1]):
        if race or (ends[i] is Ended.ERROR and not rex):
            return i
    return None


@settings(max_examples=400, deadline=None, derandomize=True)
@given(journals())
def test_every_arrival_order_settles_as_the_journal_reads(
    case: tuple[list[Ended], list[int | None], list[int], bool, bool],
) -> None:
    ends, ranks, arrival, race, rex = case
    decided, seqs = _settle(ends, ranks, arrival, race, rex)
    # the live ends that came before the decision are journaled; the rest never were
    expected = _reading_the_journal(ends, seqs, race, rex)
    assert decided == expected, (ends, ranks, arrival, seqs)


@contextlib.contextmanager
def _arrival_order() -> Iterator[None]:
    """The defect: ends taken as they come, not in journal order."""
    real = settle_module.journaled_end
    settle_module.journaled_end = lambda history, branch: None
    try:
        yield
    finally:
        settle_module.journaled_end = real


def test_settling_in_arrival_order_is_found() -> None:
    with _arrival_order(), pytest.raises(AssertionError):
        test_every_arrival_order_settles_as_the_journal_reads()


def test_a_branch_leaving_decides_at_once() -> None:
    history = History("r")
    history.ends.update({1: 5, 2: 6})
    states: list[BranchState] = []
    for i in range(2):
        states.append(BranchState(i, states, positions=[(i + 1, "step", f"s{i}")]))
    settle = Settle(history, states, race=True, return_exceptions=False)
    states[1].ended = Ended.LEFT  # parked, evicted, fenced: before branch 0 replays
    assert settle.ended(states[1]) is states[1]


def test_a_wait_parks_only_once_every_branch_waits() -> None:
    states: list[BranchState] = []
    for i in range(2):
        states.append(BranchState(i, states))
    assert not may_park(states[0])  # branch 1 still runs a step
    assert may_park(states[1])  # now both wait
    assert not may_park(states[0], idle=False)  # busy again
    nested: list[BranchState] = []
    for i in range(2):
        nested.append(BranchState(i, nested, parent=states[1]))
    states[1].inner, states[1].idle = nested, False
    states[0].idle = True
    assert not may_park(nested[0])  # its sibling runs
    assert may_park(nested[1])  # all waiting, up the tree
