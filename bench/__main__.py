"""fusee benchmarks, each beside the raw NATS floor measured in the same run.

    python -m bench [--only w1,w1_cli,w2,w3,w5,memory]

Every figure comes from a fresh embedded nats-server with ``sync_interval: always``
(each acknowledged write is on disk), on this machine, in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import nats
import structlog
from nats.aio.client import Client

import bench.workflows as wfs
import fusee
from bench import floor_replicas
from fusee.adapters.jetstream.server import EmbeddedServer

RESULTS: list[dict[str, Any]] = []


def emit(name: str, **fields: Any) -> None:
    row = {"bench": name, **fields}
    RESULTS.append(row)
    print(json.dumps(row), flush=True)


class Floor:
    """The fenced JetStream publish with a Msg-Id, one after the other, on a fresh stream
    of its own: what one durable step commit must cost at least."""

    def __init__(self, nc: Client, stream: str, prefix: str = "") -> None:
        self.nc, self.js, self.stream = nc, nc.jetstream(), stream
        self.prefix = prefix or stream.lower()  # a stream of its own: its name
        self.subject = f"{self.prefix}.r1.j"
        self.last = 0
        self.n = 0

    @classmethod
    async def open(cls, url: str, stream: str) -> Floor:
        floor = cls(await nats.connect(url.split(",")), stream)
        await floor.js.add_stream(
            name=stream,
            subjects=[f"{stream.lower()}.>"],
            allow_direct=True,
            num_replicas=floor_replicas(),
        )
        return floor

    async def block(self, n: int) -> list[float]:
        """``n`` publishes; their latencies (ms), in order."""
        lat = []
        for _ in range(n):
            self.n += 1
            t0 = time.perf_counter()
            ack = await self.js.publish(
                self.subject,
                b'{"kind":"step.completed","pos":%d,"result":null}' % self.n,
                headers={
                    "Nats-Expected-Last-Subject-Sequence": str(self.last),
                    "Nats-Expected-Last-Subject-Sequence-Subject": f"{self.prefix}.r1.>",
                    "Nats-Msg-Id": f"{self.prefix}.r1:{self.n}",
                },
            )
            lat.append((time.perf_counter() - t0) * 1000)
            self.last = ack.seq
        return lat

    async def close(self) -> None:
        await self.js.delete_stream(self.stream)
        await self.nc.close()


# Each timed run of W1 and w1_cli has the floor measured right before it (a block of this
# many publishes): on a shared machine the floor moves by half within seconds, and a
# ratio to a floor measured a minute earlier says as much about the machine as the code.
NEAR = 300


async def floor(url: str, n: int = 2000) -> float:
    """p50 of a fenced JetStream publish: what one durable step commit must cost at least."""
    probe = await Floor.open(url, "FLOOR")
    lat = sorted(await probe.block(n))
    await probe.close()
    p50 = statistics.median(lat)
    emit("floor", p50_ms=round(p50, 3), p99_ms=round(lat[int(n * 0.99)], 3), n=n)
    return p50


def _ratios(per_step: list[float], near: list[list[float]]) -> dict[str, Any]:
    """Each run's ms a step over the floor block measured just before it: over its p50
    (the floor as issue 11 defines it), and over its mean. A run's ms a step is a mean:
    it carries the fsync's tail (p99 is 5-10x p50 here), which a p50 leaves out, so the
    mean-to-mean ratio is the like-for-like one (the same tail on both sides)."""
    p50 = [statistics.median(block) for block in near]
    mean = [statistics.fmean(block) for block in near]
    ratios = sorted(t / f for t, f in zip(per_step, p50, strict=True))
    means = sorted(t / f for t, f in zip(per_step, mean, strict=True))
    return {
        "ratio_to_near_floor": round(statistics.median(ratios), 2),
        "near_ratio_spread": [round(ratios[0], 2), round(ratios[-1], 2)],
        "ratio_to_near_floor_mean": round(statistics.median(means), 2),
        "near_floor_p50_ms": round(statistics.median(p50), 3),
        "near_floor_mean_ms": round(statistics.median(mean), 3),
    }


async def w1(url: str, floor_ms: float, steps: int = 100, repeats: int = 9) -> None:
    engine = await fusee.connect(url, namespace="w1")
    probe = await Floor.open(url, "FLOOR_W1")
    per_step: list[float] = []
    near: list[list[float]] = []
    async with engine.worker():
        warm = await engine.start(wfs.noop_steps, f"w1-{time.time_ns()}-warm", steps)
        await warm.result(timeout=60)
        for r in range(repeats):
            near.append(await probe.block(NEAR))
            t0 = time.perf_counter()
            run = await engine.start(wfs.noop_steps, f"w1-{time.time_ns()}-{r}", steps)
            await run.result(timeout=60)
            per_step.append((time.perf_counter() - t0) * 1000 / steps)
    await engine.close()
    await probe.close()
    best, med = min(per_step), statistics.median(per_step)
    emit(
        "w1",
        steps=steps,
        ms_per_step_median=round(med, 3),
        ms_per_step_best=round(best, 3),
        ratio_to_floor=round(med / floor_ms, 2),
        **_ratios(per_step, near),
        goal_ms=0.8,
    )


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far (schedstat: ns, not clock ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        total += int((task / "schedstat").read_text().split()[0])
    return total


def _fusee_worker(url: str, namespace: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``fusee worker bench/workflows.py``, its stderr (not a terminal: JSON lines) in ``log``."""
    cmd = [sys.executable, "-m", "fusee", "worker", "bench/workflows.py", "--nats", url]
    with log.open("ab") as err:
        return subprocess.Popen(
            [*cmd, "--namespace", namespace, *extra],
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=Path(__file__).resolve().parent.parent,
        )


async def w1_cli(url: str, floor_ms: float, steps: int = 100, rounds: int = 4) -> None:
    """W1 with the worker as deployed: ``fusee worker`` in its own process, its logging
    configured by the CLI's defaults (info; JSON lines, stderr being a file here), beside
    the same command at ``--log-level warning`` (no per-step line). The two alternate
    (and swap places each round), so drift on a shared machine falls on both; each round times
    3 runs of ``steps`` steps after one warm-up run. ``log_share`` is what the info
    level adds per step, as a fraction of the warning level's time; ``cpu_us_per_step`` is
    the worker process's own CPU time over the timed runs (what the worker did, whatever
    else the shared machine was doing meanwhile)."""
    figures: dict[str, list[float]] = {"info": [], "warning": []}
    near: dict[str, list[list[float]]] = {"info": [], "warning": []}
    cpu: dict[str, list[float]] = {"info": [], "warning": []}
    lines = 0
    probe = await Floor.open(url, "FLOOR_CLI")
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for level in ("info", "warning") if r % 2 == 0 else ("warning", "info"):
                ns = f"w1cli_{level[0]}{r}"
                log = Path(tmp) / f"{ns}.log"
                extra = () if level == "info" else ("--log-level", "warning")
                proc = _fusee_worker(url, ns, log, *extra)
                engine = await fusee.connect(url, namespace=ns)
                try:
                    warm = await engine.start(wfs.noop_steps, f"{ns}-warm", steps)
                    await warm.result(timeout=60)
                    began = _cpu_ns(proc.pid)
                    for i in range(3):
                        near[level].append(await probe.block(NEAR))
                        t0 = time.perf_counter()
                        run = await engine.start(wfs.noop_steps, f"{ns}-{i}", steps)
                        await run.result(timeout=60)
                        figures[level].append((time.perf_counter() - t0) * 1000 / steps)
                    # the floor blocks ran meanwhile, in this process: not the worker's CPU
                    cpu[level].append((_cpu_ns(proc.pid) - began) / 1000 / (3 * steps))
                finally:
                    await engine.close()
                    proc.send_signal(signal.SIGTERM)
                    await anyio.to_thread.run_sync(proc.wait)
                if level == "info":
                    lines += log.read_text().count('"step.completed"')
    await probe.close()
    info, quiet = statistics.median(figures["info"]), statistics.median(figures["warning"])
    near_info = _ratios(figures["info"], near["info"])
    near_quiet = _ratios(figures["warning"], near["warning"])
    emit(
        "w1_cli",
        steps=steps,
        ms_per_step_info=round(info, 3),
        ms_per_step_warning=round(quiet, 3),
        ratio_to_floor=round(info / floor_ms, 2),
        ratio_to_floor_warning=round(quiet / floor_ms, 2),
        **near_info,
        ratio_to_near_floor_warning=near_quiet["ratio_to_near_floor"],
        near_ratio_spread_warning=near_quiet["near_ratio_spread"],
        ratio_to_near_floor_mean_warning=near_quiet["ratio_to_near_floor_mean"],
        log_share=round(info / quiet - 1, 3),
        cpu_us_per_step_info=round(statistics.median(cpu["info"]), 1),
        cpu_us_per_step_warning=round(statistics.median(cpu["warning"]), 1),
        step_lines_logged=lines,
        goal_ratio=1.3,
    )


async def start(url: str, floor_ms: float, runs: int = 300) -> None:
    """``engine.start`` one run at a time, no worker: what a caller waits for before its
    run exists (issue 11's writes per run: the start's batch), over the floor measured
    just before."""
    engine = await fusee.connect(url, namespace="start")
    probe = await Floor.open(url, "FLOOR_START")
    near = await probe.block(NEAR)
    lat = []
    for i in range(runs):
        t0 = time.perf_counter()
        await engine.start(wfs.noop_steps, f"start-{time.time_ns()}-{i}", 0)
        lat.append((time.perf_counter() - t0) * 1000)
    await engine.close()
    await probe.close()
    lat.sort()
    p50, near_p50 = statistics.median(lat), statistics.median(near)
    emit(
        "start",
        runs=runs,
        p50_ms=round(p50, 3),
        p99_ms=round(lat[int(runs * 0.99)], 3),
        near_floor_p50_ms=round(near_p50, 3),
        ratio_to_near_floor=round(p50 / near_p50, 2),
    )


async def w2(url: str, floor_ms: float, runs: int = 200, steps: int = 10) -> None:
    engine = await fusee.connect(url, namespace="w2")
    async with engine.worker():
        t0 = time.perf_counter()
        handles = []
        async with anyio.create_task_group() as tg:

            async def start(i: int) -> None:
                handles.append(await engine.start(wfs.noop_steps, f"w2-{i}", steps))

            for i in range(runs):
                tg.start_soon(start, i)
        started = time.perf_counter() - t0
        async with anyio.create_task_group() as tg:
            for h in handles:
                tg.start_soon(h.result)
        elapsed = time.perf_counter() - t0
    committer = engine.store.committer
    await engine.close()
    total = runs * steps
    emit(
        "w2",
        runs=runs,
        steps_per_run=steps,
        seconds=round(elapsed, 3),
        steps_per_s=round(total / elapsed),
        starts_s=round(started, 3),
        runs_per_s=round(runs / elapsed, 1),
        floor_commits_per_s=round(1000 / floor_ms),
        goal_steps_per_s=2000,
        group_commits=committer.batches,
        records_in_group_commits=committer.batched,
    )


async def w3(url: str, floor_ms: float, repeats: int = 50) -> None:
    """A run waits on ctx.wait_for; the client signals: signal sent -> result received.

    Measured twice: with the actor still in memory (signal within its park time) and
    after it left memory (parked: the signal brings it back by replay). Before each
    signal the floor is measured near it twice over: a block of publishes one after the
    other (the floor as issue 11 defines it: warm), and one publish after the machine
    idled 50 ms, as long as the signal does before it is sent (cold: what the signal's
    own write meets, with the server and the client asleep)."""
    engine = await fusee.connect(url, namespace="w3")
    probe = await Floor.open(url, "FLOOR_W3")
    figures: dict[str, list[float]] = {"hot": [], "parked": []}
    warm: dict[str, list[float]] = {"hot": [], "parked": []}
    cold: dict[str, list[float]] = {"hot": [], "parked": []}
    async with engine.worker() as worker:
        for mode in ("hot", "parked"):
            for r in range(repeats if mode == "hot" else repeats // 5):
                run = await engine.start(wfs.wait_for_go, f"w3-{mode}-{time.time_ns()}-{r}", None)
                while not any(
                    type(rec).__name__ == "WaitStarted" for _, rec in await run.journal()
                ):
                    await anyio.sleep(0.005)
                if mode == "parked":
                    while run.run_id not in worker.parked:
                        await anyio.sleep(0.05)
                warm[mode].append(statistics.median(await probe.block(50)))
                await anyio.sleep(0.05)
                cold[mode].extend(await probe.block(1))
                result: list[float] = []

                async def wait(run: fusee.Run = run, result: list[float] = result) -> None:
                    await run.result(timeout=30)
                    result.append(time.perf_counter())

                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    await anyio.sleep(0.05)  # the result() follower is subscribed
                    t0 = time.perf_counter()
                    await run.signal("go", r)
                figures[mode].append((result[0] - t0) * 1000)
    await engine.close()
    await probe.close()

    def near(mode: str, floors: dict[str, list[float]]) -> float:
        ratios = [t / f for t, f in zip(figures[mode], floors[mode], strict=True)]
        return round(statistics.median(ratios), 2)

    emit(
        "w3",
        hot_ms_median=round(statistics.median(figures["hot"]), 3),
        parked_ms_median=round(statistics.median(figures["parked"]), 3),
        repeats=repeats,
        ratio_to_floor=round(statistics.median(figures["hot"]) / floor_ms, 2),
        ratio_to_near_floor=near("hot", warm),
        parked_ratio_to_near_floor=near("parked", warm),
        near_floor_p50_ms=round(statistics.median(warm["hot"]), 3),
        ratio_to_cold_floor=near("hot", cold),
        parked_ratio_to_cold_floor=near("parked", cold),
        cold_floor_p50_ms=round(statistics.median(cold["hot"]), 3),
        goal_ms=5,
    )


def spawn_worker(url: str, ns: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.worker", url, ns],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # "ready": connected
    return proc


async def w5(url: str, floor_ms: float, repeats: int = 3, step_s: float = 2.0) -> None:
    """SIGKILL the worker 0.5 s into a 2 s step, start a new one at once."""
    engine = await fusee.connect(url, namespace="w5")
    beyond = []
    for r in range(repeats):
        first = spawn_worker(url, "w5")
        run = await engine.start(wfs.slow_step, f"w5-{time.time_ns()}-{r}", step_s)
        # wait until the slow step is running (its predecessor is journaled)
        while len(await run.journal()) < 2:
            await anyio.sleep(0.01)
        await anyio.sleep(0.5)
        first.send_signal(signal.SIGKILL)
        killed = time.perf_counter()
        first.wait()
        second = await anyio.to_thread.run_sync(spawn_worker, url, "w5")
        await run.result(timeout=60)
        beyond.append(time.perf_counter() - killed - step_s)
        second.send_signal(signal.SIGTERM)
        second.wait()
    await engine.close()
    emit(
        "w5",
        repeats=repeats,
        step_s=step_s,
        seconds_beyond_step_median=round(statistics.median(beyond), 3),
        all=[round(b, 3) for b in beyond],
        goal_s=0.5,
    )


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def memory(url: str, server_pid: int) -> None:
    worker = spawn_worker(url, "mem")
    await anyio.sleep(3)
    server, proc = _rss_mib(server_pid), _rss_mib(worker.pid)
    worker.send_signal(signal.SIGTERM)
    worker.wait()
    emit(
        "memory",
        server_mib=round(server, 1),
        worker_mib=round(proc, 1),
        total_mib=round(server + proc, 1),
        goal_mib=100,
    )


def table() -> None:
    print()
    print(f"{'benchmark':<10} {'figure':<44} goal")
    for row in RESULTS:
        name = row["bench"]
        if name == "floor":
            fig = f"fenced publish p50 {row['p50_ms']} ms (p99 {row['p99_ms']})"
            goal = ""
        elif name == "w1":
            fig = (
                f"{row['ms_per_step_median']} ms/step = {row['ratio_to_near_floor']}x floor"
                f" (near), {row['ratio_to_floor']}x (first)"
            )
            goal = "<= 0.8 ms"
        elif name == "w1_cli":
            fig = (
                f"fusee worker {row['ratio_to_near_floor']}x floor "
                f"(warning {row['ratio_to_near_floor_warning']}x)"
            )
            goal = "<= 1.3x"
        elif name == "start":
            fig = f"start p50 {row['p50_ms']} ms = {row['ratio_to_near_floor']}x floor"
            goal = ""
        elif name == "w2":
            fig = f"{row['steps_per_s']} steps/s (floor {row['floor_commits_per_s']} commits/s)"
            goal = ">= 2000"
        elif name == "w3":
            fig = (
                f"{row['hot_ms_median']} ms in memory = {row['ratio_to_near_floor']}x floor"
                f" (near; {row['ratio_to_cold_floor']}x cold), {row['parked_ms_median']} ms parked"
            )
            goal = "<= 5 ms"
        elif name == "w5":
            fig = f"{row['seconds_beyond_step_median']} s beyond the step"
            goal = "<= 0.5 s"
        else:
            fig = f"{row['total_mib']} MiB (server {row['server_mib']}, worker {row['worker_mib']})"
            goal = "<= 100 MiB"
        print(f"{name:<10} {fig:<44} {goal}")


async def main(only: set[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer.start(Path(tmp))
        try:
            f = await floor(server.url)
            if "w1" in only:
                await w1(server.url, f)
            if "w1_cli" in only:
                await w1_cli(server.url, f)
            if "start" in only:
                await start(server.url, f)
            if "w2" in only:
                await w2(server.url, f)
            if "w3" in only:
                await w3(server.url, f)
            if "w5" in only:
                await w5(server.url, f)
            if "memory" in only:
                await memory(server.url, server.pid)
        finally:
            server.stop()
    table()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--only", default="w1,w1_cli,w2,w3,w5,memory")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # step and run logs are not what is measured: keep warnings and errors only
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    anyio.run(main, set(args.only.split(",")))
