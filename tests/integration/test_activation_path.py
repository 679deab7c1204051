"""What a parked run that a signal brings back waits for before it takes the signal:
its journal and its inbox, read together. The journal read is held open by a hook on
the real store until the inbox read began (the test decides when the call goes on), so
nothing here depends on timing: before the change, the inbox was read after the
journal, and the test timed out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import fusee
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
