"""Python work per step, without NATS: ``python -m bench.step_cpu``.

Runs the real run actor (context, replay, commit path) over an in-memory journal with
JetStream's fencing rule, and prints the CPU time per step. It isolates what fusee's own
code costs per step from the server's fsync and the network, which the other benchmarks
include.

Twice, alternating 3 times: with logging at warning (no line per step) and with logging
as ``fusee worker`` configures it by default (``configure_logging("json", "info")``,
lines written to a file): ``log_us_per_step`` is what the per-step line costs, and
``log_us_on_path`` what of it the step's own path pays (the rest, rendering and writing
the lines, runs in the loop's later turns: timed here by wrapping the writer's flush).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

import fusee.logs
from fusee.actors.core import ActorCore
from fusee.actors.registry import Registry, Workflow
from fusee.actors.run_actor import RunActor
from fusee.errors import Fenced
from fusee.logs import configure_logging
from fusee.runtime.records import RunStarted, encode_record


@dataclass
class Stored:
    seq: int
    data: bytes


@dataclass
class MemoryJournal:
    msgs: list[Stored] = field(default_factory=list)
    max_value: int = 1 << 20
    tokens: None = None  # no token streams here

    async def append(
        self,
        eid: str,
        kind: str,
        data: bytes,
        *,
        fence: int,
        msg_id: str,
        unlist: str | None = None,  # (no listing entries here)
        rollup: bool = False,  # (no limits here)
    ) -> int:
        last = self.msgs[-1].seq if self.msgs else 0
        if fence != last:
            raise Fenced(f"fence {fence} != {last}")
        self.msgs.append(Stored(last + 1, data))
        return last + 1

    async def read_journal(self, eid: str, after: int = 0) -> list[Stored]:
        return [m for m in self.msgs if m.seq > after]

    async def read_inbox(self, partition: int, eid: str, after: int = 0) -> list[Stored]:
        return []

    async def put_index(self, eid: str, value: bytes, *, journal_seq: int, last: int) -> int:
        return last + 1

    async def get_index_entry(self, eid: str) -> tuple[bytes, int, int] | None:
        return None

    async def get_final_entry(self, eid: str) -> tuple[bytes, int] | None:
        return None

    async def get_index(self, eid: str) -> bytes | None:
        return None

    async def mark_active(self, partition: int, eid: str) -> None:
        return None

    async def clear_active(self, partition: int, eid: str) -> None:
        return None

    async def end_run(
        self, partition: int, eid: str, value: bytes, *, journal_seq: int, fresh: bool = False
    ) -> None:
        return None

    async def clear_run_active(
        self, partition: int, eid: str, *, listed: bytes | None = None, seen: int | None = None
    ) -> bool:
        return True


async def _noop() -> None:
    return None


async def _steps(ctx: Any, n: int) -> int:
    for i in range(n):
        await ctx.step(f"s{i}", _noop)
    return n


async def cpu_per_step(runs: int, steps: int) -> float:
    registry = Registry()
    registry.add(Workflow("w", _steps, int, True))
    began = time.process_time()
    for r in range(runs):
        store = MemoryJournal()
        start = RunStarted(workflow="w", input=msgspec.Raw(str(steps).encode()), started_at=0.0)
        store.msgs.append(Stored(1, encode_record(start)))
        actor = RunActor(
            registry=registry,
            core=ActorCore(
                store=store,  # type: ignore[arg-type]  # the actor needs only these methods here
                namespace="bench",
                eid=f"r{r}",
                run_id=f"r{r}",
                partition=0,
                clock=time.time,
            ),
        )
        await actor.run()
    return (time.process_time() - began) / (runs * steps) * 1e6


FLUSHED = [0.0]  # CPU seconds in the log writer's flushes


def _time_flushes() -> None:
    writer = fusee.logs._LineWriter  # a bench's clock around a private method
    flush = writer.flush

    def timed(self: Any, timeout: float = -1) -> None:
        began = time.process_time()
        flush(self, timeout)
        FLUSHED[0] += time.process_time() - began

    setattr(writer, "flush", timed)  # noqa: B010 - a method


async def main(runs: int = 40, steps: int = 50) -> None:
    _time_flushes()
    quiet: list[float] = []
    logged: list[float] = []
    path: list[float] = []
    with tempfile.TemporaryFile("w") as out:
        for _ in range(3):
            configure_logging("json", "warning", stream=out)
            quiet.append(await cpu_per_step(runs, steps))
            configure_logging("json", "info", stream=out)  # as `fusee worker` does
            FLUSHED[0] = 0.0
            logged.append(await cpu_per_step(runs, steps))
            path.append(logged[-1] - FLUSHED[0] / (runs * steps) * 1e6)
        configure_logging("json", "warning", stream=out)  # (writes what waits)
    q, lg = statistics.median(quiet), statistics.median(logged)
    print(
        json.dumps(
            {
                "bench": "step_cpu",
                "steps": runs * steps,
                "cpu_us_per_step": round(q, 1),
                "cpu_us_per_step_logged": round(lg, 1),
                "log_us_per_step": round(lg - q, 1),
                "log_us_on_path": round(statistics.median(path) - q, 1),
                "spread_quiet": [round(x, 1) for x in quiet],
                "spread_logged": [round(x, 1) for x in logged],
            }
        )
    )


if __name__ == "__main__":
    anyio.run(main)
