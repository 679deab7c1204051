"""Parked runs: N runs park on a signal, then each is signalled once.

    python -m bench.parked [--runs 5000]

Reports the worker's memory with N parked (per parked run, over its idle RSS), that
every run finishes, and how long the signals took to bring them all to the end.
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import time
from pathlib import Path

import anyio
import structlog

import fusee
from bench.__main__ import _rss_mib, spawn_worker
from fusee.adapters.jetstream.server import EmbeddedServer


async def _count(engine: fusee.Engine, status: str) -> int:
    return sum(i.status == status for i in await engine.list_runs())


async def parked(url: str, runs: int) -> dict[str, float]:
    engine = await fusee.connect(url, namespace="parked")
    worker = spawn_worker(url, "parked")
    try:
        await anyio.sleep(1.0)  # let it claim its partitions
        idle = _rss_mib(worker.pid)
        limit = anyio.CapacityLimiter(200)

        async def start(i: int) -> None:
            async with limit:
                await engine.start("bench.wait", f"parked-{i}", None)

        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(runs):
                tg.start_soon(start, i)
        while await _count(engine, "waiting") < runs:
            await anyio.sleep(0.5)
        parked_s = time.perf_counter() - began
        rss = _rss_mib(worker.pid)

        async def signal_one(i: int) -> None:
            async with limit:
                await engine.run(f"parked-{i}").signal("go", i)

        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(runs):
                tg.start_soon(signal_one, i)
        signalled_s = time.perf_counter() - began
        deadline = time.monotonic() + 300
        while (done := await _count(engine, "completed")) < runs and time.monotonic() < deadline:
            await anyio.sleep(0.5)
        finished_s = time.perf_counter() - began
        return {
            "runs": runs,
            "completed": done,
            "seconds_to_park_all": round(parked_s, 1),
            "worker_idle_mib": round(idle, 1),
            "worker_parked_mib": round(rss, 1),
            "kib_per_parked_run": round((rss - idle) * 1024 / runs, 2),
            "seconds_to_signal_all": round(signalled_s, 1),
            "seconds_to_finish_all": round(finished_s, 1),
            "goal_kib_per_parked_run": 10,
        }
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait()
        await engine.close()


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            row = await parked(server.url, runs)
        finally:
            server.stop()
    print(json.dumps({"bench": "parked", **row}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.parked")
    parser.add_argument("--runs", type=int, default=5000)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    anyio.run(main, args.runs)
