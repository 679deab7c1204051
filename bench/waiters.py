"""Many concurrent ``Run.result()`` waiters: no error, no server consumer per waiter.

    python -m bench.waiters [N]   (default 5,000)

A fresh embedded nats-server; a worker in its own process runs N ``bench.wait`` runs,
each parked on a signal; this process waits for all N results at once, then signals
every run. Printed: the stream's consumer count before, while all N wait, and right
after the last result; how long the waiters took to register and the results to come.
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
from pathlib import Path

import anyio
import structlog

import bench.workflows as wfs
import fusee
from bench.__main__ import spawn_worker
from fusee.adapters.jetstream.server import EmbeddedServer


async def consumers(engine: fusee.Engine) -> int:
    await engine.store.journal_watch.settled()  # the last waiter's delete, in the background
    info = await engine.store.js.stream_info(engine.store.layout.stream)
    return int(info.state.consumer_count)


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = await EmbeddedServer.astart(Path(tmp))
        worker = None
        try:
            engine = await fusee.connect(server.url, namespace="waiters")
            worker = await anyio.to_thread.run_sync(spawn_worker, server.url, "waiters")
            runs = [await engine.start(wfs.wait_for_go, f"w{i}") for i in range(n)]
            baseline = await consumers(engine)
            watch = engine.store.journal_watch
            errors: list[str] = []
            done = 0

            async def wait(run: fusee.Run) -> None:
                nonlocal done
                try:
                    assert await run.result(timeout="5m") == "1"
                    done += 1
                except Exception as exc:  # noqa: BLE001 - counted and shown
                    errors.append(repr(exc))

            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for run in runs:
                    tg.start_soon(wait, run)
                while watch.waiting < n:
                    await anyio.sleep(0.01)
                registered = time.perf_counter() - t0
                during = await consumers(engine)
                t1 = time.perf_counter()
                async with anyio.create_task_group() as signals:
                    limit = anyio.CapacityLimiter(64)

                    async def go(run: fusee.Run) -> None:
                        async with limit:
                            await run.signal("go", 1)

                    for run in runs:
                        signals.start_soon(go, run)
                signalled = time.perf_counter() - t1
            results = time.perf_counter() - t1
            after = await consumers(engine)
            print(
                json.dumps(
                    {
                        "bench": "waiters",
                        "waiters": n,
                        "ok": done,
                        "errors": len(errors),
                        "first_error": errors[0] if errors else None,
                        "consumers_baseline": baseline,
                        "consumers_while_waiting": during,
                        "consumers_right_after": after,
                        "watch_consumers_made": watch.consumers_made,
                        "s_to_register_all": round(registered, 2),
                        "s_to_signal_all": round(signalled, 2),
                        "s_from_first_signal_to_last_result": round(results, 2),
                    }
                ),
                flush=True,
            )
            await engine.close()
        finally:
            if worker is not None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(timeout=30)
            await server.astop()


if __name__ == "__main__":
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 5_000)
