"""Token-stream benchmarks (issue #5), each beside the raw NATS floor of the same run.

    python -m bench.streams [--tokens 50000] [--sync]

One JSON line per figure, on a fresh embedded nats-server with ``sync_interval: always``:

- ``floor``: p50/p99 of a plain sequential ``js.publish`` to the tokens stream.
- ``writer``: tokens/s one ``TokenWriter`` makes durable (pipelined, every ack awaited).
  ``--sync`` also measures a tokens stream without ``persist_mode: async``.
- ``latency``: publish-to-reader p50/p99 with 1, 10 and 50 readers in one process.
- ``first_token``: time from ``read()`` to the first event, for a new reader at offset 0
  and at offset 5,000 of a 10,000-token stream.

Goals: >= 20,000 tokens/s per writer, reader latency p50 <= 2 ms with 10 readers, first
token <= 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from fusee.adapters.jetstream.server import EmbeddedServer
from fusee.adapters.jetstream.store import NatsStore
from fusee.adapters.jetstream.tokens import TokenStore
from fusee.runtime.records import RunStarted, StepCompleted, encode_record, kind_of


def emit(name: str, **fields: Any) -> None:
    print(json.dumps({"bench": name, **fields}), flush=True)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * p))], 3)


async def new_run(store: NatsStore, eid: str, *, done: str | None = None) -> None:
    """A journal for ``eid`` (readers check the run exists); ``done``: its step completed."""
    rec = RunStarted(workflow="bench", input=msgspec.Raw(b"null"), started_at=time.time())
    seq = await store.append(eid, kind_of(rec), encode_record(rec), fence=0, msg_id=f"{eid}:s")
    if done is not None:
        step = StepCompleted(pos=1, name=done, result=msgspec.Raw(b'""'), prev=seq)
        await store.append(eid, kind_of(step), encode_record(step), fence=seq, msg_id=f"{eid}:1")


async def floor(store: NatsStore, n: int = 2000) -> float:
    js, subject = store.js, store.tokens.subject("floor", "f")
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        await js.publish(subject, b"tok%d " % i)
        lat.append((time.perf_counter() - t0) * 1000)
    p50 = statistics.median(lat)
    emit("floor", what="sequential js.publish to the tokens stream", p50_ms=round(p50, 3),
         p99_ms=pct(lat, 0.99), n=n)  # fmt: skip
    return p50


async def writer(tokens: TokenStore, eid: str, n: int, label: str) -> float:
    w = await tokens.open(eid, "w")
    t0 = time.perf_counter()
    for i in range(n):
        await w.write(f"tok{i} ")
    await w.end()
    elapsed = time.perf_counter() - t0
    await w.close()
    rate = n / elapsed
    emit("writer", stream=label, tokens=n, seconds=round(elapsed, 3), tokens_per_s=round(rate))
    return rate


async def latency(store: NatsStore, readers: int, n: int = 400, every: float = 0.004) -> None:
    eid = f"lat{readers}"
    await new_run(store, eid)
    lat: list[float] = []
    ready = 0
    all_ready = asyncio.Event()

    async def reader() -> None:
        nonlocal ready
        it = store.tokens.read(eid, "m", 0)
        first = True
        async for e in it:
            if first:
                first = False
                ready += 1
                if ready == readers:
                    all_ready.set()
                continue  # the warm-up token
            if e.kind == "end":
                break
            lat.append((time.perf_counter_ns() - int(e.text)) / 1e6)
        await it.aclose()

    w = await store.tokens.open(eid, "m")
    tasks = [asyncio.create_task(reader()) for _ in range(readers)]
    await w.write(str(time.perf_counter_ns()))  # warm-up: every reader is live after it
    await asyncio.wait_for(all_ready.wait(), 30)
    for _ in range(n):
        await w.write(str(time.perf_counter_ns()))
        await asyncio.sleep(every)
    await w.end()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    await w.close()
    emit("latency", readers=readers, tokens_per_s=round(1 / every), samples=len(lat),
         p50_ms=pct(lat, 0.5), p99_ms=pct(lat, 0.99))  # fmt: skip


async def first_token(store: NatsStore, n: int = 10_000, repeats: int = 50) -> None:
    eid = "ttft"
    w = await store.tokens.open(eid, "m")
    for i in range(n):
        await w.write(f"tok{i} ")
    await w.end()
    await w.close()
    await new_run(store, eid, done="m")
    for offset in (0, 5000):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            it = store.tokens.read(eid, "m", offset)
            e = await it.__anext__()
            times.append((time.perf_counter() - t0) * 1000)
            assert e.index == offset, e
            await it.aclose()
        emit("first_token", offset=offset, stored=n, p50_ms=pct(times, 0.5),
             p99_ms=pct(times, 0.99), n=repeats)  # fmt: skip


class SyncTokens(TokenStore):
    """The tokens stream as it would be without ``persist_mode: async``."""

    def config(self) -> Any:
        cfg = super().config()
        cfg.persist_mode = None
        return cfg


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            store = await NatsStore.connect(server.url, "bench")
            await store.ensure_layout()
            await floor(store)
            await writer(store.tokens, "wr", args.tokens, "persist_mode=async")
            if args.sync:
                other = await NatsStore.connect(server.url, "benchsync")
                other.tokens = SyncTokens(other.nc, other.js, other.layout)
                await other.ensure_layout()
                await writer(other.tokens, "wr", args.tokens, "persist_mode=default")
                await other.close()
            for readers in (1, 10, 50):
                await latency(store, readers)
            await first_token(store)
            await store.close()
        finally:
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=50_000)
    parser.add_argument("--sync", action="store_true", help="also measure without async persist")
    asyncio.run(main(parser.parse_args()))
