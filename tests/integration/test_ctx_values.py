"""ctx.now(), ctx.random(), ctx.uuid() (part of issue 3): journaled, identical on replay.

The values ride on the next record the actor commits; a replay (a parked run coming
back, ``FUSEE_ALWAYS_REPLAY=1``, another worker after a crash) hands out the journaled
ones in call order.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

import fusee
from fusee.runtime.records import RunCompleted, StepCompleted, Value, WaitStarted
from tests.helpers import registry_of as _registry
from tests.workers.procs import assert_chained, wait_until

VALUES = Path(__file__).resolve().parent.parent / "workers" / "values.py"

pytestmark = pytest.mark.timeout(90)


async def test_values_are_journaled_and_the_same_after_the_run_parks_and_replays(
    engine: fusee.Engine,
) -> None:
    seen: list[tuple[datetime, float, UUID]] = []

    async def agent(ctx: fusee.Context, _arg: Any) -> list[str]:
        taken = (ctx.now(), ctx.random(), ctx.uuid())
        seen.append(taken)  # once per execution of this code: live, then each replay
        await ctx.step("ask", lambda: "asked")
        await ctx.wait_for("approval")  # parks: the code runs again, by replay
        return [taken[0].isoformat(), repr(taken[1]), str(taken[2]), str(ctx.uuid())]

    before = datetime.now(UTC)
    async with engine.worker(registry=_registry(agent, "agent")) as worker:
        run = await engine.start("agent", "r-values", None)

        async def parked() -> bool:
            return "r-values" in worker.parked and "r-values" not in worker.actors

        await wait_until(parked, timeout=20, what="the run to leave memory")
        assert await run.signal("approval", True)
        result = await run.result(timeout=20)
    assert len(seen) >= 2  # live, and at least the replay after parking
    assert len(set(seen)) == 1, seen
    now, rnd, uid = seen[0]
    assert now.tzinfo is UTC
    assert before - timedelta(seconds=1) <= now <= datetime.now(UTC)
    assert 0.0 <= rnd < 1.0
    assert uid.version == 4
    assert result[:3] == [now.isoformat(), repr(rnd), str(uid)]
    journal = await run.journal()
    assert_chained(journal)
    carried = [(type(r), r.values) for _, r in journal if isinstance(r.values, list)]
    kind, values = carried[0]
    assert kind is StepCompleted
    assert [v.kind for v in values] == ["now", "random", "uuid"]
    assert datetime.fromtimestamp(float(values[0].value), UTC) == now
    assert values[1:] == [Value("random", rnd), Value("uuid", str(uid))]
    # the uuid taken after the wait rides on the run's end record
    assert carried[-1] == (RunCompleted, [Value("uuid", result[3])])
    assert len(carried) == 2


async def test_a_value_taken_right_before_a_wait_rides_on_its_wait_started(
    engine: fusee.Engine,
) -> None:
    async def napper(ctx: fusee.Context, _arg: Any) -> str:
        woke_at = ctx.now() + timedelta(milliseconds=300)
        await ctx.sleep("300ms")
        return woke_at.isoformat()

    async with engine.worker(registry=_registry(napper, "napper")):
        run = await engine.start("napper", "r-nap-values", None)
        woke_at = datetime.fromisoformat(await run.result(timeout=20))
    journal = await run.journal()
    started = next(r for _, r in journal if isinstance(r, WaitStarted))
    assert isinstance(started.values, list)
    assert [v.kind for v in started.values] == ["now"]
    assert woke_at == datetime.fromtimestamp(float(started.values[0].value), UTC) + timedelta(
        milliseconds=300
    )


async def test_changed_code_that_asks_for_another_value_pauses_the_run(
    engine: fusee.Engine,
) -> None:
    async def v1(ctx: fusee.Context, _arg: Any) -> Any:
        ctx.uuid()
        await ctx.step("ask", lambda: None)
        return await ctx.wait_for("go")

    async def v2(ctx: fusee.Context, _arg: Any) -> Any:
        ctx.now()
        await ctx.step("ask", lambda: None)
        return await ctx.wait_for("go")

    async with engine.worker(registry=_registry(v1, "flow")) as worker:
        run = await engine.start("flow", "r-values-det", None)

        async def parked() -> bool:
            return "r-values-det" in worker.parked

        await wait_until(parked, timeout=20, what="parking")
    async with engine.worker(registry=_registry(v2, "flow")):
        await run.signal("go", 1)

        async def paused() -> bool:
            return (await run.describe()).status == "paused"

        await wait_until(paused, timeout=20, what="the run to pause")
    reason = (await run.describe()).reason or ""
    assert "ctx.uuid()" in reason
    assert "ctx.now()" in reason
    assert "test_ctx_values.py" in reason


async def test_killed_while_waiting_the_next_worker_replays_the_same_values(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs(partitions=4)
    workers.module = VALUES
    first = await workers.start()
    log = tmp_path / "code.log"
    run = await engine.start("values", "r-values-crash", {"log": str(log)})
    await first.wait_for("wait.started", run_id="r-values-crash", timeout=15)
    first.kill()
    await workers.start()
    assert await run.signal("go", True)
    result = await run.result(timeout=30)
    lines = log.read_text().splitlines()
    assert len(lines) >= 2  # the first worker, then the replay on the second
    assert len(set(lines)) == 1, lines
    assert lines[0] == f"code {result['now']} {result['random']!r} {result['uuid']}"
    assert result["booked"] == f"booking {result['uuid']}"
    assert UUID(result["after"]) != UUID(result["uuid"])
    assert_chained(await run.journal())
