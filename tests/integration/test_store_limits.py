"""A NATS server with no storage left: every call answers, with a clear fusee error.

The server is this test's own, with a tiny JetStream storage limit (``max_file_store``),
filled to the brim by another stream.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import nats
import nats.js.errors
import pytest
import structlog.testing
from nats.js.api import StorageType, StreamConfig

import fusee
from fusee.adapters.jetstream.server import EmbeddedServer

pytestmark = pytest.mark.nats

LIMIT = 4 * 1024 * 1024


@fusee.workflow("limits_noop")
async def noop(ctx: fusee.Context, arg: Any) -> Any:
    return arg


async def put(ctx: Any, value: Any) -> Any:
    return value


limits_box = fusee.object("limits_box", {"put": put})


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    server = EmbeddedServer.start(tmp_path / "nats", max_file_store=LIMIT)
    try:
        yield server
    finally:
        server.stop()


async def fill(url: str) -> None:
    """Publish to a stream of its own until JetStream says it has no room left."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(
            StreamConfig(name="FILLER", subjects=["filler"], storage=StorageType.FILE)
        )
        for _ in range(10 * LIMIT // 100_000):
            try:
                await js.publish("filler", b"x" * 100_000, timeout=5)
            except nats.js.errors.APIError as exc:
                if exc.err_code != 10023:
                    raise
                return
        raise AssertionError("the store never filled up")
    finally:
        await nc.close()


async def test_a_full_store_is_a_clear_error_within_the_call_timeout(
    small_server: EmbeddedServer,
) -> None:
    engine = await fusee.connect(small_server.url, namespace="full", partitions=2)
    try:
        await fill(small_server.url)
        with anyio.fail_after(10):  # the old code retried the refused write forever
            with pytest.raises(fusee.StorageFull, match="no storage left"):
                await engine.start(noop, "r1", 1)
            with pytest.raises(fusee.StorageFull, match="no storage left"):
                await engine.object(limits_box, "k").call("put", 1, timeout="5s")
            with pytest.raises(fusee.StorageFull, match="no storage left"):
                await engine.object(limits_box, "k").send("put", 2)
    finally:
        await engine.close()


async def test_connecting_to_a_full_store_is_a_clear_error(small_server: EmbeddedServer) -> None:
    await fill(small_server.url)
    with anyio.fail_after(10):
        with pytest.raises(fusee.StorageFull, match="no storage left"):
            await fusee.connect(small_server.url, namespace="fresh", partitions=2)


# -- retries have a deadline (issue 9) -------------------------------------------------


@contextlib.contextmanager
def stopped(server: EmbeddedServer) -> Iterator[None]:
    """The server frozen (SIGSTOP) while the block runs: connected, but no answer."""
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


async def test_a_client_call_gives_up_when_nats_does_not_answer(
    nats_server_private: EmbeddedServer,
) -> None:
    engine = await fusee.connect(nats_server_private.url, namespace="stall", partitions=2)
    try:
        await engine.start(noop, "before", 1)
        with stopped(nats_server_private), engine.store.retrying_for(1.0):
            with anyio.fail_after(20):  # the old code retried for as long as NATS slept
                with pytest.raises(fusee.ConnectionLost, match="NATS did not answer"):
                    await engine.start(noop, "r1", 1)  # a journal append
                with pytest.raises(fusee.ConnectionLost, match="NATS did not answer"):
                    await engine.run("before").journal()  # a Direct Get
                with pytest.raises(fusee.ConnectionLost, match="NATS did not answer"):
                    await engine.run("before").signal("go")  # last record, then the inbox
        # and once NATS answers again, so does the engine
        assert [type(r).__name__ for _, r in await engine.run("before").journal()] == ["RunStarted"]
    finally:
        await engine.close()


async def test_a_damaged_partition_count_is_a_clear_error(nats_server: Any, namespace: str) -> None:
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=2)
    try:
        await engine.store.work.put("config.partitions", b"many")
    finally:
        await engine.close()
    # the old code took any error reading it for a new namespace, then failed on int()
    with pytest.raises(fusee.FuseeError, match=r"config\.partitions .* holds b'many'"):
        await fusee.connect(nats_server.url, namespace=namespace)


gate = anyio.Event()
stepping = anyio.Event()
executions: list[int] = []


@fusee.workflow("limits_gated")
async def gated(ctx: fusee.Context, arg: int) -> int:
    async def held() -> int:
        executions.append(arg)
        stepping.set()
        await gate.wait()
        return arg * 3

    return await ctx.step("held", held, type=int)


async def test_the_worker_rides_out_an_outage_longer_than_a_client_waits(
    nats_server_private: EmbeddedServer,
) -> None:
    """Actors are not bound by the client's patience: a step that ends while NATS is
    frozen is journaled once NATS is back, and the run completes."""
    global gate, stepping
    gate, stepping = anyio.Event(), anyio.Event()
    executions.clear()
    engine = await fusee.connect(nats_server_private.url, namespace="ride", partitions=2)
    try:
        with (
            structlog.testing.capture_logs() as logs,
            engine.store.retrying_for(1.0),  # the client's patience, for this test
        ):
            async with engine.worker():  # the worker's: as long as it takes
                run = await engine.start(gated, "r1", 5)
                with anyio.fail_after(10):
                    await stepping.wait()
                with stopped(nats_server_private):
                    gate.set()  # the step ends: its record cannot be stored yet
                    await anyio.sleep(3)  # the outage's length, past the client's 1 s
                assert await run.result(timeout="30s") == 15
                kinds = [type(r).__name__ for _, r in await run.journal()]
                assert kinds == ["RunStarted", "StepCompleted", "RunCompleted"]
                assert executions == [5]  # the step's record waited; the step did not rerun
        # the actor kept waiting for its append: it did not give up, fail the run (then
        # fenced by its own late record) and resume by replay
        events = [e["event"] for e in logs]
        assert "actor.fenced" not in events
        assert "run.resumed" not in events
    finally:
        await engine.close()
