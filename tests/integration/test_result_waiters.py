"""Waiting for results costs no server state per waiter (issue 9, item 10), and is sent
no step record (issue 11).

``Run.result()`` used to open a JetStream consumer per call, which outlived it: 1,200
waiters hit the stream's consumer limit (``err_code`` 10026) and a worker could not
start. Now an engine has one watch consumer while anyone waits, and none after.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import fusee
from fusee.actors.registry import Registry
from fusee.adapters.jetstream import watch as watch_module
from fusee.adapters.jetstream.server import EmbeddedServer
from fusee.runtime.records import RunCompleted, encode_record
from tests.workers.procs import chain_input, chain_result, wait_until

WAITERS = 1_200

release = anyio.Event()


@fusee.workflow("waiters_gated")
async def gated(ctx: fusee.Context, n: int) -> int:
    async def held() -> int:
        await release.wait()
        return n * 2

    return await ctx.step("held", held, type=int)


@fusee.workflow("waiters_signalled")
async def signalled(ctx: fusee.Context, n: int) -> int:
    got = await ctx.wait_for("go")
    return n + int(got)


async def consumers(engine: fusee.Engine) -> int:
    """The stream's consumers, once a delete the last waiter began is done (it runs in
    the background, so a result does not wait for it)."""
    await engine.store.journal_watch.settled()
    info = await engine.store.js.stream_info(engine.store.layout.stream)
    return int(info.state.consumer_count)


async def test_many_result_waiters_hold_no_consumer_each(engine: fusee.Engine) -> None:
    global release
    release = anyio.Event()
    async with engine.worker():
        runs = [await engine.start(gated, f"r{i}", i) for i in range(WAITERS)]
        baseline = await consumers(engine)
        results: dict[int, int] = {}

        async def wait(i: int) -> None:
            results[i] = await runs[i].result(timeout="2m")

        async with anyio.create_task_group() as tg:
            for i in range(WAITERS):
                tg.start_soon(wait, i)
            watch = engine.store.journal_watch
            await wait_until(
                lambda: watch.waiting == WAITERS, timeout=60, what="every waiter to wait"
            )
            # the old code had a consumer per waiter here, and failed past 1,000
            assert await consumers(engine) <= baseline + 1
            release.set()
        assert results == {i: i * 2 for i in range(WAITERS)}
        assert await consumers(engine) == baseline  # right after, not seconds later


async def test_a_waiter_that_times_out_or_is_cancelled_leaves_nothing(
    engine: fusee.Engine,
) -> None:
    async with engine.worker():
        run = await engine.start(signalled, "parked", 1)
        baseline = await consumers(engine)
        with pytest.raises(fusee.Timeout):
            await run.result(timeout=0.3)
        assert await consumers(engine) == baseline
        with anyio.move_on_after(0.3):
            await run.result()
        assert await consumers(engine) == baseline
        assert engine.store.journal_watch.waiting == 0
        # and a later waiter still gets its result
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                assert await run.result(timeout="30s") == 8

            tg.start_soon(wait)
            await wait_until(
                lambda: engine.store.journal_watch.waiting == 1, timeout=10, what="the waiter"
            )
            await run.signal("go", 7)
        assert await consumers(engine) == baseline


async def test_object_result_waiters_use_the_watch(engine: fusee.Engine) -> None:
    gate = anyio.Event()

    async def slow(ctx: Any, n: int) -> int:
        await gate.wait()
        return n

    box = fusee.object("waiters_box", {"slow": slow})
    registry = Registry()
    registry.add_object(box)
    async with engine.worker(registry=registry):
        key = box.key("k", engine=engine)
        seqs = [await key.send("slow", i) for i in range(20)]
        baseline = await consumers(engine)
        got: dict[int, int] = {}

        async def wait(i: int) -> None:
            got[i] = await key.result(seqs[i], timeout="60s")

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(wait, i)
            await wait_until(
                lambda: engine.store.journal_watch.waiting == 20, timeout=20, what="the waiters"
            )
            assert await consumers(engine) <= baseline + 1
            gate.set()
        assert got == {i: i for i in range(20)}
        assert await consumers(engine) == baseline


async def test_a_waiter_rides_out_a_server_restart(
    nats_server_private: EmbeddedServer, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    """The watch's consumer is gone with the server; the waiter still hears of the end."""
    server = nats_server_private
    engine = await fusee.connect(server.url, namespace=namespace, partitions=2)
    try:
        worker = await worker_procs(url=server.url, partitions=2).start()
        arg = chain_input(tmp_path / "effects.log", steps=4, delay=0.5, tag="watch")
        run = await engine.start("chain", "r-watch", arg)
        async with anyio.create_task_group() as tg:
            result: list[Any] = []

            async def wait() -> None:
                result.append(await run.result(timeout=60))

            tg.start_soon(wait)
            await wait_until(
                lambda: engine.store.journal_watch.waiting == 1, timeout=10, what="the waiter"
            )
            await worker.wait_for("step.completed", run_id="r-watch", pos=1, timeout=10)
            server.kill()
            await anyio.to_thread.run_sync(server.restart)
        assert result == [chain_result(arg)]
        # the consumer died with the server; the watch noticed and made another
        assert engine.store.journal_watch.consumers_made == 2
    finally:
        await engine.close()


async def test_an_ended_run_answers_with_a_zero_timeout(engine: fusee.Engine) -> None:
    global release
    release = anyio.Event()
    release.set()
    async with engine.worker():
        run = await engine.start(gated, "quick", 4)
        assert await run.result(timeout="30s") == 8
    made = engine.store.journal_watch.consumers_made
    # no waiting at all: the end record is read before the timeout counts (the old
    # code did so; a first version of the watch raised Timeout here)
    assert await run.result(timeout=0) == 8
    assert engine.store.journal_watch.consumers_made == made  # and no watch for it


@fusee.workflow("waiters_many_steps")
async def many_steps(ctx: fusee.Context, n: int) -> int:
    await ctx.wait_for("go")
    for i in range(n):
        await ctx.step(f"s{i}", lambda: None)
    return n


async def test_a_waiter_is_sent_the_end_record_and_no_step_record(engine: fusee.Engine) -> None:
    """End records have a subject of their own (``<ns>.run.<id>.end``): the watch hears
    of them alone, and hands the waiter the record itself (issue 11)."""
    async with engine.worker():
        run = await engine.start(many_steps, "steps", 30)
        watch = engine.store.journal_watch
        async with anyio.create_task_group() as tg:
            result: list[int] = []

            async def wait() -> None:
                result.append(await run.result(timeout="60s"))

            tg.start_soon(wait)
            await wait_until(lambda: watch.waiting == 1, timeout=10, what="the waiter")
            await run.signal("go")
        assert result == [30]
        assert watch.delivered == 1  # 30 steps and a wait.done were stored meanwhile
    layout = engine.store.layout
    stored = await engine.store.read_journal(run.eid)
    assert [m.subject for m in stored] == [layout.journal(run.eid)] * 33 + [layout.ends(run.eid)]
    assert [type(r).__name__ for _, r in await run.journal()][-2:] == [
        "StepCompleted",
        "RunCompleted",
    ]


async def test_a_run_ended_the_way_earlier_versions_end_one(
    engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before issue 11 the end record went on the journal's ``.j`` subject, which the
    watch does not hear: an ended journal of an earlier version answers at once, and a
    waiter of a run that an earlier worker ends reads its journal again after
    ``LOOK_AGAIN`` without news."""
    monkeypatch.setattr(watch_module, "LOOK_AGAIN", 0.2)
    store, layout = engine.store, engine.store.layout
    old = await engine.start(signalled, "old-ended", 1)  # no worker: it stays pending
    waiting = await engine.start(signalled, "old-waited", 1)

    async def end_as_before(run: fusee.Run, value: int) -> None:
        last = await store.last_in_journal(run.eid)
        assert last is not None
        headers = store._fenced_headers(run.eid, "run.completed", last.seq, f"{run.eid}:old")
        record = encode_record(RunCompleted(result=msgspec.Raw(str(value).encode())))
        await store.js.publish(layout.journal(run.eid), record, headers=headers)

    await end_as_before(old, 5)
    assert await old.result(timeout=0) == 5
    async with anyio.create_task_group() as tg:
        result: list[int] = []

        async def wait() -> None:
            result.append(await waiting.result(timeout="60s"))

        tg.start_soon(wait)
        await wait_until(lambda: store.journal_watch.waiting == 1, timeout=10, what="the waiter")
        await end_as_before(waiting, 6)
    assert result == [6]
