"""A commit the store fails is not the workflow's error: its code cannot catch it, and
the run does not end on it (it resumes from its journal once the store is back)."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest

import fusee
from fusee.actors.registry import Registry, Workflow
from fusee.actors.run_actor import RunActor
from fusee.runtime.history import History
from fusee.runtime.records import RunCompleted, RunStarted, encode_record
from tests.memory_store import MemoryStore, run_actor


class FailingStore(MemoryStore):
    """Fails the ``fail_at``-th append the way a store that lost NATS does."""

    fail_at: int = 0

    async def append(self, eid: str, kind: str, data: bytes, **options: Any) -> int:
        # (options: MemoryStore.append's, passed on as they came)
        if self.appends + 1 == self.fail_at:
            self.appends += 1
            raise TimeoutError("nats: timeout")
        return await super().append(eid, kind, data, **options)


async def _careless(ctx: fusee.Context, _arg: Any) -> str:
    try:
        await ctx.step("work", lambda: "done")
    except Exception:  # noqa: BLE001 - a workflow that takes a fallback on any error
        return "fallback"
    return "worked"


def _actor(store: MemoryStore) -> RunActor:
    registry = Registry()
    registry.add(Workflow("careless", _careless, Any, True))
    return run_actor(store, registry, clock=lambda: 1_800_000_000.0)


def test_a_failed_commit_is_not_an_error_the_workflow_sees() -> None:
    store = FailingStore()
    store.fail_at = 1  # the step's result
    start = RunStarted(workflow="careless", input=msgspec.Raw(b"0"), started_at=0.0)
    store.seed("r", encode_record(start))

    async def go() -> None:
        with pytest.raises(BaseException, match="nats: timeout") as failed:
            await _actor(store).run()  # (before: the workflow took its fallback, ended)
        assert failed.type.__name__ == "CommitFailed"
        # back: the run resumes from its journal, and its step's commit lands
        store.fail_at = 0
        assert await _actor(store).run() == "ended"

    anyio.run(go)
    history = History("r")
    for m in store.journal("r"):
        history.feed(m.seq, m.data)
    end = history.end
    assert isinstance(end, RunCompleted)
    assert msgspec.json.decode(bytes(end.result)) == "worked"
