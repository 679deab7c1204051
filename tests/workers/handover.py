"""The object type of the failover drill that checks what a failover carries
(``tests/chaos/test_region_drills.py``): state, a completion URL's wait, a token
stream."""

from __future__ import annotations

from typing import Any

import fusee
from fusee.ai import model_call
from tests.workers.effects import record_line


async def add(ctx: Any, n: int) -> int:
    count: int = ctx.state.get("count", 0) + int(await ctx.step("n", lambda: n))
    ctx.state.set("count", count)
    return count


async def ask(ctx: Any, arg: dict[str, Any]) -> Any:
    """Wait for a completion by callback URL; the URL is appended to the file ``posted``."""

    def post(cb: fusee.Completion) -> None:
        record_line(arg["posted"], cb.url)

    answer = await ctx.await_completion("ok", ask=post)
    ctx.state.set("answer", answer)
    return answer


async def speak(ctx: Any, text: str) -> str:
    """A model call: its tokens are the invocation's stream ``reply``."""

    async def chunks(resume: str) -> Any:
        for word in text.split():
            yield word + " "

    reply = str(await model_call(ctx, "reply", chunks))
    ctx.state.set("last", reply)
    return reply


ledger = fusee.object("ledger", {"add": add, "ask": ask, "speak": speak})
