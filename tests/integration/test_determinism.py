"""Changing a workflow's code under a run in flight pauses the run, with a reason that
names both calls and where the new code made its call."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

import fusee
from fusee.actors.registry import Registry, Workflow
from fusee.actors.worker import WorkerConfig
from fusee.runtime.records import RunCompleted, RunPaused, StepCompleted, WaitStarted
from tests.workers.procs import wait_until

executed: list[str] = []
gates: list[anyio.Event] = []


def _config() -> WorkerConfig:
    # A short drain: the parked step is cancelled soon after the worker stops.
    return WorkerConfig(
        drain_timeout=0.3,
        always_replay=os.environ.get("FUSEE_ALWAYS_REPLAY", "") not in ("", "0"),
    )


def _step(name: str) -> Any:
    async def fn() -> str:
        executed.append(name)
        if name == "wait":
            await gates[0].wait()
        return name.upper()

    return fn


async def old_code(ctx: fusee.Context, arg: str) -> str:
    a = await ctx.step("fetch", _step("fetch"))
    b = await ctx.step("summarize", _step("summarize"))
    c = await ctx.step("wait", _step("wait"))
    return f"{a}{b}{c}{arg}"


async def new_code(ctx: fusee.Context, arg: str) -> str:
    a = await ctx.step("fetch", _step("fetch"))
    b = await ctx.step("summarise", _step("summarise"))  # renamed: the journal says "summarize"
    c = await ctx.step("wait", _step("wait"))
    return f"{a}{b}{c}{arg}"


def _registry(fn: Any) -> Registry:
    registry = Registry()
    registry.add(Workflow("det_agent", fn, str, True))
    return registry


def _line_of(text: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


async def test_renamed_step_pauses_the_run(nats_server: Any, namespace: str) -> None:
    gates.append(anyio.Event())
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=2)
    try:
        run = await engine.start("det_agent", "r-det", "!")

        async with engine.worker(registry=_registry(old_code), config=_config()):

            async def parked_in_step_3() -> bool:
                return (await run.describe()).steps == 2 and "wait" in executed

            await wait_until(parked_in_step_3, timeout=10, what="the run to park in step 3")
        assert executed == ["fetch", "summarize", "wait"]

        async with engine.worker(registry=_registry(new_code), config=_config()):

            async def paused() -> bool:
                return (await run.describe()).status == "paused"

            await wait_until(paused, timeout=10, what="the run to pause")

        info = await run.describe()
        assert info.status == "paused"
        reason = info.reason or ""
        assert "'summarize'" in reason
        assert "'summarise'" in reason
        line = _line_of('ctx.step("summarise"')
        assert f"{__file__}:{line}" in reason
        # the new code replayed step 1 and ran nothing
        assert executed == ["fetch", "summarize", "wait"]
        journal = [r for _, r in await run.journal()]
        assert [r.name for r in journal if isinstance(r, StepCompleted)] == ["fetch", "summarize"]
        assert isinstance(journal[-1], RunPaused)
        assert journal[-1].reason == reason
        with anyio.fail_after(5):
            try:
                await run.result(timeout=0.3)
            except fusee.Timeout:
                pass  # a paused run has no result yet
    finally:
        gates[0].set()
        await engine.close()


async def waits_after_fetch(ctx: fusee.Context, arg: str) -> str:
    a = await ctx.step("fetch", _step("fetch"))
    approval = await ctx.wait_for("approval")
    return f"{a}{approval}{arg}"


async def returns_after_fetch(ctx: fusee.Context, arg: str) -> str:
    a = await ctx.step("fetch", _step("fetch"))
    return f"{a}{arg}"  # the wait is gone: the journal still holds its wait.started


async def test_a_removed_wait_pauses_the_run(nats_server: Any, namespace: str) -> None:
    """A journal that waits where the new code returns is a determinism error too, not
    a run that completes silently past its journaled wait."""
    executed.clear()
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=2)
    try:
        run = await engine.start("det_agent", "r-det-wait", "!")
        async with engine.worker(registry=_registry(waits_after_fetch), config=_config()):

            async def waiting() -> bool:
                journal = [r for _, r in await run.journal()]
                return any(isinstance(r, WaitStarted) for r in journal)

            await wait_until(waiting, timeout=10, what="the run to wait for its signal")

        async with engine.worker(registry=_registry(returns_after_fetch), config=_config()):
            await run.signal("approval", "yes")  # brings the run back, on the new code

            async def paused() -> bool:
                return (await run.describe()).status == "paused"

            await wait_until(paused, timeout=10, what="the run to pause")

        reason = (await run.describe()).reason or ""
        assert "call 2 (signal 'approval')" in reason
        assert "returns after 1 call(s)" in reason
        assert "returns_after_fetch" in reason
        journal = [r for _, r in await run.journal()]
        assert not any(isinstance(r, RunCompleted) for r in journal)
        assert isinstance(journal[-1], RunPaused)
        assert executed == ["fetch"]
    finally:
        await engine.close()
