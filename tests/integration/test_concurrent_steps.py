"""ctx.step calls running concurrently outside ctx.all: ``asyncio.gather`` and an anyio
task group over steps, as frameworks start their parallel tool calls.

A defect found by the Pydantic AI adapter: commits were not serialized outside
ctx.all, so two steps ending together fenced the run and the second ran again. Each
step here must run once, live and replayed (the forced-replay mode evicts once the
last of the concurrent steps ends), and a killed worker's successor re-runs only the
step that was cut. Completion order is skewed by events the test controls: step ``i``
returns only once step ``i + 1``'s function returned, so the last one ends first.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from fusee.actors.worker import WorkerConfig
from fusee.runtime.records import RunPaused, StepCompleted
from tests.helpers import registry_of
from tests.workers.procs import assert_chained, execution_lines, wait_until

CONCURRENT = Path(__file__).resolve().parent.parent / "workers" / "gathered.py"

pytestmark = pytest.mark.timeout(60)


def _skewed(n: int, calls: list[str]) -> list[Any]:
    """``n`` step functions; the last returns first, each other one after the next."""
    returned = [anyio.Event() for _ in range(n)]

    def fn(i: int) -> Any:
        async def call() -> str:
            calls.append(f"s{i}")
            if i + 1 < n:
                with anyio.fail_after(10):
                    await returned[i + 1].wait()
            returned[i].set()
            return f"S{i}"

        return call

    return [fn(i) for i in range(n)]


@pytest.mark.parametrize("always_replay", [False, True], ids=["live", "replayed"])
@pytest.mark.parametrize("how", ["gather", "task_group"])
@pytest.mark.parametrize("n", [2, 4])
async def test_concurrent_steps_each_run_once(
    engine: fusee.Engine, n: int, how: str, always_replay: bool
) -> None:
    calls: list[str] = []
    fns = _skewed(n, calls)

    async def gathered(ctx: fusee.Context, _arg: Any) -> list[Any]:
        first = await ctx.step("before", lambda: "B")
        if how == "gather":
            results = list(await asyncio.gather(*(ctx.step(f"s{i}", f) for i, f in enumerate(fns))))
        else:
            results = [None] * n

            async def one(i: int) -> None:
                results[i] = await ctx.step(f"s{i}", fns[i])

            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
        last = await ctx.step("after", lambda: "+".join(results))
        return [first, *results, last]

    config = WorkerConfig(always_replay=always_replay)
    async with engine.worker(registry=registry_of(gathered, "gathered"), config=config):
        run = await engine.start("gathered", "r-gather", None)
        expected = ["B", *(f"S{i}" for i in range(n)), "+".join(f"S{i}" for i in range(n))]
        assert await run.result(timeout=30) == expected
    assert sorted(calls) == sorted(f"s{i}" for i in range(n))  # each ran once
    journal = await run.journal()
    assert_chained(journal)
    done = [r for _, r in journal if isinstance(r, StepCompleted)]
    # positions in call order; the journal in completion order (the last ended first)
    assert {r.pos: r.name for r in done} == {
        1: "before",
        **{i + 2: f"s{i}" for i in range(n)},
        n + 2: "after",
    }
    assert [r.name for r in done[1:-1]] == [f"s{i}" for i in reversed(range(n))]
    assert not [r for _, r in journal if isinstance(r, RunPaused)]
    assert (await run.describe()).status == "completed"


async def test_steps_ending_together_do_not_fence_each_other(engine: fusee.Engine) -> None:
    # Both functions return at the same moment: their commits go out together.
    calls: list[str] = []
    both = anyio.Event()
    began: set[str] = set()

    def fn(name: str) -> Any:
        async def call() -> str:
            calls.append(name)
            began.add(name)
            if len(began) == 2:
                both.set()
            with anyio.fail_after(10):
                await both.wait()
            return name

        return call

    async def pair(ctx: fusee.Context, _arg: Any) -> list[Any]:
        return list(await asyncio.gather(ctx.step("a", fn("a")), ctx.step("b", fn("b"))))

    async with engine.worker(registry=registry_of(pair, "pair")):
        for i in range(5):
            run = await engine.start("pair", f"r-pair-{i}", None)
            assert await run.result(timeout=20) == ["a", "b"]
            both, began = anyio.Event(), set()
    assert sorted(calls) == sorted(["a", "b"] * 5)  # no step ran twice


async def test_a_task_running_ahead_on_replay_is_a_determinism_error(
    engine: fusee.Engine,
) -> None:
    # Two tasks of two steps each. Live: a1, b1, then a2 (a1 ended first), then b2.
    # On replay a1 returns at once, so task a reaches a2 before task b reaches b1:
    # a2 would take b1's position. That is caught (the run pauses with the reason),
    # never answered with b1's result, and no step runs twice.
    calls: list[str] = []
    a2_began = anyio.Event()

    async def a2() -> str:
        calls.append("a2")
        a2_began.set()
        return "A2"

    async def b1() -> str:
        calls.append("b1")
        with anyio.fail_after(10):
            await a2_began.wait()
        return "B1"

    async def two(ctx: fusee.Context, _arg: Any) -> list[Any]:
        async def task_a() -> list[Any]:
            return [await ctx.step("x", lambda: "A1"), await ctx.step("x", a2)]

        async def task_b() -> list[Any]:
            return [await ctx.step("x", b1), await ctx.step("x", lambda: "B2")]

        return list(await asyncio.gather(task_a(), task_b()))

    config = WorkerConfig(always_replay=True)
    async with engine.worker(registry=registry_of(two, "two"), config=config):
        run = await engine.start("two", "r-ahead", None)

        async def paused() -> bool:
            return (await run.describe()).status == "paused"

        await wait_until(paused, timeout=20, what="the run to pause")
    reason = (await run.describe()).reason or ""
    assert "position 2" in reason
    assert "concurrent tasks outside ctx.all" in reason
    assert sorted(calls) == ["a2", "b1"]  # nothing ran again


@pytest.mark.parametrize("always_replay", [False, True], ids=["live", "replayed"])
async def test_waits_in_tasks_of_their_own(engine: fusee.Engine, always_replay: bool) -> None:
    # A sleep beside a step, and a signal beside a step: the run stays in memory while
    # the step runs, the signal parks it once the step ended.
    calls: list[str] = []

    def step(name: str) -> Any:
        def call() -> str:
            calls.append(name)
            return name.upper()

        return call

    async def waits(ctx: fusee.Context, _arg: Any) -> list[Any]:
        first = await asyncio.gather(ctx.step("a", step("a")), ctx.sleep("50ms"))
        second = await asyncio.gather(ctx.wait_for("go"), ctx.step("b", step("b")))
        return [*first, *second, await ctx.step("c", step("c"))]

    config = WorkerConfig(always_replay=always_replay)
    async with engine.worker(registry=registry_of(waits, "waits"), config=config) as worker:
        run = await engine.start("waits", "r-waits", None)

        async def parked() -> bool:
            return "r-waits" in worker.parked

        await wait_until(parked, timeout=20, what="the run to park on its signal")
        assert await run.signal("go", "went")
        assert await run.result(timeout=20) == ["A", None, "went", "B", "C"]
    assert calls == ["a", "b", "c"]  # each once


async def test_a_killed_worker_reruns_only_the_step_it_cut(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs(partitions=4)
    workers.module = CONCURRENT
    first = await workers.start()
    log, release = tmp_path / "effects.log", tmp_path / "release"
    run = await engine.start("fanout", "r-kill", {"log": str(log), "until": str(release)})

    # s1..s3 end while s0 waits for `release`: killed then, s0 alone is cut
    for name in ("s1", "s2", "s3"):
        await first.wait_for("step.completed", run_id="r-kill", step=name, timeout=15)
    first.kill()
    release.touch()
    await workers.start()
    assert await run.result(timeout=30) == ["S0", "S1", "S2", "S3", "S0+S1+S2+S3"]
    names = [name for name, _, _ in execution_lines(log)]
    assert sorted(names) == ["after", "s0", "s0", "s1", "s2", "s3"]
    keys = {name: key for name, key, _ in execution_lines(log)}
    assert len(set(keys.values())) == 5  # each step its own key, s0's the same twice
    journal = await run.journal()
    assert_chained(journal)
    assert not [r for _, r in journal if isinstance(r, RunPaused)]


async def test_the_step_budget_hit_inside_a_task_group_fails_the_run(engine: fusee.Engine) -> None:
    # max_steps=2 and a task group of three steps (a framework's parallel tool calls):
    # the third raises StepBudgetExceeded inside the group, which the run takes as if
    # the code had raised it: the run fails with it (the worker went down before)
    from fusee.actors.registry import Registry, Workflow

    async def wf(ctx: fusee.Context, _arg: Any) -> str:
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(ctx.step, f"s{i}", lambda: "x")
        return "done"

    registry = Registry()
    registry.add(Workflow("budget", wf, Any, True, max_steps=2))
    async with engine.worker(registry=registry):
        run = await engine.start("budget", "r-budget", None)
        with pytest.raises(fusee.RunFailed) as err:
            await run.result(timeout=15)
    assert "StepBudgetExceeded" in f"{err.value.error_type} {err.value}", repr(err.value)


async def test_a_wait_does_not_park_while_a_step_of_another_task_runs_under_a_combinator(
    engine: fusee.Engine,
) -> None:
    # gather(ctx.wait_for("go"), ctx.all([ctx.step("slow", ...)])): a wait outside the
    # ctx.all keeps the run in memory while the branch's step runs (it parked after
    # park_after once, and the step, cancelled as a straggler, ran again on resume).
    # It watches 3 s for a park that must not happen: there is no event to wait on.
    calls: list[str] = []
    release = anyio.Event()
    parked_seen = anyio.Event()

    async def slow() -> str:
        calls.append("slow")
        with anyio.move_on_after(4):  # (bounded: the run must not park within it)
            await release.wait()
        return "S"

    async def wf(ctx: fusee.Context, _arg: Any) -> list[Any]:
        got = await asyncio.gather(ctx.wait_for("go"), ctx.all([ctx.step("slow", slow)]))
        return list(got)

    async with engine.worker(registry=registry_of(wf, "w")) as worker:
        run = await engine.start("w", "r-w", None)

        async def watch() -> None:
            with anyio.move_on_after(3):
                while "r-w" not in worker.parked:
                    await anyio.sleep(0.02)
                parked_seen.set()

        await watch()
        release.set()
        assert not parked_seen.is_set(), "the run parked while step 'slow' was running"
        await run.signal("go", 1)
        assert await run.result(timeout=20) == [1, ["S"]]
    assert calls == ["slow"]
