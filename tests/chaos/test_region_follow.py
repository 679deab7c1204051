"""A process connected before a failover goes on after it (issue 16): a client of the
namespace (the HTTP API's process, a script) follows the namespace to the epoch the
failover made, as one connected after it would; a process running a worker does not
(its appends stay fenced by their epoch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from fusee.adapters.jetstream.layout import Layout
from fusee.errors import ConfigError
from tests.chaos.regions_kit import (
    PARTITIONS,
    caught_up,
    connect_home,
    env_for,
)
from tests.cluster import LoopbackRegions
from tests.workers.procs import Workers, chain_result, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.cluster, pytest.mark.timeout(240)]


async def test_a_client_connected_before_a_failover_follows_the_namespace_to_its_new_home(
    regions: LoopbackRegions,
    namespace: str,
    tmp_path: Path,
) -> None:
    """A west client connected while east was home (epoch 1): after a planned
    ``fail_over`` to west it reads a run made in east, starts, signals and waits for
    runs in west, lists them, and watches a result it began to wait for before the
    failover, with no restart and no error (before: ``RunNotFound`` for a run that
    exists, and 30 s of ``ConnectionLost``). An engine that runs a worker keeps its
    epoch."""
    east_url, west_url = regions.url("east"), regions.url("west")
    east = await connect_home(east_url, namespace)
    gate = tmp_path / "gate"

    def arg(tag: str, hold: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"log": str(tmp_path / f"{tag}.log"), "steps": 2, "delay": 0.0}
        out["tag"] = tag
        out["hold"] = {"step": "s2", "until": str(gate)} if hold else None
        return out

    (tmp_path / "west").mkdir()
    east_workers = Workers(east_url, namespace, tmp_path, partitions=PARTITIONS)
    west_workers = Workers(west_url, namespace, tmp_path / "west", partitions=PARTITIONS)
    client = await fusee.connect(west_url, namespace=namespace, region="west")
    pinned = await fusee.connect(west_url, namespace=namespace, region="west")
    try:
        assert client.store.layout == Layout(namespace, 1, "east")
        worker = await east_workers.start(extra_env=env_for("east", "west"))
        assert await (await east.start("chain", "before", arg("a"))).result(timeout=30) == (
            chain_result(arg("a"))
        )
        held = await east.start("chain", "held", arg("h", hold=True))
        await wait_until(
            lambda: (tmp_path / "h.log").exists() and "s2" in (tmp_path / "h.log").read_text(),
            timeout=30, what="the held run in s2",
        )  # fmt: skip
        assert held.run_id == "held"
        await wait_until(lambda: caught_up(east), timeout=30, what="the mirror caught up")
        # a process that runs a worker never follows, even one refused to run here
        with pytest.raises(ConfigError, match="has its home in region 'east'"):
            async with pinned.worker():
                pass
        assert not pinned.store.follows_failover
        async with client, anyio.create_task_group() as tg:
            got: dict[str, Any] = {}

            async def wait_held() -> None:
                got["held"] = await client.run("held").result(timeout=120)

            tg.start_soon(wait_held)  # waiting on the epoch-1 stream's watch
            await wait_until(lambda: client.store.journal_watch.waiting == 1, timeout=10,
                             what="the result watched")  # fmt: skip
            assert worker.stop() == 0
            await east.close()
            report = await fusee.fail_over(west_url, namespace=namespace, to="west")
            assert report.epoch == 2

            await wait_until(
                lambda: client.store.layout.epoch == 2, timeout=10, what="the client followed"
            )
            assert client.store.layout == Layout(namespace, 2, "west")
            # as a connect in the new home: its work bucket made, its secret read
            async with await fusee.connect(west_url, namespace=namespace, region="west") as new:
                await wait_until(
                    lambda: client.store.completion_secret == new.store.completion_secret,
                    timeout=30, what="the new home's secret",
                )  # fmt: skip
                made = await new.tokens.create("read", name="after-the-failover")
                assert (await client.tokens.verify(made.token)).scope == "read"
            assert pinned.store.layout.epoch == 1  # never moved
            await west_workers.start(extra_env=env_for("west"))
            assert await client.run("before").result(timeout=10) == chain_result(arg("a"))
            assert (await client.run("before").describe()).status == "completed"
            run = await client.start("chain", "after", arg("b"))
            assert await run.result(timeout=30) == chain_result(arg("b"))
            ids = set()
            async for page in client.runs():
                ids |= {r.run_id for r in page}
            assert {"before", "after", "held"} <= ids, ids
            assert "held" not in got
            gate.touch()
        assert got["held"] == chain_result(arg("h", hold=True))
    finally:
        await pinned.close()
        east_workers.cleanup()
        west_workers.cleanup()
