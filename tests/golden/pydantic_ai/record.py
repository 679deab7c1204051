"""Record the adapter's golden journal: ``python -m tests.golden.pydantic_ai.record``
(not a test). Runs ``agents.py``'s workflow with the real engine and a worker on a
nats-server of its own and writes the journal as stored to ``support.jsonl``. Only for a
new recording: the file is what a released version wrote, and must keep replaying."""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio

import fusee
from fusee.adapters.jetstream.server import EmbeddedServer
from fusee.runtime.ids import escape
from tests.golden.pydantic_ai import agents

HERE = Path(__file__).parent


async def _record(url: str) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    async with (
        await fusee.connect(url, namespace="golden", partitions=1) as engine,
        engine.worker(registry=agents.REGISTRY),
    ):
        with anyio.fail_after(60):
            for run_id, (name, arg) in agents.RUNS.items():
                print(run_id, "->", await (await engine.start(name, run_id, arg)).result())
                out[run_id] = [m.data for m in await engine.store.read_journal(escape(run_id))]
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            journals = anyio.run(_record, server.url)
        finally:
            server.stop()
    for name, records in journals.items():
        (HERE / f"{name}.jsonl").write_bytes(b"".join(r + b"\n" for r in records))
        print(f"wrote {HERE / name}.jsonl ({len(records)} records)")


if __name__ == "__main__":
    main()
