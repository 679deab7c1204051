"""The floor on fusee's own stream against the bare ``FLOOR`` stream, in one run.

    python -m bench.floors [rounds]

W1 is measured against ``bench.__main__.floor``: a fenced publish with a Msg-Id to a
fresh stream holding nothing but ``floor.>``. A step commit goes to the namespace's
stream instead, made by ``NatsStore.ensure_layout`` (two subject filters,
``allow_atomic``, message schedules, per-message TTL, deny delete and purge), with the
consumers fusee keeps on it (each worker's ordered inbox consumer on ``<ns>.in.>``, the
journal watch on ``<ns>.run.*.end``) and, in a deployment, many subjects. This probe
publishes the same fenced message to each configuration in turn (blocks of ``n``
publishes, the configurations rotating each round, so drift on a shared machine falls
on all of them), on one embedded server with ``sync_interval: always``, and prints the
p50 of each beside the bare stream's: whatever is left between the two is server-side.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig

from fusee.adapters.jetstream.server import EmbeddedServer


@dataclass
class Config:
    name: str
    stream: dict[str, Any]  # StreamConfig fields besides name and subjects
    fusee_subjects: bool = True  # <ns>.run.> and <ns>.in.>, else floor.>
    consumers: bool = False  # an ordered inbox consumer and the journal watch
    subjects: int = 0  # other run journals stored before (one message each)


FUSEE = {
    "storage": StorageType.FILE,
    "allow_direct": True,
    "allow_atomic": True,
    "allow_msg_schedules": True,
    "allow_msg_ttl": True,
    "allow_rollup_hdrs": True,
    "deny_delete": True,
    "deny_purge": False,  # as the journal stream (and as 2.15 stored it before)
    "duplicate_window": 120.0,
}

CONFIGS = [
    Config("bare FLOOR", {"allow_direct": True}, fusee_subjects=False),
    Config("bare, 2 subject filters", {"allow_direct": True}),
    Config("fusee stream", FUSEE),
    Config("fusee, no schedules", {**FUSEE, "allow_msg_schedules": False}),
    Config("fusee, no atomic", {**FUSEE, "allow_atomic": False}),
    Config("fusee, no ttl", {**FUSEE, "allow_msg_ttl": False}),
    Config("fusee + consumers", FUSEE, consumers=True),
    Config("fusee + consumers + 10k subjects", FUSEE, consumers=True, subjects=10_000),
]


class Target:
    def __init__(self, js: JetStreamContext, nc: Client, i: int, config: Config) -> None:
        self.js, self.nc, self.config = js, nc, config
        self.ns = f"p{i}"
        self.stream = self.ns.upper()
        self.root = f"{self.ns}.run" if config.fusee_subjects else f"{self.ns}.floor"
        self.last = 0
        self.n = 0
        self.lat: list[float] = []
        self.subs: list[Any] = []

    async def setup(self) -> None:
        c = self.config
        subjects = (
            [f"{self.ns}.run.>", f"{self.ns}.in.>"] if c.fusee_subjects else [f"{self.root}.>"]
        )
        await self.js.add_stream(StreamConfig(name=self.stream, subjects=subjects, **c.stream))
        for k in range(c.subjects):
            await self.nc.publish(f"{self.root}.other{k}.j", b"{}")
        if c.subjects:
            await self.nc.flush()
            while (await self.js.stream_info(self.stream)).state.messages < c.subjects:
                await anyio.sleep(0.05)
        if c.consumers:

            async def drop(_msg: Any) -> None:
                return None

            self.subs.append(
                await self.js.subscribe(
                    f"{self.ns}.in.>",
                    ordered_consumer=True,
                    cb=drop,
                    stream=self.stream,
                    deliver_policy=DeliverPolicy.NEW,
                )
            )
            inbox = self.nc.new_inbox()
            self.subs.append(await self.nc.subscribe(inbox, cb=drop))
            await self.js.add_consumer(
                self.stream,
                ConsumerConfig(
                    deliver_subject=inbox,
                    filter_subject=f"{self.ns}.run.*.end",
                    deliver_policy=DeliverPolicy.NEW,
                    ack_policy=AckPolicy.NONE,
                    idle_heartbeat=2.0,
                    mem_storage=True,
                    num_replicas=1,
                ),
            )

    async def block(self, n: int) -> None:
        # the shape of a step commit: a fenced publish on the run's .j with a Msg-Id
        subject, tree = f"{self.root}.r1.j", f"{self.root}.r1.>"
        for _ in range(n):
            self.n += 1
            t0 = time.perf_counter()
            ack = await self.js.publish(
                subject,
                b'{"kind":"step.completed","pos":%d,"result":null}' % self.n,
                headers={
                    "Nats-Expected-Last-Subject-Sequence": str(self.last),
                    "Nats-Expected-Last-Subject-Sequence-Subject": tree,
                    "Nats-Msg-Id": f"r1:{self.n}",
                },
            )
            self.lat.append((time.perf_counter() - t0) * 1000)
            self.last = ack.seq


async def probe(url: str, rounds: int, n: int = 300) -> list[dict[str, Any]]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    targets = [Target(js, nc, i, c) for i, c in enumerate(CONFIGS)]
    for t in targets:
        await t.setup()
    for t in targets:  # warm-up, not counted
        await t.block(50)
        t.lat.clear()
    for r in range(rounds):
        shift = r % len(targets)
        for t in targets[shift:] + targets[:shift]:
            await t.block(n)
    await nc.close()
    bare = statistics.median(targets[0].lat)
    rows = []
    for t in targets:
        p50 = statistics.median(t.lat)
        rows.append(
            {
                "config": t.config.name,
                "p50_ms": round(p50, 3),
                "p90_ms": round(sorted(t.lat)[int(len(t.lat) * 0.9)], 3),
                "vs_bare": round(p50 / bare, 3),
                "n": len(t.lat),
            }
        )
    return rows


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            rows = anyio.run(probe, server.url, rounds)
        finally:
            server.stop()
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
