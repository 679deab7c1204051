"""ctx.all and ctx.race (part of issue 3): concurrent steps, sleeps and waits in one run.

Each branch takes its journal position when it starts (in list order); the branches'
ends are taken in journal order, and a cancelled loser is journaled (``call.cancelled``)
so a replay decides the same way whatever the timings. The suite runs in both modes
(``FUSEE_ALWAYS_REPLAY`` unset and ``=1``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog.testing

import fusee
from fusee.actors.registry import Workflow
from fusee.runtime.records import CallCancelled, StepCompleted, StepFailed, WaitDone
from tests.helpers import registry_of as _registry
from tests.workers.procs import assert_chained, execution_lines, wait_until

COMBINATORS = Path(__file__).resolve().parent.parent / "workers" / "combinators.py"

pytestmark = pytest.mark.timeout(90)


async def _journal(run: Any) -> list[Any]:
    journal = await run.journal()
    assert_chained(journal)
    return [r for _, r in journal]


async def test_all_runs_tool_calls_concurrently(engine: fusee.Engine) -> None:
    # Each tool call returns only once the other one has begun: run one after the
    # other, the first would wait for the second forever (and fail after 10 s).
    began = {"weather": anyio.Event(), "flights": anyio.Event()}
    calls: list[str] = []

    def tool(name: str, other: str, result: str) -> Any:
        async def call() -> str:
            calls.append(name)
            began[name].set()
            with anyio.fail_after(10):
                await began[other].wait()
            return result

        return call

    async def trip(ctx: fusee.Context, _arg: Any) -> list[Any]:
        weather, flights = await ctx.all(
            [
                ctx.step("tool:weather", tool("weather", "flights", "sunny")),
                ctx.step("tool:flights", tool("flights", "weather", "AF123")),
            ]
        )
        after = await ctx.step("plan", lambda: f"{weather}/{flights}")
        return [weather, flights, after]

    async with engine.worker(registry=_registry(trip, "trip")):
        run = await engine.start("trip", "r-all", None)
        assert await run.result(timeout=20) == ["sunny", "AF123", "sunny/AF123"]
    assert sorted(calls) == ["flights", "weather"]  # each ran once, the two at once
    records = await _journal(run)
    done = {r.pos: r.name for r in records if isinstance(r, StepCompleted)}
    assert done == {1: "tool:weather", 2: "tool:flights", 3: "plan"}  # positions in list order
    assert not [r for r in records if isinstance(r, CallCancelled)]


async def test_all_fails_fast_and_cancels_the_rest(engine: fusee.Engine) -> None:
    stopped: list[str] = []
    slow_began = anyio.Event()

    async def slow(s: fusee.StepInfo) -> str:
        slow_began.set()
        try:
            await anyio.sleep(30)
        finally:
            stopped.append(f"signal={s.signal.is_set()}")
        return "never"

    async def boom() -> str:
        with anyio.fail_after(10):
            await slow_began.wait()  # fails while the slow one runs, never before it began
        raise fusee.FatalError("no flights today")

    async def trip(ctx: fusee.Context, _arg: Any) -> str:
        try:
            await ctx.all([ctx.step("tool:slow", slow), ctx.step("tool:flights", boom)])
        except fusee.StepFailedError as exc:
            return f"failed: {exc.step}: {exc.message}"
        return "ok"

    async with engine.worker(registry=_registry(trip, "trip")):
        run = await engine.start("trip", "r-fast", None)
        assert await run.result(timeout=20) == "failed: tool:flights: no flights today"
    assert stopped == ["signal=True"]
    records = await _journal(run)
    cancelled = [r for r in records if isinstance(r, CallCancelled)]
    assert [(r.pos, r.name, r.call) for r in cancelled] == [(1, "tool:slow", "step")]
    assert [r.pos for r in records if isinstance(r, StepFailed)] == [2]


async def test_all_with_return_exceptions_returns_errors_in_place(engine: fusee.Engine) -> None:
    async def trip(ctx: fusee.Context, _arg: Any) -> list[str]:
        def boom() -> str:
            raise fusee.FatalError("down")

        out = await ctx.all(
            [ctx.step("a", lambda: "A"), ctx.step("b", boom), ctx.sleep("200ms")],
            return_exceptions=True,
        )
        return [type(x).__name__ if isinstance(x, BaseException) else repr(x) for x in out]

    async with engine.worker(registry=_registry(trip, "trip")):
        run = await engine.start("trip", "r-exc", None)
        assert await run.result(timeout=20) == ["'A'", "StepFailedError", "None"]


async def test_race_the_slower_model_sees_its_signal_and_stops(engine: fusee.Engine) -> None:
    seen: list[str] = []
    large_began = anyio.Event()

    async def fast() -> str:
        with anyio.fail_after(10):
            await large_began.wait()  # answers while the large one runs
        return "fast answer"

    async def large(s: fusee.StepInfo) -> str:
        large_began.set()
        with anyio.move_on_after(20):  # only its signal stops it before then
            while not s.signal.is_set():
                await anyio.sleep(0.01)
            seen.append("stopped by signal")
            return "stopped"
        seen.append("large answer")
        return "large answer"

    async def ask(ctx: fusee.Context, _arg: Any) -> str:
        return str(await ctx.race([ctx.step("model:fast", fast), ctx.step("model:large", large)]))

    async with engine.worker(registry=_registry(ask, "ask")):
        run = await engine.start("ask", "r-race", None)
        assert await run.result(timeout=20) == "fast answer"
    assert "large answer" not in seen
    records = await _journal(run)
    assert [(r.pos, r.name) for r in records if isinstance(r, StepCompleted)] == [(1, "model:fast")]
    cancelled = [r for r in records if isinstance(r, CallCancelled)]
    assert [(r.pos, r.name) for r in cancelled] == [(2, "model:large")]
    assert "lost ctx.race" in cancelled[0].reason


async def test_a_replayed_race_returns_the_same_winner_whatever_the_timings(
    engine: fusee.Engine,
) -> None:
    # The first time "a" answers while "b" runs (b answers only when cancelled); every
    # later execution of "a" would never answer, and "b" at once: a replay that ran the
    # race again would pick "b".
    calls: list[str] = []
    b_began = anyio.Event()

    async def a() -> str:
        calls.append("a")
        if calls.count("a") > 1:
            await anyio.sleep_forever()
        with anyio.fail_after(10):
            await b_began.wait()
        return "A"

    async def b() -> str:
        calls.append("b")
        b_began.set()
        if calls.count("b") == 1:
            await anyio.sleep_forever()  # the loser: cancelled
        return "B"

    async def racer(ctx: fusee.Context, _arg: Any) -> list[Any]:
        first = await ctx.race([ctx.step("a", a), ctx.step("b", b)])
        after = await ctx.step("after", lambda: "x")
        await ctx.sleep("100ms")  # the run is replayed from its journal after this
        return [first, after]

    async with engine.worker(registry=_registry(racer, "racer")):
        run = await engine.start("racer", "r-replay", None)
        assert await run.result(timeout=20) == ["A", "x"]
    assert calls.count("a") == 1
    assert calls.count("b") == 1


async def test_race_a_step_against_a_sleep_is_a_timeout(engine: fusee.Engine) -> None:
    async def slow(s: fusee.StepInfo) -> str:
        await anyio.sleep_forever()
        return "late"

    async def quick() -> str:
        return "quick"

    async def timed(ctx: fusee.Context, _arg: Any) -> list[Any]:
        out = []
        # the slow step never ends before its 500ms limit (nor within the test); the
        # quick one has so much time that only a broken race would let its limit win
        for name, fn, limit in (("slow", slow, "500ms"), ("quick", quick, "60s")):
            out.append(await ctx.race([ctx.step(name, fn), ctx.sleep(limit, name="limit")]))
        return out

    async with engine.worker(registry=_registry(timed, "timed")):
        run = await engine.start("timed", "r-timeout", None)
        assert await run.result(timeout=20) == [None, "quick"]
    records = await _journal(run)
    cancelled = [(r.pos, r.call, r.name) for r in records if isinstance(r, CallCancelled)]
    assert cancelled == [(1, "step", "slow"), (4, "sleep", "limit")]


async def test_all_over_waits_with_signals(engine: fusee.Engine) -> None:
    async def both(ctx: fusee.Context, _arg: Any) -> list[Any]:
        return await ctx.all(
            [ctx.wait_for("manager"), ctx.wait_for("finance"), ctx.step("prep", lambda: 1)]
        )

    async with engine.worker(registry=_registry(both, "both")) as worker:
        run = await engine.start("both", "r-waits", None)

        async def parked() -> bool:
            return "r-waits" in worker.parked

        await wait_until(parked, timeout=20, what="the run to park on its two waits")
        assert await run.signal("finance", {"ok": "fin"})

        async def finance_done() -> bool:
            return any(isinstance(r, WaitDone) and r.pos == 2 for r in await _journal(run))

        await wait_until(finance_done, timeout=20, what="the finance wait to end")
        assert await run.signal("manager", {"ok": "mgr"})
        assert await run.result(timeout=20) == [{"ok": "mgr"}, {"ok": "fin"}, 1]
    records = await _journal(run)
    assert [r.pos for r in records if isinstance(r, WaitDone)] == [2, 1]  # in end order


async def test_race_of_a_signal_against_a_running_step_keeps_the_run_in_memory(
    engine: fusee.Engine,
) -> None:
    working = anyio.Event()

    async def work(s: fusee.StepInfo) -> str:
        working.set()
        for _ in range(1000):
            if s.signal.is_set():
                return "interrupted"
            await anyio.sleep(0.01)
        return "finished"

    async def interruptible(ctx: fusee.Context, _arg: Any) -> Any:
        return await ctx.race([ctx.step("work", work), ctx.wait_for("stop")])

    with structlog.testing.capture_logs() as logs:
        async with engine.worker(registry=_registry(interruptible, "interruptible")) as worker:
            run = await engine.start("interruptible", "r-stop", None)
            with anyio.fail_after(20):
                await working.wait()
            # the wait's park time passed while the step ran: it was declined, not taken
            await wait_until(
                lambda: any(e["event"] == "wait.kept" for e in logs),
                timeout=20,
                what="the wait to decline parking",
            )
            assert "r-stop" not in worker.parked
            assert await run.signal("stop", "now")
            assert await run.result(timeout=20) == "now"
    records = await _journal(run)
    assert [(r.pos, r.name) for r in records if isinstance(r, CallCancelled)] == [(1, "work")]


async def test_a_branch_makes_one_call(engine: fusee.Engine) -> None:
    async def two_calls(ctx: fusee.Context) -> str:
        await ctx.step("first", lambda: 1)
        return str(await ctx.step("second", lambda: 2))

    async def sequenced(ctx: fusee.Context, _arg: Any) -> str:
        try:
            await ctx.all([two_calls(ctx), ctx.step("other", lambda: 3)])
        except fusee.FuseeError as exc:
            return str(exc)
        return "ran"

    async with engine.worker(registry=_registry(sequenced, "sequenced")):
        run = await engine.start("sequenced", "r-seq", None)
        assert "run a sequence of calls as a child workflow" in await run.result(timeout=20)
    records = await _journal(run)  # the refused call took no position: replay matches
    calls = {(r.pos, r.name) for r in records if isinstance(r, StepCompleted | CallCancelled)}
    assert calls == {(1, "first"), (2, "other")}


async def test_nested_race_inside_all_replays(engine: fusee.Engine) -> None:
    async def slow() -> str:
        await anyio.sleep_forever()  # the loser, whatever the timings
        return "slow"

    async def nested(ctx: fusee.Context, _arg: Any) -> list[Any]:
        return await ctx.all(
            [
                ctx.race([ctx.step("fast", lambda: "fast"), ctx.step("slow", slow)]),
                ctx.step("side", lambda: "side"),
            ]
        )

    async with engine.worker(registry=_registry(nested, "nested")):
        run = await engine.start("nested", "r-nested", None)
        assert await run.result(timeout=20) == ["fast", "side"]
    records = await _journal(run)
    assert [(r.pos, r.name) for r in records if isinstance(r, CallCancelled)] == [(2, "slow")]


async def test_killed_after_a_race_the_replay_keeps_its_winner(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs(partitions=4)
    workers.module = COMBINATORS
    first = await workers.start()
    log, release = tmp_path / "effects.log", tmp_path / "release"
    run = await engine.start("racer", "r-crash", {"log": str(log), "until": str(release)})

    def in_after() -> bool:  # the step after the race began: it waits for `release`
        return "after" in [name for name, _, _ in execution_lines(log)]

    await wait_until(in_after, timeout=15, what="the step after the race to begin")
    # (its line written before the kill: an info line waits up to two loop turns)
    await first.wait_for("call.cancelled", run_id="r-crash", timeout=10)
    first.kill()  # during the step after the race: it cannot end before `release`
    release.touch()
    await workers.start()
    assert await run.result(timeout=30) == ["fast answer", "after"]
    names = [name for name, _, _ in execution_lines(log)]
    assert names.count("fast") == 1  # neither model ran again
    assert names.count("large") == 1
    assert names.count("after") == 2  # cut by the kill, then again on the new worker
    records = await _journal(run)
    assert [(r.pos, r.name) for r in records if isinstance(r, CallCancelled)] == [
        (2, "model:large")
    ]


async def test_race_of_a_signal_against_a_sleep_parks_and_wakes(engine: fusee.Engine) -> None:
    async def approval(ctx: fusee.Context, _arg: Any) -> list[Any]:
        out = []
        for limit in ("30s", "2s"):
            out.append(await ctx.race([ctx.wait_for("approval"), ctx.sleep(limit, name="limit")]))
        return out

    async with engine.worker(registry=_registry(approval, "approval")) as worker:
        run = await engine.start("approval", "r-parked-race", None)

        async def parked() -> bool:
            return "r-parked-race" in worker.parked

        await wait_until(parked, timeout=20, what="the run to park on its race")
        assert await run.signal("approval", {"ok": True})
        # the second race parks too, and its timer wakes it
        assert await run.result(timeout=30) == [{"ok": True}, None]
    records = await _journal(run)
    cancelled = [(r.pos, r.call, r.name) for r in records if isinstance(r, CallCancelled)]
    assert cancelled == [(2, "sleep", "limit"), (3, "signal", "approval")]


async def test_two_waits_for_the_same_signal_take_one_each(engine: fusee.Engine) -> None:
    async def votes(ctx: fusee.Context, _arg: Any) -> list[Any]:
        return sorted(await ctx.all([ctx.wait_for("vote"), ctx.wait_for("vote")]))

    async with engine.worker(registry=_registry(votes, "votes")) as worker:
        run = await engine.start("votes", "r-votes", None)

        async def parked() -> bool:  # both waits journaled, nothing to take yet
            return "r-votes" in worker.parked

        await wait_until(parked, timeout=20, what="the run to park on its two waits")
        assert await run.signal("vote", 1)
        assert await run.signal("vote", 2)
        assert await run.result(timeout=20) == [1, 2]


async def test_cancelling_the_run_stops_every_branch(engine: fusee.Engine) -> None:
    stopped: list[str] = []
    began: list[str] = []

    def tool(name: str) -> Any:
        async def call(s: fusee.StepInfo) -> str:
            began.append(name)
            try:
                await anyio.sleep(30)
            finally:
                stopped.append(f"{name} signal={s.signal.is_set()}")
            return name

        return call

    async def both(ctx: fusee.Context, _arg: Any) -> list[Any]:
        return await ctx.all([ctx.step("a", tool("a")), ctx.step("b", tool("b"))])

    async with engine.worker(registry=_registry(both, "both")):
        run = await engine.start("both", "r-cancel", None)
        await wait_until(lambda: len(began) == 2, timeout=20, what="both branches to begin")
        await run.cancel("interrupted")
        with pytest.raises(fusee.RunCancelled):
            await run.result(timeout=20)
    assert sorted(stopped) == ["a signal=True", "b signal=True"]
    records = await _journal(run)
    assert not [r for r in records if isinstance(r, CallCancelled)]  # the run ended cancelled


async def test_the_losing_child_of_a_race_is_cancelled(engine: fusee.Engine) -> None:
    async def writer(ctx: fusee.Context, seconds: float) -> str:
        await ctx.sleep(seconds)
        return f"wrote in {seconds}s"

    async def editor(ctx: fusee.Context, _arg: Any) -> Any:
        return await ctx.race(
            [
                ctx.child("writer", f"{ctx.run_id}/fast", 0.2),
                ctx.child("writer", f"{ctx.run_id}/slow", 30.0),
            ]
        )

    registry = _registry(editor, "editor")
    registry.add(Workflow("writer", writer, float, True))
    async with engine.worker(registry=registry):
        run = await engine.start("editor", "r-children", None)
        assert await run.result(timeout=20) == "wrote in 0.2s"
        with pytest.raises(fusee.RunCancelled, match=r"lost ctx\.race to child"):
            await engine.run("r-children/slow").result(timeout=20)
    records = await _journal(run)
    assert [(r.call, r.name) for r in records if isinstance(r, CallCancelled)] == [
        ("child", "r-children/slow")
    ]
