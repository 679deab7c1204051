# ruff: noqa: T201, TID251, I001
"""Repro (review rev-clinats): the CLIENT role may publish and subscribe on
``_fusee.<ns>.>`` (nats/accounts.conf), so it can pose as workers: heartbeats on
``_fusee.fusee.hb.<id>`` and answers to ``_fusee.fusee.ping.<id>``. The real worker
(worker role) then gives the phantoms their share of the partitions and releases them;
nobody claims them, and the runs there never run. Run from the worktree root:

    PYTHONPATH=src:. /work/main/.venv/bin/python review/rev-clinats/client_phantom_workers.py

Prints how many of 8 runs finished within 15 s with 15 phantom workers; exit 1 if some
did not (defect reproduced). GHOSTS=0: the control (8/8).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import anyio
import nats

import fusee
from fusee.adapters.jetstream.server import EmbeddedServer
from tests.helpers import registry_of

ROOT = Path(__file__).resolve().parents[2]
PW = {
    "FUSEE_ADMIN_PASS": "a",
    "FUSEE_WORKER_PASS": "w",
    "FUSEE_CLIENT_PASS": "c",
    "FUSEE_SYS_PASS": "s",
}


async def echo(ctx: fusee.Context, n: int) -> int:
    return int(await ctx.step("s", lambda: n))


async def main() -> int:
    store = Path(tempfile.mkdtemp())
    shutil.copy(ROOT / "nats" / "accounts.conf", store / "accounts.conf")
    server = EmbeddedServer.start(store, extra_config="include ./accounts.conf", env=PW)
    try:
        admin = await fusee.connect(server.url, namespace="fusee", user="fusee_admin", password="a")
        await admin.close()
        nc = await nats.connect(server.url, user="fusee_client", password="c")
        ghosts = [f"ghost-{i}" for i in range(int(os.environ.get("GHOSTS", "15")))]

        async def pong(msg: nats.aio.msg.Msg) -> None:
            await msg.respond(json.dumps({"serves": []}).encode())

        for g in ghosts:
            await nc.subscribe(f"_fusee.fusee.ping.{g}", cb=pong)

        async def beat() -> None:
            while True:
                for g in ghosts:
                    body = {"id": g, "partitions": [], "bye": False, "serves": []}
                    await nc.publish(f"_fusee.fusee.hb.{g}", json.dumps(body).encode())
                await asyncio.sleep(0.2)

        beating = asyncio.create_task(beat())
        eng = await fusee.connect(server.url, namespace="fusee", user="fusee_worker", password="w")
        done = 0
        async with eng, eng.worker(registry=registry_of(echo, "echo")):
            await asyncio.sleep(2)  # a repro script: let the balance see the phantoms
            runs = [await eng.start("echo", f"r{i}", i) for i in range(8)]
            for r in runs:
                with anyio.move_on_after(15 / len(runs)):
                    await r.result()
                    done += 1
        beating.cancel()
        await nc.close()
        print(
            f"{done}/8 runs finished with {len(ghosts)} phantom workers posted by the client role"
        )
        return 0 if done == 8 else 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
