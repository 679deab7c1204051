"""Review repro (fix/lim): the listing's fallback (no live limit actor: the last
snapshot plus the requests its inbox got after ``seen``) counts a request as a new
waiter unless its attempt is *held*; an attempt already *queued* in the snapshot that
asked again (a parked waiter's REASK timer, or its run replayed) is counted twice,
though the limit (LimitState.request: "a queued request keeps its place") has one."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import fusee
from fusee.actors.registry import Registry, Workflow
from fusee.runtime.ids import escape, partition_of
from fusee.runtime.inbox import PermitRequest, decode_message, encode_message
from fusee.runtime.limits import limit_actor_id
from tests.workers.procs import wait_until

pytestmark = pytest.mark.timeout(120)


async def test_the_fallback_listing_counts_a_queued_attempt_that_asked_again_once(
    engine: fusee.Engine,
) -> None:
    await engine.limit("fb", concurrent=1)
    actor = limit_actor_id("fb")
    eid, p = escape(actor), partition_of(actor, engine.partitions)
    holding, go = anyio.Event(), anyio.Event()

    async def hold() -> None:
        holding.set()
        await go.wait()

    async def holder(ctx: fusee.Context, _: Any) -> str:
        await ctx.step("hold", hold, limit="fb")
        return "held"

    async def waiter(ctx: fusee.Context, _: Any) -> str:
        await ctx.step("call", lambda: None, limit="fb")
        return "ok"

    registry = Registry()
    registry.add(Workflow("holder", holder, Any, True))
    registry.add(Workflow("waiter", waiter, Any, True))

    async def listed(want: dict[str, int]) -> bool:
        (info,) = await engine.limits()
        return info.waiters == want

    async with engine.worker(registry=registry):
        await engine.start("holder", "fb-h", None)
        with anyio.fail_after(30):
            await holding.wait()
        await engine.start("waiter", "fb-w", None)
        await wait_until(lambda: listed({"": 1}), timeout=30, what="one waiter")
    # no live limit actor now: the listing falls back to the journal and the inbox
    reqs = [decode_message(m.data) for m in await engine.store.read_inbox(p, eid)]
    (mine,) = [r for r in reqs if isinstance(r, PermitRequest) and r.run == escape("fb-w")]
    assert await listed({"": 1})
    # the same attempt asks again (what its re-ask timer does while the limit is away)
    await engine.store.send_inbox(p, eid, "permit", encode_message(mine))
    assert await listed({"": 1}), (await engine.limits())[0].waiters
