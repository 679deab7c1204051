"""What one run stores besides its steps, counted by stream sequence.

Every stream of the namespace (the journal stream and the KV buckets' streams) is read
from its last sequence before the run to its last sequence once the run's writes are
done, and each stored message is named by stream, key or record kind. The list is in
docs/design.md ("Writes per run"); a change to it must change both.

A write is one publish acknowledged by the server: a single message, or an atomic
batch of several (stored together with one fsync, all or none). Messages are counted
too, by stream sequence.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import nats.js.errors

import fusee
from fusee.runtime.ids import escape, partition_of
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


async def test_a_run_stores_its_steps_and_three_writes_besides(engine: fusee.Engine) -> None:
    ns = engine.namespace
    js = engine.store.js
    eid = escape("wpr-1")
    p = partition_of("wpr-1", engine.partitions)
    async with engine.worker():
        # warm-up: the worker owns its partitions, nothing of its start is counted
        await (await engine.start(three_steps, "wpr-warm")).result(timeout=30)
        await wait_until(
            lambda: _settled(engine, "wpr-warm"), timeout=10, what="the warm-up run to settle"
        )
        before = await _last_seqs(js, ns)
        async with _published(engine.store.nc, ns) as sent:
            run = await engine.start(three_steps, "wpr-1")
            assert await run.result(timeout=30) == 3
            # the write after the end record (index, marker) follows the result
            await wait_until(
                lambda: _settled(engine, "wpr-1"), timeout=10, what="the run to settle"
            )
        # the marker is removed by a message that replaces it and expires after a
        # second: both are gone then (and listed as removed), whenever this test reads them
        last = (await js.stream_info(ns.upper())).state.last_seq
        await wait_until(
            lambda: _removed(js, ns.upper(), last - 1, last),
            timeout=10,
            what="the marker's removal to expire",
        )
        stored = await _stored_since(js, ns, before)
    steps = [s for s in stored if s.endswith("(step.completed)")]
    besides = [s for s in stored if s not in steps]
    assert len(steps) == 3
    assert besides == [
        f"{ns.upper()} {ns}.run.{eid}.j (run.started)",
        f"{ns.upper()} (removed)",  # the active marker, <ns>.in.<p>.<eid>.a: replaced...
        f"{ns.upper()} {ns}.run.{eid}.end (run.completed)",
        f"{ns.upper()} {ns}.in.x.{eid} (run.index)",  # the index entry: completed
        # its listing entry, under its status and workflow (a filter's subject)
        f"{ns.upper()} {ns}.in.x.completed.writes_three_steps.{eid} (run.listed)",
        f"{ns.upper()} (removed)",  # ...by this, which expires a second later
    ], "\n".join(besides)
    # The writes, as sent: an atomic batch is one write (one fsync, all or none).
    writes = [w for w in _writes(sent) if w != ["step.completed"]]
    assert writes == [
        ["run.started", f"run.active {ns}.in.{p}.{eid}.a"],  # the start, one batch
        ["run.completed"],  # the end record alone: a waiter is told at once
        # after it, one batch: the entry, its listing entry, the marker's removal
        [
            "run.index",
            "run.listed",
            f"run.inactive {ns}.in.{p}.{eid}.a",
        ],
    ], writes


@contextlib.asynccontextmanager
async def _published(nc: Any, ns: str) -> AsyncIterator[list[tuple[str, dict[str, str]]]]:
    """Every message published to the namespace's stored subjects while the block runs,
    as ``(subject, headers)`` (a core subscription sees each as it is sent)."""
    sent: list[tuple[str, dict[str, str]]] = []

    async def got(msg: Any) -> None:
        sent.append((msg.subject, dict(msg.headers or {})))

    subs = [
        await nc.subscribe(subject, cb=got)
        for subject in (f"{ns}.>", f"$KV.{ns}_runs.>", f"$KV.{ns}_work.>", f"$KV.{ns}_objects.>")
    ]
    try:
        yield sent
        await nc.flush()
    finally:
        for sub in subs:
            await sub.unsubscribe()


def _writes(sent: list[tuple[str, dict[str, str]]]) -> list[list[str]]:
    """The messages grouped into writes: those of one atomic batch together, in order."""
    writes: list[list[str]] = []
    batches: dict[str, list[str]] = {}
    for subject, headers in sent:
        kind = headers.get("Fusee-Kind") or headers.get("KV-Operation") or subject
        what = kind if ".run." in subject or ".in.x." in subject else f"{kind} {subject}"
        batch = headers.get("Nats-Batch-Id")
        if batch is None:
            writes.append([what])
        elif batch in batches:
            batches[batch].append(what)
        else:
            batches[batch] = [what]
            writes.append(batches[batch])
    return writes


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


async def test_a_run_s_end_reads_no_index_entry_and_no_old_marker(engine: fusee.Engine) -> None:
    """The end that just landed is the journal's last record: no index entry can say
    more, so its final entry is written without reading the index (before: the
    stream's final entry, then the ``<ns>_runs`` bucket's), and the work bucket is not
    read for an older fusee's marker when the partition's last listing found none
    (before: one read per end). A run that parks still reads its entry to compare."""
    ns, store = engine.namespace, engine.store
    eid = escape("wpr-reads")
    index_subjects = {store.layout.index_entry(eid), f"$KV.{ns}_runs.{eid}"}
    reads: list[str] = []
    real_last, real_get = store.js.get_last_msg, store.work.get

    async def get_last_msg(stream: str, subject: str, *args: Any, **kwargs: Any) -> Any:
        if subject in index_subjects:
            reads.append(subject)
        return await real_last(stream, subject, *args, **kwargs)

    async def work_get(key: str, *args: Any, **kwargs: Any) -> Any:
        if key.endswith(f".{eid}"):
            reads.append(key)
        return await real_get(key, *args, **kwargs)

    async def ended() -> bool:  # (read past the patches)
        try:
            msg = await real_last(store.layout.stream, store.layout.index_entry(eid), direct=True)
        except nats.js.errors.NotFoundError:
            return False
        active = await store.list_active(set(range(engine.partitions)))
        return bool(msg.data) and all(e != eid for _, e in active)

    async with engine.worker():
        await (await engine.start(three_steps, "wpr-reads-warm")).result(timeout=30)
        await wait_until(
            lambda: _settled(engine, "wpr-reads-warm"), timeout=10, what="the warm-up to settle"
        )
        store.js.get_last_msg, store.work.get = get_last_msg, work_get  # type: ignore[method-assign,assignment]
        try:
            run = await engine.start(three_steps, "wpr-reads")
            assert await run.result(timeout=30) == 3
            await wait_until(ended, timeout=10, what="the run's end to be indexed")
        finally:
            store.js.get_last_msg, store.work.get = real_last, real_get  # type: ignore[method-assign]
    assert reads == [], reads
