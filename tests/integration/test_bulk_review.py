"""Reviewer's checks (issue 12): two bulk resumes at once; a run paused twice; a run
resumed then ended; a run that ends while a listing is under way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

import fusee
from tests.integration.test_bulk import _listed, _resumes, start_settled
from tests.workers.procs import wait_until


async def _paused_again(engine: fusee.Engine, run_id: str) -> bool:
    """Its resume journaled (one ``run.resumed``), and then paused again."""
    return (
        await _resumes(engine, run_id) == 1
        and (await engine.run(run_id).describe()).status == "paused"
    )


async def test_two_bulk_resumes_at_once_resume_each_run_once(
    engine: fusee.Engine, bulk_workers: Any, tmp_path: Path
) -> None:
    made = await start_settled(engine, tmp_path, "bk_b", "pause", [f"p-{i}" for i in range(40)])
    # a run paused twice: resumed while the provider is still down, it pauses again
    await engine.run("p-0").resume()
    await wait_until(
        lambda: _paused_again(engine, "p-0"), timeout=30, what="p-0 resumed and paused again"
    )
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
    engine: fusee.Engine, bulk_workers: Any, tmp_path: Path
) -> None:
    await start_settled(engine, tmp_path, "bk_a", "wait", ["w-1"])
    run = engine.run("w-1")
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
