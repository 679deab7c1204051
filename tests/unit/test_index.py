"""The run index never goes back: which entry may replace which (``supersedes``)."""

from __future__ import annotations

from typing import Any

import pytest

from fusee.runtime.index import RunInfo, supersedes


def _info(status: Any, reason: str | None = None) -> RunInfo:
    return RunInfo(run_id="r", workflow="w", status=status, reason=reason)


@pytest.mark.parametrize(
    ("new", "new_seq", "old", "old_seq", "ok"),
    [
        ("waiting", 5, "completed", 9, False),  # a stale owner parks after the end
        ("running", 5, "waiting", 9, False),
        ("completed", 9, "waiting", 5, True),
        ("waiting", 5, "running", 5, True),  # parked: no new record
        ("running", 5, "waiting", 5, True),  # activated again, before wait.done
        ("pending", 1, "running", 1, False),  # the starter's entry lands late
        ("pending", 1, "pending", 1, True),
        ("waiting", 9, "completed", 9, False),
        ("paused", 3, "running", 3, True),
        ("running", 3, "running", 0, True),  # an untagged entry of an older fusee
    ],
)
def test_supersedes(new: str, new_seq: int, old: str, old_seq: int, ok: bool) -> None:
    assert supersedes(_info(new), new_seq, _info(old), old_seq) is ok


def test_a_workers_note_replaces_a_live_entry_of_the_same_record() -> None:
    note = _info("pending", "no live worker serves workflow 'w'")
    assert supersedes(note, 5, _info("running"), 5)
    assert not supersedes(note, 5, _info("completed"), 5)
    assert not supersedes(note, 4, _info("running"), 5)
