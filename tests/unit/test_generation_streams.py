"""Token streams and generations: a later generation's streams have their own names,
and a generation's streams end with it (the folds of ``fusee.runtime.tokens``)."""

from __future__ import annotations

import msgspec

from fusee.runtime.records import RunContinued, RunStarted
from fusee.runtime.tokens import StreamEnd, generation_stream

RAW = msgspec.Raw(b"1")


def test_a_later_generation_streams_under_its_own_name() -> None:
    assert generation_stream(40, True, "agent/turn-0") == "agent/turn-0"  # as before
    assert generation_stream(40, False, "agent/turn-0") == "40/agent/turn-0"


def test_a_followed_stream_is_over_when_the_run_continues() -> None:
    """A reader following generation 0's stream stops at ``run.continued``: what the
    next generation streams is under another name."""
    watch = StreamEnd("agent/turn-0")
    watch.feed(RunStarted(workflow="w", input=RAW, started_at=1.0))
    assert not watch.is_over()
    watch.feed(RunContinued(workflow="w", input=RAW, started_at=1.0, generation=1))
    assert watch.is_over()
