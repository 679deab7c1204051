"""Reviewer's checks (issue 12): two bulk resumes at once; a run paused twice; a run
resumed then ended; a run that ends while a listing is under way."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio

import fusee
from tests.integration.test_bulk import BULK, _arg, _listed, _resumes, _settled
from tests.workers.procs import wait_until


async def test_two_bulk_resumes_at_once_resume_each_run_once(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs()
    workers.module = BULK
    await workers.start()
    made = {}
    for i in range(40):
        await engine.start("bk_b", f"p-{i}", _arg(tmp_path, "pause"))
        made[f"p-{i}"] = ("bk_b", "paused", time.time())
    await _settled(engine, made)
    # a run paused twice: resumed while the provider is still down, it pauses again
    await engine.run("p-0").resume()
    await _settled(engine, {"p-0": ("bk_b", "paused", 0.0)})
    # wait for the second pause (its RunResumed journaled, then paused again)
    with anyio.fail_after(30):
        while (
            await _resumes(engine, "p-0") != 1
            or (await engine.run("p-0").describe()).status != "paused"
        ):
            await anyio.sleep(0.05)
    listed = await _listed(engine, status="paused", workflow="bk_b")
    assert listed == set(made)
    (tmp_path / "fixed").touch()
    out: list[fusee.BulkSummary] = []

    async def one() -> None:
        out.append(await engine.bulk_resume(workflow="bk_b"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)
    for run_id in made:
        assert await engine.run(run_id).result(timeout=60) == "answered"
    resumes = {r: await _resumes(engine, r) for r in made}
    assert all(n == 1 for r, n in resumes.items() if r != "p-0"), resumes
    assert resumes["p-0"] == 2
    calls = (tmp_path / "calls.log").read_text().split()
    assert all(calls.count(r) == 3 for r in made if r != "p-0")
    # resumed then ended: listed completed only, not paused
    assert await _listed(engine, status="paused") == set()
    assert await _listed(engine, status="completed", workflow="bk_b") == set(made)
    assert await _listed(engine, status="running") == set()


async def test_a_run_that_ends_during_a_listing_is_listed_once(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs()
    workers.module = BULK
    await workers.start()
    run = await engine.start("bk_a", "w-1", _arg(tmp_path, "wait"))
    await _settled(engine, {"w-1": ("bk_a", "waiting", 0.0)})
    pages = engine.runs(since="1h")
    first = await pages.__anext__()  # the active markers' page
    assert "w-1" in [i.run_id for i in first]
    await run.signal("go")
    assert await run.result(timeout=30) == "wait"

    async def listed_completed() -> bool:
        return "w-1" in [i.run_id for i in await engine.list_runs(status="completed")]

    await wait_until(listed_completed, timeout=30, what="w-1 listed as completed")
    rest = [(i.run_id, i.status) async for p in pages for i in p]
    assert "w-1" not in [r for r, _ in rest], "listed twice in one pass"
