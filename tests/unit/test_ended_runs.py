"""A run activated again after its end (its worker died before what follows the end
was done, or a reconcile listed its marker in the second it lingers), and a run with
no journal that is still indexed: what they say and what they read."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import structlog.testing

import fusee
from fusee.actors.registry import Registry, Workflow
from fusee.runtime.inbox import Cancel, encode_message
from fusee.runtime.index import RunInfo, decode_info, encode_info
from fusee.runtime.records import RunStarted, encode_record
from tests.memory_store import MemoryStore, run_actor


class Counting(MemoryStore):
    """Counts the reads of the run index."""

    entries: int = 0  # get_index_entry: the final entry, then the bucket's
    finals: int = 0  # get_final_entry: the final entry alone

    async def get_index_entry(self, eid: str) -> tuple[bytes, int, int] | None:
        self.entries += 1
        return await super().get_index_entry(eid)

    async def get_final_entry(self, eid: str) -> tuple[bytes, int] | None:
        self.finals += 1
        return await super().get_final_entry(eid)


async def _one(ctx: fusee.Context, _arg: Any) -> int:
    return int(await ctx.step("one", lambda: 1))


def _registry() -> Registry:
    registry = Registry()
    registry.add(Workflow("one", _one, Any, True))
    return registry


def _ended_with_a_cancel_in_its_inbox() -> Counting:
    store = Counting()
    start = RunStarted(workflow="one", input=msgspec.Raw(b"null"), started_at=0.0)
    store.seed("r", encode_record(start))

    async def end() -> None:
        assert await run_actor(store, _registry(), clock=lambda: 1.0).run() == "ended"

    anyio.run(end)
    body = encode_message(Cancel(reason="too late"))
    anyio.run(store.send_inbox, 0, "r", "cancel", body)
    store.entries = store.finals = 0
    return store


def test_an_ended_run_activated_again_does_not_say_it_is_cancelling() -> None:
    """(Before: the inbox, read with the journal, logged ``run.cancelling`` for the
    cancel that came after the end; nothing was cancelled.)"""
    store = _ended_with_a_cancel_in_its_inbox()
    with structlog.testing.capture_logs() as logs:
        outcome = anyio.run(run_actor(store, _registry(), clock=lambda: 2.0).run)
    assert outcome == "ended"
    assert [e["event"] for e in logs if e["event"].startswith("run.")] == [], logs
    assert store.journal("r")[-1].data.startswith(b'{"kind":"run.completed"')


def test_an_ended_run_activated_again_reads_only_its_final_entry() -> None:
    """Its entry is written over anything but a final entry that says the same: the
    bucket's is not read (before: both, each time), and nothing is written again."""
    store = _ended_with_a_cancel_in_its_inbox()
    final = store.ended["r"]
    outcome = anyio.run(run_actor(store, _registry(), clock=lambda: 2.0).run)
    assert outcome == "ended"
    assert (store.entries, store.finals) == (0, 1)
    assert store.ended["r"] == final  # (the same: not written again)


def test_a_run_without_its_journal_reads_its_index_entry_once() -> None:
    """Indexed, but its journal is gone: it is paused in the index, from one read of
    the entry (before: three, the check, the pause's and the write's)."""
    store = Counting()
    info = RunInfo(run_id="r", workflow="one", status="waiting")
    store.index["r"] = (encode_info(info), 4, 7)
    store.run_markers[0, "r"] = b"{}"
    outcome = anyio.run(run_actor(store, _registry(), clock=lambda: 2.0).run)
    assert outcome == "paused"
    assert store.entries == 1
    paused = decode_info(store.index["r"][0])
    assert paused.status == "paused"
    assert paused.reason is not None
    assert "is gone" in paused.reason
    assert (0, "r") not in store.run_markers
