"""The workflows and the object the golden runs (``tests/golden/runs/``) were recorded from.

DO NOT CHANGE THIS MODULE, like a golden file: ``test_golden_runs.py`` replays each
recorded journal through this code and expects it to reach exactly the recorded
positions. A change here that a released worker could not replay is the kind of change
the test exists to catch; new behaviour gets a new workflow (and a new recording), next
to these. Together they use every call of ``ctx``: steps with a retry and a failure
caught, journaled values, sleeps, signals (one taken, one timed out), a completion,
a child run, ``ctx.all`` and ``ctx.race`` (its loser cancelled), compensations,
continue-as-new, and an object's invocations.

``record_runs.py`` records them on a real nats-server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

import fusee
from fusee.actors.registry import Registry, Workflow, make_handler

__all__ = ("REGISTRY", "RUNS", "OBJECTS", "COUNTER", "asked")

NO_WAIT = fusee.Retry(attempts=2, initial=0, max=0)  # retried at once: no timing in the test

# ask= of the completion calls this (the recorder sets it to learn the token)
asked: list[Callable[[fusee.Completion], None]] = []


async def steps(ctx: fusee.Context, arg: str) -> dict[str, Any]:
    """A step that fails once and is retried, one that fails for good and is caught,
    and ``ctx.now()``, ``ctx.random()``, ``ctx.uuid()`` handed to a step."""

    def flaky(s: fusee.StepInfo) -> str:
        if s.attempt == 1:
            raise ConnectionError("the first attempt fails")
        return f"{arg} on attempt {s.attempt}"

    def broken() -> None:
        raise ValueError("this step always fails")

    first = await ctx.step("flaky", flaky, retry=NO_WAIT)
    try:
        await ctx.step("broken", broken, retry=NO_WAIT)
        caught = ""
    except fusee.StepFailedError as exc:
        caught = f"{exc.error_type} after {exc.attempts} attempts"
    now, rnd, uid = ctx.now(), ctx.random(), ctx.uuid()
    values = await ctx.step("values", lambda: [now.isoformat(), rnd, str(uid)])
    return {"first": first, "caught": caught, "values": values}


async def waits(ctx: fusee.Context, _arg: None) -> dict[str, Any]:
    """A sleep, a signal taken, a signal that times out, a completion."""
    await ctx.sleep(0.05, name="nap")
    go = await ctx.wait_for("go")
    try:
        await ctx.wait_for("never", timeout=0.05)
        late = "came"
    except fusee.Timeout:
        late = "timed out"

    async def ask(cb: fusee.Completion) -> None:
        for tell in asked:
            tell(cb)

    approval = await ctx.await_completion("approval", ask=ask)
    return {"go": go, "never": late, "approval": approval}


async def parent(ctx: fusee.Context, n: int) -> int:
    """A child run, its result used."""
    doubled: int = await ctx.child("golden.child", f"{ctx.run_id}-child", n, type=int)
    return await ctx.step("add", lambda: doubled + 1, type=int)


async def child(ctx: fusee.Context, n: int) -> int:
    return await ctx.step("double", lambda: n * 2, type=int)


async def combinators(ctx: fusee.Context, _arg: None) -> list[Any]:
    """``ctx.all`` of two steps, then ``ctx.race`` whose loser never ends by itself:
    it is cancelled (journaled ``call.cancelled``)."""

    async def forever() -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    both = await ctx.all([ctx.step("left", lambda: "l"), ctx.step("right", lambda: "r")])
    winner = await ctx.race([ctx.step("fast", lambda: "fast"), ctx.step("slow", forever)])
    return [both, winner]


async def compensations(ctx: fusee.Context, _arg: None) -> str:
    """Two undos registered, then a step that fails for good: the run fails after
    running them, newest first."""
    booked = await ctx.step("book", lambda: "booking-1")
    ctx.compensate("cancel-booking", lambda: f"cancelled {booked}")
    ctx.compensate("notify", lambda: "notified")

    def charge() -> str:
        raise fusee.FatalError("the card is declined")

    return str(await ctx.step("charge", charge))


async def continued(ctx: fusee.Context, generation: int) -> str:
    """Three generations: each journals a step, the first two continue as new."""
    seen = await ctx.step("generation", lambda: generation, type=int)
    if seen < 2:
        return ctx.continue_as_new(seen + 1)
    return f"ended in generation {seen}"


async def add(ctx: fusee.ObjectContext, n: int) -> int:
    """An object's exclusive handler: a step, then a state change."""
    count: int = ctx.state.get("count", 0)
    added = await ctx.step("add", lambda: count + n, type=int)
    ctx.state.set("count", added)
    return added


REGISTRY = Registry()
REGISTRY.add(Workflow("golden.steps", steps, str, True))
REGISTRY.add(Workflow("golden.waits", waits, Any, True))
REGISTRY.add(Workflow("golden.parent", parent, int, True))
REGISTRY.add(Workflow("golden.child", child, int, True))
REGISTRY.add(Workflow("golden.combinators", combinators, Any, True))
REGISTRY.add(Workflow("golden.compensations", compensations, Any, True))
REGISTRY.add(Workflow("golden.continued", continued, int, True))
COUNTER = fusee.ObjectType("golden_counter", {"add": make_handler("add", add, shared=False)})
REGISTRY.add_object(COUNTER)

# The recorded journals: the file stem, the run ID and the workflow with its input,
# and, for objects, the file stem, the object type and the key with its calls.
RUNS: dict[str, tuple[str, Any]] = {
    "steps": ("golden.steps", "hello"),
    "waits": ("golden.waits", None),
    "parent": ("golden.parent", 20),
    "parent-child": ("golden.child", 20),  # started by "parent"
    "combinators": ("golden.combinators", None),
    "compensations": ("golden.compensations", None),
    "continued": ("golden.continued", 0),
}
OBJECTS: dict[str, tuple[fusee.ObjectType, str, list[tuple[str, Any]]]] = {
    "counter-k": (COUNTER, "k", [("add", 1), ("add", 2)]),
}
