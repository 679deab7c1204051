"""A paused run's leaving unmark is conditional (issue 12's review of the pause
fixes): a cancel or a resume stores its inbox message, then writes the run's marker;
the activation that leaves without having read it must not remove that marker, or no
owner ever reads the message once its worker dies."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import pytest

import fusee
from fusee.adapters.jetstream.store import NatsStore
from fusee.runtime.index import RunInfo, encode_info


def _paused(run_id: str) -> bytes:
    info = RunInfo(
        run_id=run_id, workflow="w", status="paused", created_at=time.time(), partition=0
    )
    return encode_info(info)


async def _listed(store: NatsStore) -> list[str]:
    return [eid async for found in store.listed_pages("paused", "w") for eid, _, _ in found]


def _after_marker_read(
    store: NatsStore,
    eid: str,
    write: Callable[[], Awaitable[object]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``write`` runs once, right after the unmark's first read of the marker."""
    read = store._direct_last
    done: list[bool] = []

    async def direct_last(subject: str) -> object:
        got = await read(subject)
        if subject == store.layout.marker(0, eid) and not done:
            done.append(True)
            await write()
        return got

    monkeypatch.setattr(store, "_direct_last", direct_last)


async def test_a_paused_runs_unmark_removes_its_marker_and_lists_it(engine: fusee.Engine) -> None:
    store = engine.store
    raw = _paused("lp-1")
    await store.mark_run_active(0, "lp-1", raw)
    assert await store.clear_run_active(0, "lp-1", listed=raw, seen=0)
    assert not await store.has_run_marker(0, "lp-1")
    assert await _listed(store) == ["lp-1"]


async def test_a_message_the_leaving_activation_did_not_read_keeps_the_marker(
    engine: fusee.Engine,
) -> None:
    store = engine.store
    raw = _paused("lp-2")
    await store.mark_run_active(0, "lp-2", raw)
    seen = await store.send_inbox(0, "lp-2", "cancel", b'{"kind":"cancel"}')
    await store.send_inbox(0, "lp-2", "cancel", b'{"kind":"cancel"}')  # not read
    assert not await store.clear_run_active(0, "lp-2", listed=raw, seen=seen)
    assert await store.has_run_marker(0, "lp-2")
    assert await _listed(store) == []  # nothing of the removal was written


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "alone"])
async def test_a_marker_written_while_the_unmark_is_made_stays(
    engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch, listed: bool
) -> None:
    store = engine.store
    raw = _paused("lp-3")
    await store.mark_run_active(0, "lp-3", raw)
    # a cancel's marker, written after the unmark read the marker (its message, before
    # the inbox was read, would be seen there: this is the write that comes later)
    _after_marker_read(store, "lp-3", lambda: store.mark_run_active(0, "lp-3", raw), monkeypatch)
    assert not await store.clear_run_active(0, "lp-3", listed=raw if listed else None, seen=0)
    assert await store.has_run_marker(0, "lp-3")
    assert await _listed(store) == []


async def test_a_removal_made_meanwhile_lets_the_unmark_try_again(
    engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = engine.store
    raw = _paused("lp-4")
    await store.mark_run_active(0, "lp-4", raw)
    # another removal (no marker) between the read and the write: read again, removed
    _after_marker_read(store, "lp-4", lambda: store.clear_run_active(0, "lp-4"), monkeypatch)
    assert await store.clear_run_active(0, "lp-4", listed=raw, seen=0)
    assert not await store.has_run_marker(0, "lp-4")
    assert await _listed(store) == ["lp-4"]
