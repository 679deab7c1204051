"""Child runs (part of issue 3): ctx.child starts a run once, and returns its end.

A parent waits for its child like for a signal (a ``child`` wait, parked), the child
tells the parent how it ended through the parent's inbox, cancelling the parent cancels
its children, and the parent's timeout covers them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

import fusee
from fusee.actors.registry import Registry, Workflow
from fusee.actors.worker import WorkerConfig
from fusee.adapters.cli.render import format_journal
from fusee.runtime.ids import escape, partition_of
from fusee.runtime.records import (
    RunCompleted,
    RunStarted,
    WaitDone,
    WaitStarted,
    encode_record,
    record_hash,
)
from tests.workers.procs import assert_chained, executions, wait_until

CHILDREN = Path(__file__).resolve().parent.parent / "workers" / "children.py"

pytestmark = pytest.mark.timeout(90)


def _registry(**fns: Any) -> Registry:
    registry = Registry()
    for name, fn in fns.items():
        registry.add(Workflow(name, fn, Any, True))
    return registry


async def _tool(ctx: fusee.Context, arg: Any) -> Any:
    """A workflow used as a tool: one step, its result is the tool's."""

    def look_up() -> Any:
        if arg == "boom":
            raise fusee.FatalError("no such city")
        return {"city": arg, "temp": 21}

    return await ctx.step("tool:weather", look_up)


async def test_workers_fan_out_sequentially_and_the_parent_collects(
    engine: fusee.Engine,
) -> None:
    ran: list[str] = []

    async def part(ctx: fusee.Context, arg: Any) -> str:
        def write() -> str:
            ran.append(arg)
            return f"<{arg}>"

        return str(await ctx.step("write", write))

    async def orchestrate(ctx: fusee.Context, arg: Any) -> list[str]:
        parts = await ctx.step("plan", lambda: ["intro", "body", "outro"])
        return [await ctx.child("part", f"{ctx.run_id}/part-{i}", p) for i, p in enumerate(parts)]

    async with engine.worker(registry=_registry(part=part, orchestrate=orchestrate)):
        run = await engine.start("orchestrate", "essay-1", None)
        assert await run.result(timeout=30) == ["<intro>", "<body>", "<outro>"]
        for i, p in enumerate(["intro", "body", "outro"]):
            assert await engine.run(f"essay-1/part-{i}").result(timeout=5) == f"<{p}>"
    assert ran == ["intro", "body", "outro"]  # each child's step ran once, also on replay
    journal = [r for _, r in await run.journal()]
    waits = [r for r in journal if isinstance(r, WaitStarted)]
    assert [(w.wait, w.name) for w in waits] == [
        ("child", "essay-1/part-0"),
        ("child", "essay-1/part-1"),
        ("child", "essay-1/part-2"),
    ]
    assert len([r for r in journal if isinstance(r, WaitDone)]) == 3
    shown = "\n".join(format_journal(await run.journal()))
    assert "child 'essay-1/part-1'  -> \"<body>\"" in shown
    child_journal = [r for _, r in await engine.run("essay-1/part-1").journal()]
    started = child_journal[0]
    assert isinstance(started, RunStarted)
    assert started.parent == "essay-1"
    assert (await run.describe()).status == "completed"


async def test_a_replay_attaches_to_the_child_instead_of_starting_another(
    engine: fusee.Engine,
) -> None:
    ran: list[str] = []

    async def part(ctx: fusee.Context, arg: Any) -> str:
        def write() -> str:
            ran.append(f"write:{arg}")
            return f"<{arg}>"

        first = await ctx.step("write", write)
        await ctx.step("polish", lambda: ran.append(f"polish:{arg}"))
        return str(first)

    async def orchestrate(ctx: fusee.Context, arg: Any) -> list[str]:
        out = []
        for i in range(2):
            out.append(await ctx.child("part", f"{ctx.run_id}/part-{i}", i))
            await ctx.step(f"after-{i}", lambda i=i: ran.append(f"after:{i}"))
        return out

    # every actor is evicted after each step and replayed: the parent replays its child
    # calls many times, and each replay finds the child started
    config = WorkerConfig(always_replay=True)
    async with engine.worker(registry=_registry(part=part, orchestrate=orchestrate), config=config):
        run = await engine.start("orchestrate", "replayed", None)
        assert await run.result(timeout=30) == ["<0>", "<1>"]
    assert sorted(ran) == sorted(
        ["write:0", "polish:0", "after:0", "write:1", "polish:1", "after:1"]
    )
    for i in range(2):
        kinds = [type(r) for _, r in await engine.run(f"replayed/part-{i}").journal()]
        assert kinds.count(RunStarted) == 1
    journal = [r for _, r in await run.journal()]
    assert [r.name for r in journal if isinstance(r, WaitStarted)] == [
        "replayed/part-0",
        "replayed/part-1",
    ]


async def test_a_workflow_as_a_tool_and_its_failure_raised_in_the_parent(
    engine: fusee.Engine,
) -> None:
    async def agent(ctx: fusee.Context, arg: Any) -> Any:
        ok = await ctx.child("weather", f"{ctx.run_id}/weather-1", "Lisbon")
        try:
            await ctx.child("weather", f"{ctx.run_id}/weather-2", "boom")
        except fusee.RunFailed as exc:
            return {"ok": ok, "error": [exc.run_id, exc.error_type, exc.message]}
        return {"ok": ok}

    async with engine.worker(registry=_registry(weather=_tool, agent=agent)):
        run = await engine.start("agent", "agent-1", None)
        assert await run.result(timeout=30) == {
            "ok": {"city": "Lisbon", "temp": 21},
            "error": ["agent-1/weather-2", "fusee.FatalError", "no such city"],
        }
        with pytest.raises(fusee.RunFailed):
            await engine.run("agent-1/weather-2").result(timeout=5)
    shown = "\n".join(format_journal(await run.journal()))
    assert "child 'agent-1/weather-2'  failed: fusee.FatalError: no such city" in shown


async def test_an_uncaught_child_failure_fails_the_parent(engine: fusee.Engine) -> None:
    async def agent(ctx: fusee.Context, arg: Any) -> Any:
        return await ctx.child("weather", f"{ctx.run_id}/w", "boom")

    async with engine.worker(registry=_registry(weather=_tool, agent=agent)):
        run = await engine.start("agent", "agent-2", None)
        with pytest.raises(fusee.RunFailed) as caught:
            await run.result(timeout=30)
    assert caught.value.error_type == "fusee.RunFailed"
    assert "no such city" in caught.value.message


async def test_a_child_id_taken_by_another_run_is_run_exists(engine: fusee.Engine) -> None:
    async def waiter(ctx: fusee.Context, arg: Any) -> Any:
        return await ctx.wait_for("go")

    async def agent(ctx: fusee.Context, arg: Any) -> Any:
        out = []
        for workflow, arg_ in (("waiter", None), ("waiter", "other input"), ("weather", None)):
            try:
                await ctx.child(workflow, "taken", arg_)
            except fusee.RunExists as exc:
                out.append(str(exc))
        return out

    taken = await engine.start("waiter", "taken", None)  # the same workflow and input
    async with engine.worker(registry=_registry(weather=_tool, waiter=waiter, agent=agent)):
        run = await engine.start("agent", "agent-3", None)
        assert await run.result(timeout=30) == [
            "run 'taken' exists, but as a top-level run, not as a child of 'agent-3'",
            "run 'taken' exists with another input",
            "run 'taken' exists with workflow 'waiter', not 'weather'",
        ]

        # the parent ended with those waits open: a run that is not its child is left alone
        # (its index says completed once its children were dealt with)
        async def indexed() -> bool:
            return (await run.describe()).status == "completed"

        await wait_until(indexed, timeout=10, what="the parent's index")
        assert await taken.signal("go", "still mine")
        assert await taken.result(timeout=20) == "still mine"


async def test_an_ended_child_activated_again_tells_its_parent_again(
    engine: fusee.Engine,
) -> None:
    """The child's worker died between its end record and its notice to the parent: its
    active marker is still there, and its next activation sends the notice."""
    store = engine.store
    child_id, eid = "p-resend/c", escape("p-resend/c")
    partition = partition_of(child_id, engine.partitions)
    started = RunStarted(
        workflow="weather",
        input=msgspec.Raw(b'"Oslo"'),
        started_at=time.time(),
        partition=partition,
        parent="p-resend",
    )
    first = encode_record(started)
    seq = await store.append(eid, "run.started", first, fence=0, msg_id=f"{eid}:s")
    end = RunCompleted(result=msgspec.Raw(b'"sunny"'), prev=seq, prev_hash=record_hash(first))
    await store.append(eid, "run.completed", encode_record(end), fence=seq, msg_id=f"{eid}:e")
    await store.mark_active(partition, eid)  # left behind by the dead worker

    async def parent(ctx: fusee.Context, arg: Any) -> Any:
        return await ctx.child("weather", f"{ctx.run_id}/c", "Oslo")

    async with engine.worker(registry=_registry(weather=_tool, parent=parent)):
        run = await engine.start("parent", "p-resend", None)
        assert await run.result(timeout=30) == "sunny"


async def test_a_child_that_continues_as_new_reports_its_last_generation(
    engine: fusee.Engine,
) -> None:
    async def counter(ctx: fusee.Context, arg: Any) -> Any:
        n = await ctx.step("count", lambda: arg + 1)
        if n < 3:
            return ctx.continue_as_new(n)
        return n

    async def parent(ctx: fusee.Context, arg: Any) -> Any:
        return await ctx.child("counter", f"{ctx.run_id}/c", 0)

    async with engine.worker(registry=_registry(counter=counter, parent=parent)):
        run = await engine.start("parent", "p-continue", None)
        assert await run.result(timeout=30) == 3


async def test_cancelling_the_parent_cancels_its_children(engine: fusee.Engine) -> None:
    async def slow(ctx: fusee.Context, arg: Any) -> Any:
        await ctx.wait_for("never")

    async def parent(ctx: fusee.Context, arg: Any) -> Any:
        return await ctx.child("slow", f"{ctx.run_id}/c", None)

    async with engine.worker(registry=_registry(slow=slow, parent=parent)):
        run = await engine.start("parent", "p-cancel", None)
        child = engine.run("p-cancel/c")

        async def child_waits() -> bool:
            try:
                return any(
                    isinstance(r, WaitStarted) and r.wait == "signal"
                    for _, r in await child.journal()
                )
            except fusee.RunNotFound:
                return False

        await wait_until(child_waits, timeout=20, what="the child to wait")
        assert await run.cancel("user interrupted")
        with pytest.raises(fusee.RunCancelled, match="user interrupted"):
            await run.result(timeout=20)
        with pytest.raises(fusee.RunCancelled, match="parent 'p-cancel' cancelled"):
            await child.result(timeout=20)


async def test_the_parents_timeout_covers_its_children(engine: fusee.Engine) -> None:
    async def slow(ctx: fusee.Context, arg: Any) -> Any:
        await ctx.sleep("1h")

    async def parent(ctx: fusee.Context, arg: Any) -> Any:
        return await ctx.child("slow", f"{ctx.run_id}/c", None)

    async with engine.worker(registry=_registry(slow=slow, parent=parent)):
        run = await engine.start("parent", "p-timeout", None, timeout="1500ms")
        with pytest.raises(fusee.RunCancelled, match="timeout"):
            await run.result(timeout=20)
        with pytest.raises(fusee.RunCancelled):
            await engine.run("p-timeout/c").result(timeout=20)
    started = (await engine.run("p-timeout/c").journal())[0][1]
    assert isinstance(started, RunStarted)
    assert started.timeout is not None
    assert started.timeout <= 1.5


async def test_killed_while_waiting_for_a_child(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs(partitions=4)
    workers.module = CHILDREN
    first = await workers.start()
    log = tmp_path / "effects.log"
    arg = {"log": str(log), "parts": ["a", "b"], "sleep": 1.0}
    run = await engine.start("orchestrator", "o-kill", arg)
    # the parent waits for its first child, which sleeps
    await first.wait_for("wait.started", run_id="o-kill/part-0", timeout=15)
    first.kill()
    await workers.start()
    assert await run.result(timeout=40) == ["<a>", "<b>"]
    counts = executions(log)
    assert sorted(counts.values()) == [1, 1, 1], counts  # plan, write:a, write:b once each
    journal = await run.journal()
    assert_chained(journal)
    assert [r.name for _, r in journal if isinstance(r, WaitStarted)] == [
        "o-kill/part-0",
        "o-kill/part-1",
    ]
