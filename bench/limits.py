"""Limits: ``python -m bench.limits [--only cost,rate]``.

- ``cost``: what a limit costs a step that does not have to wait. One in-process
  worker, runs of ``steps`` no-op steps, with ``limit=`` (a limit with room to spare:
  concurrent=1000, no rate) and without, alternating, each timed run with the floor (a
  block of fenced publishes) measured right before it. Prints ms a step and the ratio
  to that floor for both, the difference in floors (how many fsync'd writes' worth
  a limit adds), and the messages the journal stream stored a step (its last sequence
  before and after each run: every durable write, the limit's included).
- ``rate``: ``--runs`` (1,000) runs of one step sharing ``per_second=100`` on 2 worker
  processes, under 3 fairness keys flooding unevenly (half the runs on ``a``, then 30 %
  on ``b``, then 20 % on ``c``, started in that order). Each step returns the time its
  attempt began. Prints the achieved rate beyond the burst ((runs - burst) / the span of the starts) (goal: within 5 % of
  100/s), and each key's share of the attempts begun while all three keys still had
  runs waiting (goal: a third each, within 10 %), beside the floor measured first.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio

import fusee
from bench.__main__ import NEAR, Floor, spawn_worker
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


async def cost(url: str, steps: int, repeats: int) -> None:
    engine = await fusee.connect(url, namespace="lim")
    await engine.limit("bench", concurrent=1000)
    probe = await Floor.open(url, "FLOOR_LIM")
    ms: dict[str, list[float]] = {"plain": [], "limited": []}
    floors: dict[str, list[float]] = {"plain": [], "limited": []}
    writes: dict[str, list[float]] = {"plain": [], "limited": []}
    stream = engine.store.layout.stream
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
    out: dict[str, object] = {"bench": "limit_cost"}
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
    print(json.dumps(out), flush=True)


KEYS = (("a", 0.5), ("b", 0.3), ("c", 0.2))  # started in this order


async def rate(url: str, runs: int, per_second: float, workers: int) -> None:
    ns = "limrate"
    engine = await fusee.connect(url, namespace=ns)
    probe = await Floor.open(url, "FLOOR_RATE")
    floor_ms = statistics.median(await probe.block(NEAR))
    await probe.close()
    await engine.limit("shared", per_second=per_second)  # burst: one second's worth
    procs = [spawn_worker(url, ns) for _ in range(workers)]
    for proc in procs:  # their log lines must not fill the pipe and stop them
        assert proc.stdout is not None
        threading.Thread(target=proc.stdout.read, daemon=True).start()
    try:
        args = [
            {"limit": "shared", "key": key}
            for key, share in KEYS
            for _ in range(round(runs * share))
        ]
        limiter = anyio.CapacityLimiter(64)
        handles: list[fusee.Run] = []
        began = time.time()

        async def start(i: int, arg: dict[str, str]) -> None:
            async with limiter:
                handles.append(await engine.start("bench.limited", f"rate-{i}", arg))

        async with anyio.create_task_group() as tg:
            for i, arg in enumerate(args):
                tg.start_soon(start, i, arg)
        started_s = time.time() - began
        results: list[Any] = []

        async def result(run: fusee.Run) -> None:
            async with limiter:
                results.append(await run.result(timeout=600))

        async with anyio.create_task_group() as tg:
            for run in handles:
                tg.start_soon(result, run)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait()
        await engine.close()
    times = sorted(t for _, t in results)
    # the bucket allows at most burst + per_second * span grants over a span: the rate
    # achieved is what came beyond the burst over the whole span
    burst = round(per_second)
    steady = (len(times) - burst) / (times[-1] - times[0])
    by_key: dict[str, list[float]] = {}
    for key, t in results:
        by_key.setdefault(key, []).append(t)
    # all three keys backlogged: from the first attempt of the last key to start to
    # the last attempt of the first key to run out
    lo = max(min(ts) for ts in by_key.values())
    hi = min(max(ts) for ts in by_key.values())
    inside = {k: sum(lo <= t <= hi for t in ts) for k, ts in by_key.items()}
    total = sum(inside.values())
    shares = {k: round(n / total, 3) for k, n in sorted(inside.items())}
    worst = max(abs(sh * len(shares) - 1) for sh in shares.values())
    print(
        json.dumps(
            {
                "bench": "limit_rate",
                "runs": len(results),
                "workers": workers,
                "per_second": per_second,
                "seconds_to_start_all": round(started_s, 2),
                "achieved_per_s_beyond_burst": round(steady, 1),
                "off_the_limit": round(steady / per_second - 1, 3),
                "backlogged_s": round(hi - lo, 2),
                "shares_all_backlogged": shares,
                "worst_share_off_a_third": round(worst, 3),
                "floor_p50_ms": round(floor_ms, 3),
                "floor_publishes_per_s": round(1000 / floor_ms, 1),
            }
        ),
        flush=True,
    )


async def main(only: set[str], a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            if "cost" in only:
                await cost(server.url, a.steps, a.repeats)
            if "rate" in only:
                await rate(server.url, a.runs, a.per_second, a.workers)
        finally:
            server.stop()


if __name__ == "__main__":
    import structlog

    parser = argparse.ArgumentParser(prog="python -m bench.limits")
    parser.add_argument("--only", default="cost,rate")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--per-second", type=float, default=100.0)
    parser.add_argument("--workers", type=int, default=2)
    a = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    anyio.run(main, set(a.only.split(",")), a)
