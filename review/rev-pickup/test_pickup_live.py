"""Review repro for fix/pickup (needs nats-server; in-process worker): FAILS on fix/pickup.

Run: cd /work/wt-rev-pickup && PYTHONPATH=$PWD/src:$PWD /work/main/.venv/bin/python \
  -m pytest -q -p no:xdist review/rev-pickup/test_pickup_live.py
"""

from __future__ import annotations

import anyio
import anyio.abc
import pytest
from tests.helpers import registry_of

import fusee
from fusee.actors import core as core_module
from fusee.actors.limit_actor import LimitActor

pytestmark = pytest.mark.timeout(60)


async def test_a_limit_actor_answering_later_than_the_asks_patience_still_lets_runs_start(
    engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loaded limit actor whose answers reach the step after ASK_PATIENCE (1 s; the
    design notes it happens at load 8): on main the late fast answer falls back to the
    durable request and the run proceeds on its inbox grant. On fix/pickup the grant
    says take=True and acquire_permit's take loop (core.py _ask, taking=True) re-asks
    on every timeout, forever; each re-ask of the (journaled, taken) holder spends
    another token (LimitState.ask has no holder.taken check). No attempt ever starts,
    the bucket drains at the full rate: a run stuck silently."""
    late = core_module.ASK_PATIENCE + 0.3
    answer = LimitActor._answer

    async def slow_answer(self: LimitActor, grant, reply):  # type: ignore[no-untyped-def]
        async def later() -> None:
            await anyio.sleep(late)  # the answer arrives after the step gave up
            await answer(self, grant, reply)

        group[0].start_soon(later)

    group: list[anyio.abc.TaskGroup] = []
    monkeypatch.setattr(LimitActor, "_answer", slow_answer)
    await engine.limit("slow", per_second=5, burst=1)
    calls = 0

    def call() -> str:
        nonlocal calls
        calls += 1
        return "ok"

    async def limited(ctx: fusee.Context, _: object) -> str:
        return await ctx.step("call", call, limit="slow")

    async with (
        anyio.create_task_group() as tasks,
        engine.worker(registry=registry_of(limited, "limited")),
    ):
        group.append(tasks)
        run_ = await engine.start("limited", "slow-1", None)
        try:
            result = await run_.result(timeout=20)
        finally:
            tasks.cancel_scope.cancel()
    assert result == "ok"
    assert calls == 1
