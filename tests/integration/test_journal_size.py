"""``ctx.journal_size()`` is the same live and on replay around waits, whether a wait's
end rode on the next record, was flushed alone before a step, or was journaled by an
earlier version (a review of issue 11 found the live and replayed values apart by one).
"""

from __future__ import annotations

import pytest

import fusee
from fusee.actors.worker import WorkerConfig

pytestmark = pytest.mark.timeout(60)
SEEN: list[tuple[int, int, int]] = []


@fusee.workflow("journal_size_waits")
async def waits_then_steps(ctx: fusee.Context) -> list[int]:
    out = []
    for i in range(3):
        await ctx.wait_for("go")
        n = ctx.journal_size()
        live: int = await ctx.step(f"s{i}", lambda n=n: n, type=int)  # as the live run saw it
        SEEN.append((i, live, ctx.journal_size()))
        out.append(live)
    await ctx.wait_for("go")
    return [*out, ctx.journal_size()]  # the last end rides on run.completed


@pytest.mark.parametrize("replay", [False, True], ids=["in memory", "replayed every step"])
async def test_journal_size_is_the_same_live_and_replayed(
    engine: fusee.Engine, replay: bool
) -> None:
    SEEN.clear()
    run_id = f"journal-size-{replay}"
    run = await engine.start(waits_then_steps, run_id)
    for _ in range(4):
        await engine.run(run_id).signal("go")  # all there before the run starts
    async with engine.worker(config=WorkerConfig(always_replay=replay)):
        result = await run.result(timeout=30)
    # run.started, then per turn: wait.started, wait.done, step.completed
    assert result == [3, 6, 9, 12]
    for i, live, after in SEEN:
        assert after == live + 1, (i, SEEN)  # the step's own record, replayed or not


OBJECT_SEEN: list[tuple[int, int, int, int]] = []


async def _sizes(ctx: fusee.ObjectContext) -> list[int]:
    first = ctx.journal_size()  # an invocation begins with no record of its own
    a: int = await ctx.step("s1", lambda: first, type=int)
    second = ctx.journal_size()
    b: int = await ctx.step("s2", lambda: second, type=int)
    OBJECT_SEEN.append((first, a, second, b))
    return [a, b]


sizes = fusee.object("journal_size_object", {"sizes": _sizes})


@pytest.mark.parametrize("replay", [False, True], ids=["in memory", "replayed every step"])
async def test_an_invocations_journal_size_is_the_same_live_and_replayed(
    engine: fusee.Engine, replay: bool
) -> None:
    OBJECT_SEEN.clear()
    key = sizes.key(f"k-{replay}", engine=engine)
    async with engine.worker(config=WorkerConfig(always_replay=replay)):
        # (its first step is preceded by obj.started, which carries the invocation)
        assert await key.call("sizes", timeout=30) == [0, 2]
    for first, a, second, b in OBJECT_SEEN:  # each pass of the handler, live or replayed
        assert (first, second) == (a, b), OBJECT_SEEN
