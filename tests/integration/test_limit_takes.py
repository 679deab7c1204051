"""Takes of granted permits, live (an in-process worker, a real nats-server): a limit
actor answering later than the ask's patience still lets runs start (fix/pickup's take
loop asked forever, each re-ask spending a token), and it does not spin while a take it
told to wait is gone. (The review of fix/pickup's repros: each failed on it.)"""

from __future__ import annotations

from typing import cast

import anyio
import anyio.abc
import pytest

import fusee
from fusee.actors.limit_actor import LimitActor
from fusee.runtime import limits as limits_module
from tests.helpers import registry_of

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
    late = limits_module.ASK_PATIENCE + 0.3
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
        return cast(str, await ctx.step("call", call, limit="slow"))

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


async def test_the_limit_actor_does_not_spin_while_a_take_it_told_to_wait_is_gone(
    engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take queued for its token, told WAIT, whose step then never asks again (its
    worker SIGKILLed, its run cancelled mid-take): it stays in LimitState.taking until
    its holder expires (a fresh grant's PICKUP, 10 s). Once a token comes,
    next_look() is `now` (takes(now, asking) skips it, next_look ignores asking) and
    _serve waits max(0, ...) = 0: a hot loop on the worker hosting the limit. A healthy
    actor looks about every TICK (0.25 s). (HOLD set to 0.05 s so the WAIT comes before
    the token; nothing else changed.)"""
    from fusee.actors.core import ActorCore
    from fusee.runtime.limits import Ask, AskOp, LimitState, core_subject, encode_core

    monkeypatch.setattr(limits_module, "HOLD", 0.05)
    looks, began = 0, cast("int | None", None)
    spun = anyio.Event()
    seen: list[object] = []  # (the takes waiting, the tokens, the clock) as it spun
    next_look = LimitState.next_look

    def counted(self: LimitState, now: float) -> float | None:
        nonlocal looks
        looks += 1
        if began is not None and looks - began > 500 and not spun.is_set():
            seen.append((self.taking, round(self.tokens, 2), now))
            spun.set()
        return next_look(self, now)

    monkeypatch.setattr(LimitState, "next_look", counted)
    ask = ActorCore._ask
    asked = anyio.Event()

    async def dies_mid_take(
        self: ActorCore, eid: str, fairness: str, key: str, *, take: str = "", taking: bool = False
    ) -> int | None:
        if taking and self.run_id == "gone":
            body = encode_core(
                AskOp(
                    Ask(
                        key=key,
                        run=self.eid,
                        partition=self.partition,
                        worker=self.worker_id,
                        take=take,
                    )
                )
            )
            await self.store.request_core(core_subject(self.namespace, eid), body, 0.3)
            asked.set()  # asked once, told WAIT; never asks again
            await anyio.sleep_forever()
        return await ask(self, eid, fairness, key, take=take, taking=taking)

    monkeypatch.setattr(ActorCore, "_ask", dies_mid_take)
    await engine.limit("spin", per_second=1, burst=1)

    async def limited(ctx: fusee.Context, _: object) -> str:
        return cast(str, await ctx.step("call", lambda: "ok", limit="spin"))

    async with engine.worker(registry=registry_of(limited, "limited")):
        first = await engine.start("limited", "first", None)
        assert await first.result(timeout=20) == "ok"  # the bucket's token: fast path
        await engine.start("limited", "gone", None)
        with anyio.fail_after(20):
            await asked.wait()
        began, at = looks, anyio.current_time()
        with anyio.move_on_after(3.0):  # a healthy actor: about 12 looks in 3 s
            await spun.wait()
        spent = anyio.current_time() - at
        assert not spun.is_set(), (
            f"the limit actor looked {looks - began} times in {spent:.2f} s (TICK 0.25 s): {seen}"
        )
