"""The least a durable call and a durable signal can cost on this machine, without fusee.

    python -m bench.minimums [rounds] [calls]

Issue 11 asks W4 (sequential calls to one key) for >= 1,000 calls/s and W3 (signal sent
-> result received) for <= 3x the floor. Whatever fusee does, a call's result must be
stored before its caller sees it (else a crash after the reply loses what the caller
was told), and so must a signal before its sender is answered. This probe times, with
nats-py alone on one embedded server (``sync_interval: always``), the shortest path any
design on this server could take for each, with nothing of fusee on it:

- ``publish``: fenced, fsync'd publishes one after another on one connection: a call
  that is nothing but its one durable write, with no hop to a worker at all.
- ``call``: a core NATS request to a responder (its own connection, in this process
  and in a process of its own), which makes one fenced fsync'd append (the call's
  record, with its result) and replies: a call handed in memory to the key's actor and
  journaled with its result in one write, the design issue 11 names. The bound for W4.
- ``signal``: after 50 ms idle (as ``bench w3`` idles before it signals), the same
  request and append, timed to the moment an ordered consumer on the journal subject
  (the result's watch) receives the record: a signal handed in memory to the waiting
  run and journaled with its end in one write. Divided by the warm floor measured
  right before (a block of 50 publishes' p50, as ``bench w3`` does). The bound for W3.

Rounds rotate so drift on a shared machine falls on each. Figures, never asserted.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from fusee.adapters.jetstream.server import EmbeddedServer

STREAM, SUBJECTS = "MINIMUMS", ["min.>"]


class Appender:
    """One key's journal: fenced appends, as an actor's commit makes them."""

    def __init__(self, nc: Client, key: str) -> None:
        self.js, self.key, self.last = nc.jetstream(), key, 0

    async def append(self, data: bytes) -> None:
        ack = await self.js.publish(
            f"min.run.{self.key}.j",
            data,
            headers={
                "Nats-Expected-Last-Subject-Sequence": str(self.last),
                "Nats-Expected-Last-Subject-Sequence-Subject": f"min.run.{self.key}.>",
            },
        )
        self.last = ack.seq


async def respond(url: str, subject: str, key: str) -> Client:
    """A responder that appends each request to ``key``'s journal, then replies."""
    nc = await nats.connect(url)
    journal = Appender(nc, key)

    async def handle(msg: Msg) -> None:
        await journal.append(msg.data)
        await msg.respond(b"ok")

    await nc.subscribe(subject, cb=handle)
    await nc.flush()
    return nc


async def timed(n: int, op: Callable[[int], Awaitable[Any]]) -> tuple[float, float]:
    """``n`` calls of ``op`` one after another: (per second, p50 ms)."""
    lat = []
    t0 = time.perf_counter()
    for i in range(n):
        a = time.perf_counter()
        await op(i)
        lat.append(time.perf_counter() - a)
    return n / (time.perf_counter() - t0), statistics.median(lat) * 1000


async def publishes(url: str, n: int) -> dict[str, float]:
    nc = await nats.connect(url)
    journal = Appender(nc, f"p{time.time_ns()}")
    await timed(50, lambda i: journal.append(b"warm"))
    rate, p50 = await timed(n, lambda i: journal.append(b'{"kind":"obj.done","result":%d}' % i))
    await nc.close()
    return {"per_s": rate, "p50_ms": p50}


async def calls(url: str, n: int, own_process: bool) -> dict[str, float]:
    subject, key = f"min.call.{time.time_ns()}", f"c{time.time_ns()}"
    proc: subprocess.Popen[str] | None = None
    responder: Client | None = None
    if own_process:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.minimums", "--respond", url, subject, key],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        proc.stdout.readline()  # "ready": subscribed and flushed
    else:
        responder = await respond(url, subject, key)
    nc = await nats.connect(url)
    try:
        await timed(50, lambda i: nc.request(subject, b"warm", timeout=5))
        rate, p50 = await timed(n, lambda i: nc.request(subject, b"%d" % i, timeout=5))
    finally:
        await nc.close()
        if responder is not None:
            await responder.close()
        if proc is not None:
            proc.kill()
            proc.wait()
    return {"per_s": rate, "p50_ms": p50}


async def signals(url: str, repeats: int) -> dict[str, float]:
    subject, key = f"min.signal.{time.time_ns()}", f"s{time.time_ns()}"
    responder = await respond(url, subject, key)
    nc = await nats.connect(url)
    js = nc.jetstream()
    floor = Appender(nc, f"f{time.time_ns()}")
    seen: list[float] = []
    arrived = anyio.Event()

    async def watch(msg: Msg) -> None:
        seen.append(time.perf_counter())
        arrived.set()

    sub = await js.subscribe(
        f"min.run.{key}.j", cb=watch, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW
    )
    ratios, totals, warm = [], [], []
    try:
        for r in range(repeats):
            block = []
            for _ in range(50):
                a = time.perf_counter()
                await floor.append(b"floor")
                block.append(time.perf_counter() - a)
            warm.append(statistics.median(block))
            await anyio.sleep(0.05)  # the idle before a signal, as bench w3's
            arrived = anyio.Event()
            t0 = time.perf_counter()
            await nc.request(subject, b"go %d" % r, timeout=5)
            await arrived.wait()
            totals.append(seen[-1] - t0)
            ratios.append(totals[-1] / warm[-1])
    finally:
        await sub.unsubscribe()
        await nc.close()
        await responder.close()
    return {
        "to_watch_ms": statistics.median(totals) * 1000,
        "warm_floor_ms": statistics.median(warm) * 1000,
        "ratio_to_warm_floor": statistics.median(ratios),
    }


async def main(rounds: int, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            nc = await nats.connect(server.url)
            await nc.jetstream().add_stream(
                name=STREAM, subjects=SUBJECTS, allow_direct=True, duplicate_window=120.0
            )
            await nc.close()
            rows: dict[str, list[dict[str, float]]] = {}
            for r in range(rounds):
                order: list[tuple[str, Callable[[], Awaitable[dict[str, float]]]]] = [
                    ("publish", lambda: publishes(server.url, n)),
                    ("call", lambda: calls(server.url, n, own_process=False)),
                    ("call_process", lambda: calls(server.url, n, own_process=True)),
                    ("signal", lambda: signals(server.url, max(10, n // 40))),
                ]
                shift = r % len(order)
                for name, run in order[shift:] + order[:shift]:
                    row = {k: round(v, 3) for k, v in (await run()).items()}
                    rows.setdefault(name, []).append(row)
                    print(json.dumps({"bench": f"minimum_{name}", "round": r, **row}), flush=True)
        finally:
            server.stop()
    print()
    for name, found in rows.items():
        for field in found[0]:
            values = [row[field] for row in found]
            print(f"{name:13} {field:20} {min(values):9.3f} .. {max(values):9.3f}")


def _respond_forever(url: str, subject: str, key: str) -> None:
    async def serve() -> None:
        await respond(url, subject, key)
        print("ready", flush=True)
        await anyio.sleep_forever()

    anyio.run(serve)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--respond"]:
        _respond_forever(*sys.argv[2:5])
    else:
        rounds, n = ([int(a) for a in sys.argv[1:3]] + [3, 1000][len(sys.argv[1:3]) :])[:2]
        anyio.run(main, rounds, n)
