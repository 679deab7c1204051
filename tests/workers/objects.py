"""Keyed objects for the tests: a counter whose handlers detect overlap, a chat, and
handlers that fail, sleep, wait, stall and hold (until a file the test creates). Effects go to files named in the input, one
O_APPEND line each, so a test can count what ran across worker processes."""

from __future__ import annotations

import os
import time
from typing import Any

import anyio

import fusee
from fusee.ai import model_call
from tests.workers.effects import record_line, wait_for_file

# One marker file per key while an exclusive handler of it runs: a second handler that
# finds it there overlapped the first (the file lives across worker processes).


def _enter(marker: str) -> None:
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise AssertionError(f"two handlers of one key overlapped ({marker})") from None
    os.close(fd)


def _leave(marker: str) -> None:
    try:
        os.unlink(marker)
    except FileNotFoundError:
        pass


async def add(ctx: Any, arg: dict[str, Any]) -> int:
    """Add 1 to ``count``; log ``<client> <n> <count>``. A step between read and write
    (``step_delay`` seconds, or held until the file ``until`` exists) gives a kill or a
    freeze a place to land mid-handler."""
    marker = arg.get("marker")
    if marker:
        # a worker killed mid-handler leaves its marker: the next run of the same
        # invocation (same inbox sequence) takes it over
        owner = f"{marker}.{arg.get('client')}.{arg.get('n')}"
        if os.path.exists(marker) and os.path.exists(owner):
            _leave(marker)
        _enter(marker)
        record_line(owner, "1")
    count: int = ctx.state.get("count", 0)
    if arg.get("step_delay") or arg.get("until"):

        async def work() -> str:
            if arg.get("until"):
                await wait_for_file(arg["until"])
            await anyio.sleep(arg.get("step_delay") or 0)
            return "done"

        await ctx.step("work", work)
    ctx.state.set("count", count + 1)
    seen = ctx.state.get("seen") or []
    seen.append(f"{arg.get('client')}:{arg.get('n')}")
    ctx.state.set("seen", seen)
    if arg.get("log"):
        record_line(arg["log"], f"{arg.get('client')} {arg.get('n')} {count + 1}")
    if marker:
        _leave(marker)
        os.unlink(f"{marker}.{arg.get('client')}.{arg.get('n')}")
    return count + 1


async def fail(ctx: Any, arg: dict[str, Any]) -> None:
    ctx.state.set("count", -1000)
    ctx.state.set("poison", True)
    raise ValueError(arg.get("message", "the handler failed"))


async def stall(ctx: Any, arg: dict[str, Any]) -> str:
    """Hold the key: sleep in a step (cancellable) for ``seconds``."""

    async def hold(s: fusee.StepInfo) -> str:
        if arg.get("log"):
            record_line(arg["log"], f"stall {s.key}")
        await anyio.sleep(arg["seconds"])
        return "held"

    result = await ctx.step("hold", hold)
    ctx.state.set("stalled", True)
    return str(result)


async def hold(ctx: Any, arg: dict[str, Any]) -> str:
    """Hold the key in a step until the file ``until`` exists (the test creates it, or
    cancels the handler); the step's line ``hold <s.key>`` in ``log`` says it began."""

    async def held(s: fusee.StepInfo) -> str:
        if arg.get("log"):
            record_line(arg["log"], f"hold {s.key}")
        await wait_for_file(arg["until"])
        return "held"

    result = await ctx.step("hold", held)
    ctx.state.set("held", True)
    return str(result)


async def nap(ctx: Any, arg: dict[str, Any]) -> int:
    """A durable sleep inside a handler: the key stays held, the object parks."""
    await ctx.sleep(arg["seconds"])
    count: int = ctx.state.get("count", 0) + 1
    ctx.state.set("count", count)
    return count


async def approve(ctx: Any, arg: dict[str, Any]) -> Any:
    """Wait for the signal ``approval`` sent to the key."""
    value = await ctx.wait_for("approval", timeout=arg.get("timeout"))
    ctx.state.set("approved", value)
    return value


async def say(ctx: Any, text: str) -> str:
    history = ctx.state.get("history") or []
    history.append({"role": "user", "content": text})
    reply: str = await ctx.step("reply", lambda: f"echo: {text}")
    history.append({"role": "assistant", "content": reply})
    ctx.state.set("history", history)
    return reply


async def stream_say(ctx: Any, text: str) -> str:
    """A model call in a handler: its tokens are the invocation's stream ``reply``."""

    async def chunks(resume: str) -> Any:
        for word in text.split():
            await anyio.sleep(0.02)
            yield word + " "

    reply = await model_call(ctx, "reply", chunks)
    ctx.state.set("last", reply)
    return str(reply)


@fusee.workflow("double")
async def double(ctx: fusee.Context, n: int) -> int:
    return int(await ctx.step("x2", lambda: n * 2))


async def spawn(ctx: Any, n: int) -> int:
    """A child run from a handler."""
    doubled = int(await ctx.child("double", f"double-{ctx.key}-{n}", n))
    ctx.state.set("doubled", doubled)
    return doubled


def _slow_peek(ctx: Any) -> Any:
    time.sleep(0)  # a sync shared handler that blocks (for no time)
    return ctx.state.get("count", 0)


def peek(ctx: Any) -> dict[str, Any]:
    return {"count": ctx.state.get("count", 0), "keys": ctx.state.keys()}


counters = fusee.object(
    "counter",
    {
        "add": add,
        "fail": fail,
        "stall": fusee.exclusive(stall, timeout="2s"),
        "hold": fusee.exclusive(hold, timeout="60s"),
        "nap": nap,
        "approve": approve,
        "stream_say": stream_say,
        "spawn": spawn,
        "peek": fusee.shared(peek),
        "slow_peek": fusee.shared(_slow_peek),
    },
    timeout="30s",
)

chats = fusee.object(
    "chat",
    {"say": say, "history": fusee.shared(lambda ctx: ctx.state.get("history") or [])},
)
