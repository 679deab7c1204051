"""Where W3's time goes (signal sent -> result received):

    python -m bench.signal_path [rounds] [--parked]


The in-process worker runs W3's workflow (one ``ctx.wait_for("go")``, then return), the
client signals it and waits for its result, while a clock (``time.perf_counter_ns``) is
read at each hop along the path (``--parked``: the run has left memory first, and
the signal brings it back by replay). The clocks are patched in here, for the run of this
script only: nothing of it is in the path. Each run prints nothing; at the end, each
event's median time after ``signal()`` was called (µs), in the order they happen, and
how often it was seen (an event seen in fewer rounds than ``n`` happens only sometimes).
The floor (one fenced publish, p50) is measured in the same run, before and after.

Events: ``sig.pub``/``sig.acked`` the client's guarded publish of the signal,
``wake.sent`` the client's core wake hint; ``w.inbox`` the worker's inbox consumer
callback, ``w.wake`` its wake hint callback, ``w.ensure`` the wake loop handing the
message to the actor, ``a.read``/``a.read.done`` the actor reading its inbox,
``a.resolve`` the wait taking the signal, ``a.commit``/``a.committed`` the commit of
``run.completed``, ``pub``/``pub.acked`` its publish, ``watch`` the result watch's
callback with the end record, ``result`` the client's ``result()`` returning,
``write``/``recv:<what>`` the socket writes and the messages read off the socket.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog
from nats.aio.client import Client

import bench.workflows as wfs
import fusee
import fusee.adapters.jetstream.commit as commit
import fusee.adapters.jetstream.direct as direct
import fusee.adapters.jetstream.store as store
from bench.__main__ import Floor
from bench.clocks import EVENTS, ON, around, around_sync, tag, time_socket_writes
from fusee.actors.core import ActorCore
from fusee.actors.run_actor import RunActor
from fusee.actors.worker import Worker
from fusee.adapters.jetstream.server import EmbeddedServer
from fusee.adapters.jetstream.watch import JournalWatch
from fusee.runtime.history import History


def _what(raw: bytes) -> str:
    subject = raw.decode()
    if ".in." in subject:
        return "inbox"
    if subject.endswith(".end"):
        return "end"
    if ".wake." in subject:
        return "wake"
    if subject.startswith("_INBOX"):
        return "reply"
    return subject.split(".", 1)[0]


def _patch() -> None:
    time_socket_writes()
    process: Callable[..., Any] = Client._process_msg

    async def timed_process(self: Any, sid: int, subject: bytes, *args: Any, **kw: Any) -> Any:
        tag(f"recv:{_what(subject)}")
        return await process(self, sid, subject, *args, **kw)

    setattr(Client, "_process_msg", timed_process)  # noqa: B010 - a method
    around(store.NatsStore, "_publish_inbox", "sig.pub", "sig.acked")
    around(store.NatsStore, "wake", "wake.sent", None)
    for module in (store, commit, direct):
        if hasattr(module, "publish_acked"):
            around(module, "publish_acked", "pub", "pub.acked")
    around(Worker, "_on_inbox", "w.inbox", None)
    around(Worker, "_on_wake", "w.wake", None)
    around_sync(Worker, "_ensure_actor", "w.ensure")
    around(RunActor, "_read_inbox", "a.read", "a.read.done")
    around_sync(History, "resolve", "a.resolve")
    around(ActorCore, "commit", "a.commit", "a.committed")
    around(ActorCore, "wait_out", "a.wait", "a.wait.done")
    around(RunActor, "_end", "a.end", None)
    around(RunActor, "_project", "a.project", "a.projected")
    around(RunActor, "_load", "a.load", "a.loaded")
    around(RunActor, "_execute", "a.execute", None)
    around(JournalWatch, "_on_msg", "watch", "watch.done")
    around(JournalWatch, "next", "watch.next", "watch.next.done")
    around(fusee.Run, "_wait_end", "c.wait_end", "c.wait_end.done")


def _timeline(rounds: list[list[tuple[str, int]]]) -> list[tuple[str, float, int]]:
    """Each (event, its k-th occurrence)'s median µs after the round's start, in order."""
    at: dict[str, list[float]] = defaultdict(list)
    for events in rounds:
        t0 = events[0][1]
        seen: dict[str, int] = defaultdict(int)
        for name, t in events[1:]:
            seen[name] += 1
            key = name if seen[name] == 1 else f"{name}#{seen[name]}"
            at[key].append((t - t0) / 1000)
    rows = [(k, round(statistics.median(v), 1), len(v)) for k, v in at.items()]
    return sorted(rows, key=lambda r: r[1])


async def main(url: str, n: int, parked: bool) -> None:
    engine = await fusee.connect(url, namespace="w3p")
    floor = await Floor.open(url, "FLOOR_SIG")
    before = statistics.median(await floor.block(500))
    rounds: list[list[tuple[str, int]]] = []
    totals: list[float] = []
    async with engine.worker() as worker:
        for r in range(n):
            run = await engine.start(wfs.wait_for_go, f"w3p-{time.time_ns()}-{r}", None)
            while not any(type(rec).__name__ == "WaitStarted" for _, rec in await run.journal()):
                await anyio.sleep(0.005)
            while parked and run.run_id not in worker.parked:
                await anyio.sleep(0.05)
            done = anyio.Event()

            async def wait(run: fusee.Run = run, done: anyio.Event = done) -> None:
                await run.result(timeout=30)
                tag("result")
                done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await anyio.sleep(0.05)  # the result() waiter is registered
                EVENTS.clear()
                ON[0] = True
                tag("signal")
                await run.signal("go", r)
                tag("signal.returned")
                await done.wait()
                await anyio.sleep(0.01)  # what the worker does after the end
                ON[0] = False
            events = list(EVENTS)
            rounds.append(events)
            ends = [t for name, t in events if name == "result"]
            totals.append((ends[0] - events[0][1]) / 1e6)
    after = statistics.median(await floor.block(500))
    # the floor as W3 meets it: one publish after the machine idled as long as W3's
    # signal does (the 50 ms the waiter is given to register)
    cold: list[float] = []
    for _ in range(n):
        await anyio.sleep(0.05)
        cold.extend(await floor.block(1))
    await engine.close()
    await floor.close()
    floor_ms = (before + after) / 2
    for name, us, count in _timeline(rounds):
        print(f"{us:9.1f} µs  {name:<20} ({count}/{n})")
    w3 = statistics.median(totals)
    print(
        json.dumps(
            {
                "bench": "signal_path",
                "rounds": n,
                "w3_ms_median": round(w3, 3),
                "floor_p50_ms": [round(before, 3), round(after, 3)],
                "ratio_to_floor": round(w3 / floor_ms, 2),
                "cold_floor_p50_ms": round(statistics.median(cold), 3),
                "ratio_to_cold_floor": round(w3 / statistics.median(cold), 2),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    _patch()
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 40
            anyio.run(main, server.url, rounds, "--parked" in sys.argv)
        finally:
            server.stop()
