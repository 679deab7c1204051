"""What a limit costs a step that does not have to wait: ``python -m bench.limits``.

One in-process worker, runs of ``steps`` no-op steps, with ``limit=`` (a limit with
room to spare: concurrent=1000, no rate) and without, alternating, each timed run with
the floor (a block of fenced publishes) measured right before it. Prints ms a step and
the ratio to that floor for both, the difference in floors (how many fsync'd
writes' worth a limit adds), and the messages the journal stream stored a step (its
last sequence before and after each run: every durable write, the limit's included)."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import anyio

import fusee
from bench.__main__ import NEAR, Floor
from fusee.adapters.jetstream.server import EmbeddedServer


@fusee.workflow("bench_limited")
async def limited(ctx: fusee.Context, steps: int) -> int:
    for i in range(steps):
        await ctx.step(f"s{i}", _noop, limit="bench")
    return steps


@fusee.workflow("bench_plain")
async def plain(ctx: fusee.Context, steps: int) -> int:
    for i in range(steps):
        await ctx.step(f"s{i}", _noop)
    return steps


async def _noop() -> None:
    return None


async def main(steps: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            engine = await fusee.connect(server.url, namespace="lim")
            await engine.limit("bench", concurrent=1000)
            probe = await Floor.open(server.url, "FLOOR_LIM")
            ms: dict[str, list[float]] = {"plain": [], "limited": []}
            writes: dict[str, list[float]] = {"plain": [], "limited": []}
            stream = engine.store.layout.stream
            floors: dict[str, list[float]] = {"plain": [], "limited": []}
            async with engine.worker():
                for wf in ("bench_plain", "bench_limited"):
                    await (await engine.start(wf, f"warm-{wf}", steps)).result(timeout=120)
                for r in range(repeats):
                    for kind in ("plain", "limited") if r % 2 == 0 else ("limited", "plain"):
                        floors[kind].append(statistics.median(await probe.block(NEAR)))
                        before = (await probe.js.stream_info(stream)).state.last_seq
                        t0 = time.perf_counter()
                        run = await engine.start(f"bench_{kind}", f"{kind}-{r}", steps)
                        await run.result(timeout=120)
                        ms[kind].append((time.perf_counter() - t0) * 1000 / steps)
                        after = (await probe.js.stream_info(stream)).state.last_seq
                        writes[kind].append((after - before) / steps)
            await probe.close()
            await engine.close()
        finally:
            server.stop()
    out: dict[str, object] = {}
    medians: dict[str, float] = {}
    for kind in ms:
        ratios = sorted(t / f for t, f in zip(ms[kind], floors[kind], strict=True))
        out[kind] = {
            "ms_per_step": [round(min(ms[kind]), 3), round(max(ms[kind]), 3)],
            "ratio_to_floor": [round(ratios[0], 2), round(ratios[-1], 2)],
            "ratio_median": round(statistics.median(ratios), 2),
            "stream_writes_per_step": round(statistics.median(writes[kind]), 2),
        }
        medians[kind] = statistics.median(ratios)
    out["extra_floors_per_step"] = round(medians["limited"] - medians["plain"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=4)
    a = parser.parse_args()
    anyio.run(main, a.steps, a.repeats)
