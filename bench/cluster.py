"""W1, W2 and W4 on a 3-node R3 cluster on loopback, beside the R3 floor, in one run;
and a token stream's writer on R3 beside a sequential publish to the same stream.

    python -m bench.cluster [--calls 300]

The cluster is the one the tests start (``tests/cluster.py``: ``nats/cluster-n*.conf``,
``sync_interval: always``, free loopback ports). ``$FUSEE_REPLICAS=3`` is set for the
run, so the namespaces fusee makes and the floors' own streams are all R3, and every
client is given all three URLs. The floor is the same fenced publish as
``python -m bench``'s (``floor``), on an R3 stream: the commit an R3 step pays at least
(the leader's fsync and a follower's, one round trip apart). An R1 stream on the same
cluster is measured too, for what replication adds. W1 and W4 have the floor measured
again right before each timed run (``ratio_to_near_floor``), as in ``python -m bench``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import anyio
import structlog

from bench import objects, streams
from bench.__main__ import RESULTS, Floor, emit, floor, w1, w2

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests.cluster: the loopback cluster of the tests
    sys.path.insert(0, str(ROOT))

from tests.cluster import LoopbackCluster  # noqa: E402


async def r1_floor(url: str, n: int = 1000) -> float:
    """The same fenced publish on an R1 stream of the cluster (one server's fsync)."""
    os.environ["FUSEE_REPLICAS"] = "1"
    try:
        probe = await Floor.open(url, "FLOOR_R1")
    finally:
        os.environ["FUSEE_REPLICAS"] = "3"
    lat = sorted(await probe.block(n))
    await probe.close()
    p50 = statistics.median(lat)
    emit("floor_r1", p50_ms=round(p50, 3), p99_ms=round(lat[int(n * 0.99)], 3), n=n)
    return p50


async def tokens_r3(url: str, n: int = 2000) -> None:
    """A ``TokenWriter`` on the R3 tokens stream: it waits for each chunk's ack (an R3
    leader refuses a second in-flight check of the claim subject, 10164), so its floor
    is a sequential publish to that stream, measured first."""
    from fusee.adapters.jetstream.store import NatsStore

    store = await NatsStore.connect(url.split(","), "bench_tok", replicas=3)
    try:
        await store.ensure_layout()
        p50 = await streams.floor(store, n)
        await streams.new_run(store, "tw")
        rate = await streams.writer(store.tokens, "tw", n, "R3, one chunk in flight")
        emit(
            "tokens_r3", chunks_per_s=round(rate), floor_p50_ms=round(p50, 3),
            ratio_to_floor=round((1000 / rate) / p50, 2),
        )  # fmt: skip
    finally:
        await store.close()


def table() -> None:
    print()
    print(f"{'benchmark':<10} figure")
    for row in RESULTS:
        name = row["bench"]
        if name in ("floor", "floor_r1"):
            kind = "R3" if name == "floor" else "R1"
            fig = f"fenced publish on {kind}: p50 {row['p50_ms']} ms (p99 {row['p99_ms']})"
        elif name == "w1":
            fig = (
                f"{row['ms_per_step_median']} ms/step = {row['ratio_to_near_floor']}x the R3 "
                f"floor (near), spread {row['near_ratio_spread']}"
            )
        elif name == "w2":
            fig = (
                f"{row['steps_per_s']} steps/s (R3 floor {row['floor_commits_per_s']} "
                f"commits/s one after another)"
            )
        elif name == "tokens_r3":
            fig = (
                f"token writer {row['chunks_per_s']} chunks/s = {row['ratio_to_floor']}x a "
                f"sequential publish to the R3 tokens stream (p50 {row['floor_p50_ms']} ms)"
            )
        else:
            continue
        print(f"{name:<10} {fig}")
    for row in objects.RESULTS:
        if row["bench"] in ("w4", "w4_keys"):
            print(
                f"{row['bench']:<10} {row['calls_per_s']} calls/s = {row['ratio_to_floor']}x "
                f"its R3 floor, p50 {row.get('p50_ms')} ms"
            )


async def main(args: argparse.Namespace) -> None:
    os.environ["FUSEE_REPLICAS"] = "3"
    with tempfile.TemporaryDirectory() as tmp:
        cluster = await anyio.to_thread.run_sync(LoopbackCluster.start, Path(tmp))
        try:
            url = cluster.url
            f = await floor(url)
            await r1_floor(url)
            await w1(url, f, repeats=args.repeats)
            await w2(url, f)
            fl = await objects.floor(url, args.calls, args.keys, args.per_key)
            await objects.w4(url, fl, args.calls, 20)
            await objects.w4_keys(url, fl, args.keys, args.per_key)
            await tokens_r3(url)
        finally:
            cluster.stop()
    table()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.cluster")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--per-key", type=int, default=10)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    anyio.run(main, parser.parse_args())
