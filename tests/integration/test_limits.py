"""Rate and concurrency limits (issue 12): a step with ``limit=`` takes a permit of a
limit actor before each attempt; real nats-server, in-process workers."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

import fusee
from tests.helpers import registry_of as _registry
from tests.workers.procs import wait_until

pytestmark = pytest.mark.timeout(120)


async def test_concurrency_is_never_exceeded_and_the_rate_holds(
    engine: fusee.Engine, tmp_path: Path
) -> None:
    await engine.limit("api", per_second=40, burst=5, concurrent=3)
    starts: list[float] = []
    peak = 0

    def call() -> None:
        nonlocal peak
        # an O_EXCL detector: each attempt in flight holds one slot file
        slot = None
        for i in range(3):
            try:
                fd = os.open(tmp_path / f"slot-{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            os.close(fd)
            slot = tmp_path / f"slot-{i}"
            break
        assert slot is not None, "a fourth attempt in flight"
        starts.append(time.time())
        time.sleep(0.02)
        slot.unlink()

    async def limited(ctx: fusee.Context, tenant: str) -> str:
        await ctx.step("call", call, limit="api", fairness_key=tenant)
        return "ok"

    async with engine.worker(registry=_registry(limited, "limited")):
        runs = [await engine.start("limited", f"r-{i}", f"t{i % 3}") for i in range(60)]
        for run in runs:
            assert await run.result(timeout=60) == "ok"
    assert len(starts) == 60
    starts.sort()
    # over any 1 s window at most burst + per_second
    for i, t in enumerate(starts):
        n = sum(1 for u in starts[i:] if u - t <= 1.0)
        assert n <= 5 + 40 + 1, n
    infos = {i.name: i for i in await engine.limits()}
    assert infos["api"].concurrent == 3 and infos["api"].holders == 0


async def test_an_unknown_limit_fails_the_step_at_its_first_attempt(engine: fusee.Engine) -> None:
    async def bad(ctx: fusee.Context, _: Any) -> str:
        try:
            await ctx.step("call", lambda: 1, limit="nope")
        except fusee.StepFailedError as exc:
            return f"{exc.error_type}: {exc.attempts}"
        return "ran"

    async with engine.worker(registry=_registry(bad, "bad")):
        run = await engine.start("bad", "r-bad", None)
        assert await run.result(timeout=30) == "fusee.UnknownLimit: 1"


async def test_bad_limits_are_refused_and_nothing_is_stored(engine: fusee.Engine) -> None:
    with pytest.raises(fusee.InvalidArgument):
        await engine.limit("x", per_second=-1)
    with pytest.raises(fusee.InvalidArgument):
        await engine.limit("x", concurrent=0)
    with pytest.raises(fusee.InvalidArgument):
        await engine.limit("x")
    with pytest.raises(fusee.InvalidId):
        await engine.limit("", per_second=1)
    assert await engine.limits() == []


LIMITS = Path(__file__).resolve().parent.parent / "workers" / "limits.py"


async def test_the_permits_of_a_killed_worker_come_back(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    await engine.limit("k", concurrent=2)
    workers = worker_procs()
    workers.module = LIMITS
    procs = [await workers.start() for _ in range(3)]
    runs = [await engine.start("limited", f"k-{i}", {"dir": str(tmp_path)}) for i in range(8)]
    # the kill window opens when both permits are held (each holder says so)
    held = await wait_until(
        lambda: list(tmp_path.glob("held-*")) if len(list(tmp_path.glob("held-*"))) >= 2 else None,
        timeout=30,
        what="two holders",
    )
    assert len(held) == 2  # nobody else got in: the limit is full
    pids = {int(p.read_text()) for p in held}
    for w in procs:
        if w.pid in pids:
            w.kill()
    (tmp_path / "release").touch()
    for run in runs:
        assert await run.result(timeout=60) == "ok"
    counts = [int(x) for x in (tmp_path / "counts").read_text().split()]
    assert max(counts) <= 2, counts
    infos = {i.name: i for i in await engine.limits()}
    assert infos["k"].waiters == {}
