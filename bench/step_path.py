"""Where a W1 step's time goes: ``python -m bench.step_path [rounds]``.

The in-process worker runs W1's workflow (100 no-op steps a run) while a clock
(``time.perf_counter_ns``) is read at each hop of a step, and the floor's loop (a fenced
publish with ``js.publish``) is timed at the same hops, in the same process and run. The
clocks are patched in here, for the run of this script only: nothing of it is in the
step path. A step, from its function's start to the next step's function's start:

    call -> called        the step's function (a no-op coroutine)
    called -> commit      the result encoded, the record made
    commit -> publish     ActorCore.commit, NatsStore.append, the committer, the retry wrapper
    publish -> write      the client's publish: headers, the reply future, the flusher task
    write -> ack          the server stores it (fsync), the reply is read
    ack -> published      the reply handed to the caller's future, decoded
    published -> committed  the history fed, the fence moved
    committed -> call     logged, the workflow's next ctx.step, the replay decision

Each figure is the median over the steps of a round (µs); each round prints one line,
with ``cpu_us_over_floor``: this process's CPU time a step less a floor publish's.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import structlog
from nats.aio.client import Client
from nats.js.client import JetStreamContext

import bench.workflows as wfs
import fusee
import fusee.actors.steps as steps
import fusee.adapters.jetstream.store as store
from bench.__main__ import Floor
from bench.clocks import EVENTS, ON, around, time_socket_writes
from fusee.actors.core import ActorCore
from fusee.adapters.jetstream.server import EmbeddedServer


def _patch() -> None:
    time_socket_writes()
    around(Client, "_process_msg", "ack", None)  # a message read off the socket
    around(JetStreamContext, "publish", "publish", "published")  # the floor's
    if hasattr(store, "publish_acked"):  # fusee's own publish (an earlier fusee's
        around(store, "publish_acked", "publish", "published")  # is js.publish)
    around(steps, "_call", "call", "called")
    around(ActorCore, "commit", "commit", "committed")


def _hops(names: list[str]) -> dict[str, float]:
    """Median µs between consecutive ``names``, over each cycle that has them all in order."""
    spans: dict[str, list[float]] = {f"{a} -> {b}": [] for a, b in itertools.pairwise(names)}
    seen = [e for e in EVENTS if e[0] in names]
    i = 0
    while i < len(seen):
        chunk = seen[i : i + len(names)]
        if [name for name, _ in chunk] == names:
            for (a, ta), (b, tb) in itertools.pairwise(chunk):
                spans[f"{a} -> {b}"].append((tb - ta) / 1000)
            i += len(names) - 1
        else:
            i += 1
    return {k: round(statistics.median(v), 1) for k, v in spans.items() if v}


STEP = ["call", "called", "commit", "publish", "write", "ack", "published", "committed", "call"]
FLOOR = ["publish", "write", "ack", "published"]


async def main(url: str, rounds: int) -> None:
    engine = await fusee.connect(url, namespace="w1")
    floor = await Floor.open(url, "FLOOR_HOPS")
    # The floor's publishes on a 2x2: the floor's own connection or the worker's, the
    # bare stream or the namespace's stream (a journal subject of its own), to tell a
    # difference the stream makes from one the worker's connection makes.
    blocks = {
        "floor": floor,
        "floor_on_worker_conn": Floor(engine.store.nc, "FLOOR_HOPS", prefix="floor_hops.w"),
        "ns_stream": Floor(floor.nc, "W1", prefix="w1.run.own"),
        "ns_stream_on_worker_conn": Floor(engine.store.nc, "W1", prefix="w1.run.worker"),
    }
    async with engine.worker():
        warm = await engine.start(wfs.noop_steps, "warm", 100)
        await warm.result(timeout=60)
        for r in range(rounds):
            row: dict[str, Any] = {"round": r}
            for name, block in blocks.items():
                EVENTS.clear()
                ON[0] = True
                await block.block(500)
                ON[0] = False
                row[name] = _hops(FLOOR)
            EVENTS.clear()
            ON[0] = True
            for i in range(5):
                run = await engine.start(wfs.noop_steps, f"r{r}-{i}", 100)
                await run.result(timeout=60)
            ON[0] = False
            row["step"] = _hops(STEP)
            # CPU time of this process (worker, client, nats-py) a step, less a floor
            # publish's, clocks off (their wrappers stay: well under 1 µs each)
            began = time.process_time()
            await floor.block(500)
            publish = (time.process_time() - began) / 500
            began = time.process_time()
            for i in range(5):
                run = await engine.start(wfs.noop_steps, f"r{r}-cpu{i}", 100)
                await run.result(timeout=60)
            step = (time.process_time() - began) / 500
            row["cpu_us_over_floor"] = round((step - publish) * 1e6, 1)
            print(json.dumps(row), flush=True)
    await engine.close()
    await floor.close()


if __name__ == "__main__":
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    _patch()
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            anyio.run(main, server.url, int(sys.argv[1]) if len(sys.argv) > 1 else 3)
        finally:
            server.stop()
