"""What a parked run that a signal brings back waits for before it takes the signal:
its journal and its inbox, read together, and not its first index entry ("running"),
which is written while the run goes on. Each is held open by a hook on the real store
(the test decides when the call goes on), so nothing here depends on timing: before
the change, each run waited for the held call and the test timed out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import pytest
import structlog

import fusee
from fusee.runtime.ids import partition_of
from fusee.runtime.index import decode_info
from tests.workers.procs import wait_until

pytestmark = pytest.mark.timeout(60)


@fusee.workflow("activation_path")
async def waits_for_go(ctx: fusee.Context, _arg: None) -> Any:
    return await ctx.wait_for("go")


def _patch(store: Any, name: str, fn: Callable[..., Awaitable[Any]]) -> None:
    """The store's ``name`` call replaced by ``fn`` (which calls the real one)."""
    setattr(store, name, fn)


async def _parked(engine: fusee.Engine, worker: Any, run_id: str) -> fusee.Run:
    run = await engine.start(waits_for_go, run_id, None)

    async def parked() -> bool:
        return run_id in worker.parked

    await wait_until(parked, timeout=20, what=f"{run_id} to leave memory")
    return run


async def test_a_resumed_run_takes_its_signal_while_its_index_entry_is_written(
    engine: fusee.Engine,
) -> None:
    store = engine.store
    real: Callable[..., Awaitable[Any]] = store.put_index
    eid = fusee.Run(engine, "resume-index").eid
    armed, entered, release = False, anyio.Event(), anyio.Event()

    async def put_index(e: str, value: bytes, **kwargs: Any) -> Any:
        if armed and e == eid and not entered.is_set() and decode_info(value).status == "running":
            entered.set()  # the resumed activation's first entry: held
            await release.wait()
        return await real(e, value, **kwargs)

    _patch(store, "put_index", put_index)
    async with engine.worker() as worker:
        run = await _parked(engine, worker, "resume-index")
        armed = True
        assert await run.signal("go", 7)
        await entered.wait()
        with anyio.fail_after(20):  # before the change: held behind the entry
            assert await run.result() == 7
        release.set()

        async def completed() -> bool:
            raw = await store.get_index(eid)
            return raw is not None and decode_info(raw).status == "completed"

        # the end's entry waited for the held one: it is not overwritten by it
        await wait_until(completed, timeout=20, what="the index to say completed")


async def test_a_resumed_run_that_parks_again_is_indexed_waiting(engine: fusee.Engine) -> None:
    """Its first entry ("running") and the one it writes as it parks again ("waiting")
    are made from the same journal record: the second must be written after the first,
    or the first, landing last, would say "running" of a parked run."""
    store = engine.store
    real: Callable[..., Awaitable[Any]] = store.put_index
    run_id = "resume-repark"
    eid = fusee.Run(engine, run_id).eid
    armed, entered, release = False, anyio.Event(), anyio.Event()

    async def put_index(e: str, value: bytes, **kwargs: Any) -> Any:
        if armed and e == eid and not entered.is_set() and decode_info(value).status == "running":
            entered.set()
            await release.wait()
        return await real(e, value, **kwargs)

    def parks(logs: Sequence[Mapping[str, Any]]) -> int:  # (the only run here)
        return sum(e["event"] == "run.parked" for e in logs)

    _patch(store, "put_index", put_index)
    with structlog.testing.capture_logs() as logs:
        async with engine.worker() as worker:
            await _parked(engine, worker, run_id)
            armed = True
            # brought back with nothing for its wait (a hint, no message): it parks again
            await store.wake(partition_of(run_id, engine.partitions), eid)
            await entered.wait()
            await wait_until(lambda: parks(logs) == 2, timeout=20, what="it to park again")
            release.set()

            async def parked() -> bool:
                return run_id in worker.parked

            await wait_until(parked, timeout=20, what="it to leave memory again")
    raw = await store.get_index(eid)
    assert raw is not None
    assert decode_info(raw).status == "waiting"


async def test_a_resumed_run_reads_its_journal_and_inbox_together(engine: fusee.Engine) -> None:
    store = engine.store
    real_journal: Callable[..., Awaitable[Any]] = store.read_journal
    real_inbox: Callable[..., Awaitable[Any]] = store.read_inbox
    eid = fusee.Run(engine, "resume-reads").eid
    armed, inbox_read = False, anyio.Event()

    async def read_journal(e: str, *args: Any, **kwargs: Any) -> Any:
        if armed and e == eid:
            with anyio.fail_after(20):  # before the change: the inbox was read after
                await inbox_read.wait()
        return await real_journal(e, *args, **kwargs)

    async def read_inbox(p: int, e: str, *args: Any, **kwargs: Any) -> Any:
        if armed and e == eid:
            inbox_read.set()
        return await real_inbox(p, e, *args, **kwargs)

    _patch(store, "read_journal", read_journal)
    _patch(store, "read_inbox", read_inbox)
    async with engine.worker() as worker:
        run = await _parked(engine, worker, "resume-reads")
        armed = True
        assert await run.signal("go", 8)
        assert await run.result(timeout=20) == 8
