"""Starting a run (``actors/starts.py``): what one start writes, over the in-memory store."""

from __future__ import annotations

import time

import msgspec

from fusee.actors.starts import start_or_attach
from fusee.runtime.history import History
from fusee.runtime.ids import escape
from fusee.runtime.index import decode_info
from fusee.runtime.records import RunStarted
from tests.memory_store import MemoryStore


def _record(partition: int = 3) -> RunStarted:
    return RunStarted(
        workflow="w", input=msgspec.Raw(b"1"), started_at=time.time(), partition=partition
    )


async def _attach() -> None:
    raise AssertionError("a new run does not attach")


async def test_a_start_is_one_write_its_marker_riding_it_then_a_wake_hint() -> None:
    store = MemoryStore()
    assert await start_or_attach(store, "r", _record(), now=5.0, attach=_attach)
    eid = escape("r")
    assert [m.seq for m in store.journal(eid)] == [1]
    assert store.appends == 1  # the marker rode the record's write
    marker = decode_info(store.run_markers[3, eid])
    assert (marker.run_id, marker.workflow, marker.status) == ("r", "w", "pending")
    assert store.index == {}  # nothing indexed at the start: runs list reads the marker
    assert store.published == [("wake.3", b"r")]  # its owner is told at once


async def test_a_start_with_copies_marks_the_run_after_them() -> None:
    store = MemoryStore()
    seen: list[dict[tuple[int, str], bytes]] = []

    async def copies(history: History) -> None:
        seen.append(dict(store.run_markers))  # no marker yet: no worker runs it without them

    assert await start_or_attach(
        store, "r", _record(), now=5.0, attach=_attach, before_active=copies
    )
    assert seen == [{}]
    assert (3, escape("r")) in store.run_markers
    assert store.published == [("wake.3", b"r")]


async def test_a_second_start_attaches_and_writes_nothing() -> None:
    store = MemoryStore()
    assert await start_or_attach(store, "r", _record(), now=5.0, attach=_attach)
    attached: list[bool] = []

    async def attach() -> None:
        attached.append(True)

    assert not await start_or_attach(store, "r", _record(), now=6.0, attach=attach)
    assert attached == [True]
    assert store.appends == 2  # the refused one
    assert [m.seq for m in store.journal(escape("r"))] == [1]
