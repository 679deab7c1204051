"""What one run stores besides its steps, counted by stream sequence.

Every stream of the namespace (the journal stream and the KV buckets' streams) is read
from its last sequence before the run to its last sequence once the run's writes are
done, and each stored message is named by stream, key or record kind. The list is in
docs/design.md ("Writes per run"); a change to it must change both.
"""

from __future__ import annotations

from typing import Any

import nats.js.errors

import fusee
from fusee.runtime.ids import escape
from tests.workers.procs import wait_until


@fusee.workflow("writes_three_steps")
async def three_steps(ctx: fusee.Context) -> int:
    for i in range(3):
        await ctx.step(f"s{i}", _noop)
    return 3


async def _noop() -> None:
    return None


def _streams(namespace: str) -> list[str]:
    return [
        namespace.upper(),
        f"KV_{namespace}_runs",
        f"KV_{namespace}_work",
        f"KV_{namespace}_objects",
        f"{namespace.upper()}_VALUES",
    ]


async def _last_seqs(js: Any, namespace: str) -> dict[str, int]:
    return {s: (await js.stream_info(s)).state.last_seq for s in _streams(namespace)}


async def _stored_since(js: Any, namespace: str, before: dict[str, int]) -> list[str]:
    """Each message stored after ``before``, as ``stream subject-or-key (kind)``."""
    out = []
    for stream, last in (await _last_seqs(js, namespace)).items():
        for seq in range(before[stream] + 1, last + 1):
            try:
                msg = await js.get_msg(stream, seq)
            except nats.js.errors.NotFoundError:
                out.append(f"{stream} (removed)")  # purged, or its TTL ran out
                continue
            headers = msg.headers or {}
            what = headers.get("Fusee-Kind") or headers.get("KV-Operation") or "PUT"
            subject = msg.subject
            if subject.startswith("$KV."):
                subject = subject.split(".", 2)[2]  # the key
            out.append(f"{stream} {subject} ({what})")
    return out


async def test_a_run_stores_its_steps_and_seven_writes_besides(engine: fusee.Engine) -> None:
    ns = engine.namespace
    js = engine.store.js
    eid = escape("wpr-1")
    async with engine.worker():
        # warm-up: the worker owns its partitions, nothing of its start is counted
        await (await engine.start(three_steps, "wpr-warm")).result(timeout=30)
        await wait_until(
            lambda: _settled(engine, "wpr-warm"), timeout=10, what="the warm-up run to settle"
        )
        before = await _last_seqs(js, ns)
        run = await engine.start(three_steps, "wpr-1")
        assert await run.result(timeout=30) == 3
        # the writes after the end record (index, marker) follow the result
        await wait_until(lambda: _settled(engine, "wpr-1"), timeout=10, what="the run to settle")
        # the marker is purged with a purge marker that expires after a second: both
        # are gone then (and listed as removed), whenever this test reads them
        work = f"KV_{ns}_work"
        last = (await js.stream_info(work)).state.last_seq
        await wait_until(
            lambda: _removed(js, work, before[work], last),
            timeout=10,
            what="the purge marker to expire",
        )
        stored = await _stored_since(js, ns, before)
    steps = [s for s in stored if s.endswith("(step.completed)")]
    besides = [s for s in stored if s not in steps]
    assert len(steps) == 3
    assert besides == [
        f"{ns.upper()} {ns}.run.{eid}.j (run.started)",
        f"{ns.upper()} {ns}.run.{eid}.end (run.completed)",
        # the bucket keeps one value a key: the earlier entries are gone
        f"KV_{ns}_runs (removed)",  # the starter's entry: pending
        f"KV_{ns}_runs (removed)",  # the worker's at activation: running
        f"KV_{ns}_runs {eid} (PUT)",  # the worker's at the end: completed
        f"KV_{ns}_work (removed)",  # the starter's active marker, active.<p>.<eid>
        f"KV_{ns}_work (removed)",  # its purge at the end (a purge marker, 1 s TTL)
    ], "\n".join(besides)


async def _removed(js: Any, stream: str, after: int, last: int) -> bool:
    """Every message of ``stream`` from ``after`` (excluded) to ``last`` is gone."""
    for seq in range(after + 1, last + 1):
        try:
            await js.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            continue
        return False
    return True


async def _settled(engine: fusee.Engine, run_id: str) -> bool:
    """The run's end is indexed and its active marker is gone."""
    listed = {i.run_id: i.status for i in await engine.list_runs()}
    if listed.get(run_id) != "completed":
        return False
    eid = escape(run_id)
    active = await engine.store.list_active(set(range(engine.partitions)))
    return all(e != eid for _, e in active)
