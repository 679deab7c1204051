"""An actor that crashes again and again is quarantined with backoff, pokes or not, and
the reason shows where operators look (``runs show``, ``objects show``).

The crash is a real one: an operator lowered the journal stream's message size limit
below any record, so every append of the actor is refused (``err_code 10054``) and the
error escapes the actor (no handler or step is at fault). The work is queued before a
worker starts and the limit set, so the worker's own appends are the first to hit it.
Pokes are wake hints on core NATS, as a caller's message would send, storing nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.runtime.ids import escape, partition_of
from fusee.runtime.objects import object_id
from tests.workers.procs import HERE, WorkerProc, chain_input, chain_result, wait_until

QUARANTINED = 3  # crashes to see before looking: backoffs of 1 s, then 2 s, then 4 s


async def _limit_messages(engine: fusee.Engine, size: int) -> None:
    """Set the journal stream's ``max_msg_size`` (-1: none), as an operator could."""
    js = engine.store.js
    info = await js.stream_info(engine.store.layout.stream)
    info.config.max_msg_size = size
    await js.update_stream(info.config)


def _crashes(worker: WorkerProc, run_id: str) -> list[float]:
    return [
        datetime.fromisoformat(e["timestamp"]).timestamp()
        for e in worker.find("actor.crashed", run_id=run_id)
    ]


async def _poke_until_quarantined(
    engine: fusee.Engine, worker: WorkerProc, run_id: str, noted: Callable[[], Awaitable[bool]]
) -> list[float]:
    """Poke the actor many times a poll until ``noted()``; the crashes seen meanwhile
    must stay few (without a quarantine every poke activates it again)."""
    partition = partition_of(run_id, engine.partitions)

    async def check() -> bool:
        for _ in range(20):
            await engine.store.wake(partition, escape(run_id))
        seen = _crashes(worker, run_id)
        if len(seen) > QUARANTINED + 2:
            pytest.fail(f"{len(seen)} crashes of {run_id}: not held back\n{worker.tail()}")
        return len(seen) >= QUARANTINED and await noted()

    await wait_until(check, timeout=30, what=f"{run_id} to be quarantined")
    return _crashes(worker, run_id)


def _assert_backed_off(times: list[float]) -> None:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # 1 s, then 2 s, each rounded up to the next reconcile (every 2 s)
    assert all(g >= 0.9 for g in gaps), gaps
    assert gaps[1] >= 1.9, gaps


async def test_a_crashing_run_is_quarantined_and_says_why(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    arg = chain_input(tmp_path / "effects.log", steps=2, delay=0.01, tag="q")
    run = await engine.start("chain", "r-crashing", arg)
    await _limit_messages(engine, 1)
    worker = await worker_procs(partitions=engine.partitions).start()

    async def noted() -> bool:
        info = await run.describe()
        return f"crashed {QUARANTINED} times" in (info.reason or "")

    times = await _poke_until_quarantined(engine, worker, "r-crashing", noted)
    _assert_backed_off(times)
    info = await run.describe()
    assert info.status == "pending"
    assert "message size exceeds maximum allowed" in (info.reason or ""), info.reason
    listed = [r for r in await engine.list_runs() if r.run_id == "r-crashing"]
    assert listed
    assert "crashed" in (listed[0].reason or "")

    # the condition mended: the next try (after the backoff) runs it to its end
    await _limit_messages(engine, -1)
    assert await run.result(timeout=30) == chain_result(arg)
    assert (await run.describe()).reason is None


async def test_a_crashing_object_is_quarantined_and_says_why(
    engine: fusee.Engine, worker_procs: Any
) -> None:
    counter = engine.object("counter", "crashing")
    seq = await counter.send("add", {"client": "c", "n": 1})
    await _limit_messages(engine, 1)
    workers = worker_procs(partitions=engine.partitions)
    workers.module = HERE / "objects.py"
    worker = await workers.start()

    async def noted() -> bool:
        crashed = (await counter.show()).crashed
        return crashed is not None and crashed["crashes"] >= QUARANTINED

    times = await _poke_until_quarantined(engine, worker, object_id("counter", "crashing"), noted)
    _assert_backed_off(times)
    crashed = (await counter.show()).crashed
    assert crashed is not None
    assert "message size exceeds maximum allowed" in crashed["error"]
    assert crashed["worker"] == worker.find("worker.started")[0]["worker"]

    await _limit_messages(engine, -1)
    assert await counter.result(seq, timeout=30) == 1

    async def cleared() -> bool:
        return (await counter.show()).crashed is None  # the marker went idle

    await wait_until(cleared, timeout=15, what="the crash note to go")
