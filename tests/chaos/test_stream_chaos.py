"""SIGKILL the worker of two streaming ``model_call`` runs 10 times, at random points of
their streams, while readers in this process follow them: some from the start, some
joining late at random offsets, some disconnecting and reconnecting with their offset.

Every reader ends with exactly the stored events from its offset; with prefill the
stream is one continuous text, without it every crash left an attempt boundary; the
step's result is the final attempt's text.
"""

from __future__ import annotations

import functools
import os
import random
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import fusee
from fusee.runtime.ids import escape
from fusee.runtime.records import StepCompleted
from fusee.runtime.tokens import TokenEvent
from tests.helpers import split_attempts as _split
from tests.workers import tokens as scripted
from tests.workers.procs import wait_until

pytestmark = pytest.mark.chaos

KILLS = 10


async def last_index(engine: fusee.Engine, run_id: str) -> int:
    """The index of the last stored event of the run's stream (-1: nothing yet)."""
    store = engine.store.tokens
    last = await store._get_last(store.subject(escape(run_id), "model-0"))
    return -1 if last is None else last.index


async def test_kill_worker_mid_stream(
    nats_server: Any, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    seed = int(os.environ.get("FUSEE_CHAOS_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    print(f"FUSEE_CHAOS_SEED={seed}")
    log = tmp_path / "calls.log"
    args: dict[str, dict[str, Any]] = {
        # long enough that 10 kills never let it finish early; continues after a crash
        "cont": {"tokens": 1000, "delay": 0.004, "prefill": True, "log": str(log)},
        # restarts after a crash: a kill every 5..60 tokens never lets it finish either
        "restart": {"tokens": 120, "delay": 0.004, "prefill": False, "log": str(log)},
    }
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=2)
    readers: dict[str, list[TokenEvent]] = {}
    offsets: dict[str, tuple[str, int]] = {}

    async def follow(key: str, run_id: str, offset: int) -> None:
        offsets[key] = (run_id, offset)
        got = readers.setdefault(key, [])
        async for e in engine.run(run_id).stream_events("model-0", offset):
            got.append(e)

    async def reconnecting(key: str, run_id: str) -> None:
        offsets[key] = (run_id, 0)
        got = readers.setdefault(key, [])
        offset = 0
        while not got or got[-1].kind != "end":
            budget = rng.randint(10, 80)
            async for e in engine.run(run_id).stream_events("model-0", offset):
                got.append(e)
                if e.kind == "token":
                    offset = e.index + 1
                    budget -= 1
                    if budget == 0:
                        break  # disconnect; reconnect below with the offset
            else:
                return  # the stream is over (a truncated one ends without "end")
            await anyio.sleep(rng.uniform(0, 0.2))

    try:
        procs = worker_procs(partitions=2)
        procs.module = Path(scripted.__file__)
        worker = await procs.start()
        for run_id, arg in args.items():
            await engine.start("tok_slow", run_id, arg)
        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                for run_id in args:
                    for n in range(2):
                        tg.start_soon(follow, f"{run_id}-start{n}", run_id, 0)
                    tg.start_soon(reconnecting, f"{run_id}-reconnect", run_id)
                for i in range(KILLS):
                    # a random point of the stream: 5..60 tokens after the new worker resumed
                    base = await last_index(engine, "cont")
                    step = rng.randint(5, 60)
                    await wait_until(
                        functools.partial(_grown, engine, base + step),
                        timeout=20,
                        what=f"the stream to grow (kill {i + 1})",
                        interval=0.01,
                    )
                    if i % 2 == 0:  # a late joiner per run, at a random offset
                        for run_id in args:
                            top = await last_index(engine, run_id)
                            offset = rng.randint(0, max(0, top) + 30)
                            tg.start_soon(follow, f"{run_id}-late{i}", run_id, offset)
                    worker.kill()
                    worker = await procs.start()
                for run_id in args:
                    await engine.run(run_id).result(timeout=30)

        for run_id, arg in args.items():
            context = f"seed {seed}, run {run_id}"
            run = engine.run(run_id)
            truth = [e async for e in run.stream_events("model-0")]
            result = await run.result(timeout=5)
            journaled = [
                msgspec.json.decode(bytes(r.result))
                for _, r in await run.journal()
                if isinstance(r, StepCompleted)
            ]
            assert journaled == [result], context
            # the truth itself: in order, no gap, no duplicate, one end at the end
            indexes = [e.index for e in truth if e.kind == "token"]
            assert indexes == list(range(len(indexes))), context
            assert [e.kind for e in truth].count("end") == 1, context
            assert truth[-1].kind == "end", context
            attempts = _split(truth)
            print(f"{run_id}: {len(truth)} events, {len(attempts)} attempt(s)")
            assert "".join(e.text for e in attempts[-1] if e.kind == "token") == result, context
            assert result == scripted.full_text(arg["tokens"]), context
            if arg["prefill"]:
                assert len(attempts) == 1, (context, "a continued stream has no boundary")
            else:
                # every crash that cut an attempt with tokens left a boundary; each cut
                # attempt is a proper prefix of the text, the last one is all of it
                assert 2 <= len(attempts) <= KILLS + 1, (context, len(attempts))
                for cut in attempts[:-1]:
                    text = "".join(e.text for e in cut if e.kind == "token")
                    assert text, context
                    assert scripted.full_text(arg["tokens"]).startswith(text), context
                    assert text != result, context
            # every reader: exactly the stored events from its offset
            for key, (rid, offset) in offsets.items():
                if rid != run_id:
                    continue
                want = [e for e in truth if e.index >= offset]
                assert readers[key] == want, (context, key, offset)
        # with prefill, each call after a crash resumed from the stored text
        resumes = [
            int(n)
            for rid, n in (ln.split() for ln in log.read_text().splitlines())
            if rid == "cont"
        ]
        print(f"cont resumed from {resumes}; readers {sorted(offsets.values())}")
        assert resumes == sorted(resumes), resumes
        assert len(resumes) >= KILLS // 2, resumes
    finally:
        await engine.close()


async def _grown(engine: fusee.Engine, index: int) -> bool:
    return await last_index(engine, "cont") >= index
