"""Keyed-object benchmarks, each beside the raw NATS floor measured in the same run.

    python -m bench.objects [--calls 500] [--keys 100] [--per-key 20]

One JSON line per figure, then a table, on a fresh embedded nats-server with
``sync_interval: always`` (each acknowledged write is on disk). The worker runs in this
process (``engine.worker()``), as for W1/W2 in ``python -m bench``: client and worker
share one event loop and one core.

- ``floor``: the writes one exclusive call makes, timed one after another with nats-py:
  the inbox publish, the active-marker Direct Get, the fenced journal append
  (``obj.done``), the compare-and-set KV put of the state; p50 of each, their sum (the
  floor of one call: the best a sequential caller could do with this design) and p50 of
  a plain fsync'd publish. A batched Direct Get of the inbox is timed too but left out
  of that sum. ``path_ms`` is what must happen one after another between call and
  reply, the floor W4 is compared with: the inbox publish and the journal append (the
  worker's inbox consumer hands the actor the message, the marker check is skipped
  while the object answered the engine moments ago, and the KV put follows the reply).
- ``floor_parallel``: the same four operations, ``--keys`` chains at once: the most
  calls/s the server could take for the concurrent figure.
- ``w4``: ``--calls`` sequential ``call``s to one key from one client, each adding 1 to a
  counter in the object's state (warm-up calls excluded); the counter is checked.
- ``w4_process``: the same with the worker in a process of its own, as in a deployment
  (client, worker and server then share the 2 cores as 3 processes).
- ``w4_keys``: ``--keys`` keys in parallel, each with ``--per-key`` sequential calls
  (``--keys`` calls in flight); every counter is checked.

Goal: W4 >= 1,000 calls/s (Restate 165, Temporal 55, DBOS 37-74 on this machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import nats
import structlog
from nats.js.api import KeyValueConfig, StorageType

import bench.workflows as wfs
import fusee
from bench import floor_replicas
from bench.__main__ import spawn_worker
from fusee.adapters.jetstream.direct import direct_page
from fusee.adapters.jetstream.server import EmbeddedServer

RESULTS: list[dict[str, Any]] = []
WORKER = "in-process (engine.worker(), as W1/W2)"
PROCESS_WORKER = "its own process (python -m bench.worker, as W5)"


def emit(name: str, **fields: Any) -> None:
    row = {"bench": name, **fields}
    RESULTS.append(row)
    print(json.dumps(row), flush=True)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * p))], 3)


class Floor:
    """The operations of one exclusive call, with nats-py and nothing else, on a stream
    and a KV bucket configured as fusee's (file storage, Direct Get, dedupe headers)."""

    OPS = ("inbox_publish", "marker_get", "journal_append", "state_put")

    def __init__(self, nc: Any, js: Any, kv: Any) -> None:
        self.nc, self.js, self.kv = nc, js, kv

    @classmethod
    async def open(cls, url: str) -> Floor:
        nc = await nats.connect(url.split(","))
        js = nc.jetstream()
        replicas = floor_replicas()
        await js.add_stream(
            name="OFLOOR",
            subjects=["ofloor.>"],
            allow_direct=True,
            duplicate_window=120.0,
            num_replicas=replicas,
        )
        kv = await js.create_key_value(
            KeyValueConfig(
                bucket="ofloor",
                history=1,
                storage=StorageType.FILE,
                direct=True,
                replicas=replicas,
            )
        )
        return cls(nc, js, kv)

    async def close(self) -> None:
        await self.js.delete_stream("OFLOOR")
        await self.js.delete_key_value("ofloor")
        await self.nc.close()

    async def chain(self, key: str, n: int, lat: dict[str, list[float]]) -> None:
        """``n`` calls' worth of operations on one key, one after another."""
        js, kv = self.js, self.kv
        await kv.put(f"active.{key}", b"{}")
        state_rev = journal_last = 0
        inbox = f"ofloor.in.{key}"
        for i in range(n):
            t0 = time.perf_counter()
            ack = await js.publish(
                inbox,
                b'{"kind":"invoke","handler":"incr","input":null,"reply":"_r.%d"}' % i,
                headers={"Fusee-Kind": "invoke"},
            )
            t1 = time.perf_counter()
            await kv.get(f"active.{key}")
            t2 = time.perf_counter()
            async for _ in direct_page(self.nc, "$JS.API.DIRECT.GET.OFLOOR", inbox, ack.seq, 1000):
                pass
            t3 = time.perf_counter()
            journal = await js.publish(
                f"ofloor.run.{key}.j",
                b'{"kind":"obj.done","inbox_seq":%d,"handler":"incr","result":%d,'
                b'"state_set":{"count":%d}}' % (ack.seq, i, i),
                headers={
                    "Fusee-Kind": "obj.done",
                    "Nats-Expected-Last-Subject-Sequence": str(journal_last),
                    "Nats-Expected-Last-Subject-Sequence-Subject": f"ofloor.run.{key}.>",
                    "Nats-Msg-Id": f"{key}:{i}",
                },
            )
            journal_last = journal.seq
            t4 = time.perf_counter()
            put = await js.publish(
                f"$KV.ofloor.state.{key}",
                b'{"count":%d}' % i,
                headers={
                    "Fusee-Journal-Seq": str(journal_last),
                    "Nats-Expected-Last-Subject-Sequence": str(state_rev),
                },
            )
            state_rev = put.seq
            t5 = time.perf_counter()
            for op, ms in (
                ("inbox_publish", t1 - t0),
                ("marker_get", t2 - t1),
                ("inbox_read", t3 - t2),
                ("journal_append", t4 - t3),
                ("state_put", t5 - t4),
            ):
                lat[op].append(ms * 1000)


def empty() -> dict[str, list[float]]:
    return {op: [] for op in (*Floor.OPS, "inbox_read")}


async def floor(url: str, n: int, keys: int, per_key: int) -> dict[str, float]:
    f = await Floor.open(url)
    try:
        lat = empty()
        await f.chain("warm", 50, empty())
        await f.chain("seq", n, lat)
        p50 = {op: round(statistics.median(v), 3) for op, v in lat.items()}
        call_ms = round(sum(p50[op] for op in Floor.OPS), 3)
        # what must happen one after another before the reply, as the actor runs now:
        # the inbox message is handed over by the worker's consumer, the marker check
        # is skipped or overlaps the wait, the KV put follows the reply
        path_ms = round(p50["inbox_publish"] + p50["journal_append"], 3)
        # one plain fsync'd publish, alone
        plain = []
        for i in range(n):
            t0 = time.perf_counter()
            await f.js.publish("ofloor.plain", b"%d" % i)
            plain.append((time.perf_counter() - t0) * 1000)
        publish_ms = round(statistics.median(plain), 3)
        emit(
            "floor",
            what="one call's NATS operations, sequential, nats-py only",
            publish_p50_ms=publish_ms,
            publish_p99_ms=pct(plain, 0.99),
            **{f"{op}_p50_ms": p50[op] for op in lat},
            call_ms=call_ms,
            calls_per_s=round(1000 / call_ms),
            path_ms=path_ms,
            path_calls_per_s=round(1000 / path_ms),
            n=n,
        )
        # the same chains, one per key, all keys at once
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for k in range(keys):
                tg.start_soon(f.chain, f"par{k}", per_key, empty())
        parallel = keys * per_key / (time.perf_counter() - t0)
        emit("floor_parallel", keys=keys, per_key=per_key, calls_per_s=round(parallel))
    finally:
        await f.close()
    return {
        "call_ms": call_ms,
        "path_ms": path_ms,
        "publish_ms": publish_ms,
        "parallel": parallel,
    }


async def w4(
    url: str, fl: dict[str, float], calls: int, warmup: int, *, separate: bool = False
) -> None:
    """W4; ``separate``: the worker in a process of its own (``python -m bench.worker``),
    as in a deployment, instead of this one."""
    namespace = "w4p" if separate else "w4"
    engine = await fusee.connect(url, namespace=namespace)
    key = engine.object(wfs.counter, f"w4-{time.time_ns()}")
    lat = []
    process = None
    async with contextlib.AsyncExitStack() as stack:
        if separate:
            process = await anyio.to_thread.run_sync(spawn_worker, url, namespace)
        else:
            await stack.enter_async_context(engine.worker())
        for _ in range(warmup):  # the actor activates, the reply subscription opens
            await key.call("incr")
        t0 = time.perf_counter()
        for _ in range(calls):
            t = time.perf_counter()
            last = await key.call("incr")
            lat.append((time.perf_counter() - t) * 1000)
        elapsed = time.perf_counter() - t0
        state = await key.state()
    if process is not None:
        process.send_signal(signal.SIGTERM)
        await anyio.to_thread.run_sync(process.wait)
    await engine.close()
    expected = warmup + calls
    if last != expected or state.get("count") != expected:
        raise RuntimeError(f"w4: counter {state}, last call returned {last}, want {expected}")
    rate = calls / elapsed
    p50 = pct(lat, 0.5)
    emit(
        "w4_process" if separate else "w4",
        worker=PROCESS_WORKER if separate else WORKER,
        calls=calls,
        warmup=warmup,
        seconds=round(elapsed, 3),
        calls_per_s=round(rate),
        p50_ms=p50,
        p99_ms=pct(lat, 0.99),
        counter=state.get("count"),
        counter_ok=True,
        floor_path_ms=fl["path_ms"],
        floor_calls_per_s=round(1000 / fl["path_ms"]),
        ratio_to_floor=round(rate / (1000 / fl["path_ms"]), 2),
        ratio_p50_to_floor=round(p50 / fl["path_ms"], 2),
        ratio_p50_to_publish=round(p50 / fl["publish_ms"], 2),
        goal_calls_per_s=1000,
    )


async def w4_keys(url: str, fl: dict[str, float], keys: int, per_key: int) -> None:
    engine = await fusee.connect(url, namespace="w4k")
    run = time.time_ns()
    handles = [engine.object(wfs.counter, f"w4k-{run}-{k}") for k in range(keys)]
    lat: list[float] = []

    async def calls(key: Any, n: int) -> None:
        for _ in range(n):
            t = time.perf_counter()
            await key.call("incr")
            lat.append((time.perf_counter() - t) * 1000)

    async with engine.worker():
        async with anyio.create_task_group() as tg:  # warm-up: each key's actor activates
            for key in handles:
                tg.start_soon(calls, key, 1)
        lat.clear()
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for key in handles:
                tg.start_soon(calls, key, per_key)
        elapsed = time.perf_counter() - t0
        states = [await key.state() for key in handles]
        committer = engine.store.committer
    await engine.close()
    wrong = [s for s in states if s.get("count") != per_key + 1]
    if wrong:
        raise RuntimeError(f"w4_keys: {len(wrong)} counters not {per_key + 1}, e.g. {wrong[:3]}")
    rate = keys * per_key / elapsed
    emit(
        "w4_keys",
        worker=WORKER,
        keys=keys,
        calls_per_key=per_key,
        warmup_per_key=1,
        in_flight=keys,
        seconds=round(elapsed, 3),
        calls_per_s=round(rate),
        p50_ms=pct(lat, 0.5),
        p99_ms=pct(lat, 0.99),
        counters_ok=keys,
        floor_parallel_calls_per_s=round(fl["parallel"]),
        ratio_to_floor=round(rate / fl["parallel"], 2),
        group_commits=committer.batches,
        records_in_group_commits=committer.batched,
    )


def table() -> None:
    print()
    print(f"{'benchmark':<15} {'figure':<76} goal")
    for row in RESULTS:
        name = row["bench"]
        goal = ""
        if name == "floor":
            fig = (
                f"publish p50 {row['publish_p50_ms']} ms; path {row['path_ms']} ms = "
                f"{row['path_calls_per_s']} calls/s (all writes {row['call_ms']} ms)"
            )
        elif name == "floor_parallel":
            fig = f"{row['calls_per_s']} calls/s ({row['keys']} keys at once)"
        elif name in ("w4", "w4_process"):
            fig = (
                f"{row['calls_per_s']} calls/s = {row['ratio_to_floor']}x path floor, "
                f"p50 {row['p50_ms']} ms = {row['ratio_p50_to_floor']}x path"
            )
            goal = ">= 1000 calls/s"
        else:
            fig = f"{row['calls_per_s']} calls/s = {row['ratio_to_floor']}x parallel floor"
        print(f"{name:<15} {fig:<76} {goal}")
    print(f"worker: {WORKER}")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            fl = await floor(server.url, args.calls, args.keys, args.per_key)
            await w4(server.url, fl, args.calls, args.warmup)
            await w4(server.url, fl, args.calls, args.warmup, separate=True)
            await w4_keys(server.url, fl, args.keys, args.per_key)
        finally:
            server.stop()
    table()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.objects")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--per-key", type=int, default=20)
    # invocation logs are not what is measured: keep warnings and errors only
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    anyio.run(main, parser.parse_args())
