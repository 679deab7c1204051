"""A run's active marker and index entry in the journal stream (see "Writes per run" in
docs/design.md), the windows a worker or a starter that dies leaves between the writes,
and the runs of an older fusee (index entries in ``<ns>_runs``, markers in ``<ns>_work``),
which keep being listed and resumed."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import nats.js.errors
import pytest

import fusee
from fusee.actors.run_index import project_index
from fusee.errors import Fenced
from fusee.runtime.ids import escape, partition_of
from fusee.runtime.index import RunInfo, decode_info, encode_info
from fusee.runtime.records import RunCompleted, RunStarted, encode_record, record_hash
from tests.workers.procs import wait_until


@fusee.workflow("markers_wait")
async def wait(ctx: fusee.Context) -> Any:
    return await ctx.wait_for("go")


@fusee.workflow("markers_echo")
async def echo(ctx: fusee.Context, arg: str) -> str:
    return await ctx.step("echo", lambda: arg, type=str)


def _started(engine: fusee.Engine, run_id: str, arg: str) -> RunStarted:
    return RunStarted(
        workflow="markers_echo",
        input=msgspec.Raw(msgspec.json.encode(arg)),
        started_at=time.time(),
        partition=partition_of(run_id, engine.partitions),
    )


async def _marked(engine: fusee.Engine, eid: str) -> bool:
    return any(e == eid for _, e in await engine.store.list_active(set(range(engine.partitions))))


async def _listed(engine: fusee.Engine) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for info in await engine.list_runs():
        out.setdefault(info.run_id, []).append(info.status)
    return out


async def test_a_started_run_is_listed_and_marked_before_any_worker_runs_it(
    engine: fusee.Engine,
) -> None:
    run = await engine.start(echo, "m-unrun", "hi")
    eid = escape("m-unrun")
    assert await _marked(engine, eid)  # its owner finds it, whenever one comes
    assert (await _listed(engine))["m-unrun"] == ["pending"]  # no owner: pending
    assert (await run.describe()).status == "pending"
    assert await engine.store.get_index_entry(eid) is None  # nothing indexed yet
    async with engine.worker():
        assert await run.result(timeout=30) == "hi"
        await wait_until(lambda: _gone(engine, eid), timeout=10, what="the marker to go")
    assert (await _listed(engine))["m-unrun"] == ["completed"]


async def _gone(engine: fusee.Engine, eid: str) -> bool:
    return not await _marked(engine, eid)


async def test_a_run_whose_worker_died_after_its_end_record_is_indexed_and_unmarked(
    engine: fusee.Engine,
) -> None:
    """The worker died between the end record and the write after it (the index entry
    and the marker's removal): the marker is still there, so the next owner activates
    the run, finds it ended, and writes what was left undone."""
    store, run_id = engine.store, "m-died-after-end"
    eid, started = escape(run_id), _started(engine, run_id, "x")
    first = encode_record(started)
    marker = encode_info(RunInfo(run_id=run_id, workflow="markers_echo", status="pending"))
    seq = await store.start_run(
        eid, "run.started", first, partition=started.partition, marker=marker, msg_id=f"{eid}:s"
    )
    end = RunCompleted(result=msgspec.Raw(b'"x"'), prev=seq, prev_hash=record_hash(first))
    await store.append(eid, "run.completed", encode_record(end), fence=seq, msg_id=f"{eid}:e")
    assert await _marked(engine, eid)
    assert (await _listed(engine))[run_id] == ["pending"]  # the index is behind the journal
    assert (await engine.run(run_id).describe()).status == "completed"  # the journal is not
    async with engine.worker():
        await wait_until(lambda: _gone(engine, eid), timeout=10, what="the marker to go")
    entry = await store.get_index_entry(eid)
    assert entry is not None
    assert decode_info(entry[0]).status == "completed"
    assert (await _listed(engine))[run_id] == ["completed"]


async def test_a_start_retried_after_a_lost_reply_is_the_same_run(engine: fusee.Engine) -> None:
    """The start's batch landed but its reply was lost: the retry (same Msg-Id, fence 0)
    is refused, and the read-back finds the record its own."""
    store, run_id = engine.store, "m-retried"
    eid, started = escape(run_id), _started(engine, run_id, "y")
    first = encode_record(started)
    seq = await store.start_run(
        eid, "run.started", first, partition=started.partition, marker=b"{}", msg_id=f"{eid}:s1"
    )
    again = await store.start_run(
        eid, "run.started", first, partition=started.partition, marker=b"{}", msg_id=f"{eid}:s1"
    )
    assert again == seq
    msgs = await store.read_journal(eid)
    assert [m.seq for m in msgs] == [seq]
    with pytest.raises(Fenced):  # another starter: the run exists
        await store.start_run(
            eid, "run.started", first, partition=started.partition, marker=b"{}", msg_id=f"{eid}:2"
        )


async def test_a_run_of_an_older_fusee_is_listed_resumed_and_unmarked(
    engine: fusee.Engine,
) -> None:
    """An older fusee indexed a run in the ``<ns>_runs`` bucket and marked it active in
    ``<ns>_work``: it is listed from there, a worker resumes it, and at its end its index
    entry moves to the journal stream (listed once) and its bucket marker is purged."""
    store, run_id = engine.store, "m-older"
    eid, started = escape(run_id), _started(engine, run_id, "old")
    await store.append(eid, "run.started", encode_record(started), fence=0, msg_id=f"{eid}:s")
    old = RunInfo(run_id=run_id, workflow="markers_echo", status="running", created_at=1.0)
    await store.runs.put(eid, encode_info(old))  # as written then: no journal tag
    await store.work.put(f"active.{started.partition}.{eid}", b"{}")
    assert (await _listed(engine))[run_id] == ["running"]
    assert await _marked(engine, eid)
    async with engine.worker():
        assert await engine.run(run_id).result(timeout=30) == "old"
        await wait_until(lambda: _gone(engine, eid), timeout=10, what="the old marker to go")
    assert (await _listed(engine))[run_id] == ["completed"]
    try:
        entry = await store.work.get(f"active.{started.partition}.{eid}")
    except nats.js.errors.KeyNotFoundError:
        entry = None
    assert entry is None or not entry.value


async def test_a_parked_run_keeps_its_marker_and_is_resumed_by_another_worker(
    engine: fusee.Engine,
) -> None:
    """A run that parks keeps its marker (no expiry): a worker that starts after the
    one that parked it is gone finds it, and its signal ends it."""
    run_id = "m-parked"
    eid = escape(run_id)
    async with engine.worker():
        run = await engine.start(wait, run_id)

        async def parked() -> bool:
            entry = await engine.store.get_index_entry(eid)
            return entry is not None and decode_info(entry[0]).status == "waiting"

        await wait_until(parked, timeout=10, what="the run to park")
    assert await _marked(engine, eid)
    assert (await _listed(engine))[run_id] == ["waiting"]
    async with engine.worker():
        assert await run.signal("go", 7)
        assert await run.result(timeout=30) == 7
        await wait_until(lambda: _gone(engine, eid), timeout=10, what="the marker to go")


async def test_a_marker_removed_for_want_of_a_journal_stays_when_the_run_started_meanwhile(
    engine: fusee.Engine,
) -> None:
    """An actor poked by a message to a run that has not started finds no journal and
    removes the run's marker; the run's start may land between its read and that
    removal. The removal expects no journal, so the started run keeps its marker (an
    unconditional one left it unmarked: found by test_children's early notice)."""
    store, run_id = engine.store, "m-early"
    eid, started = escape(run_id), _started(engine, run_id, "z")
    await store.start_run(
        eid,
        "run.started",
        encode_record(started),
        partition=started.partition,
        marker=b"{}",
        msg_id=f"{eid}:s",
    )
    await store.clear_unstarted(started.partition, eid)  # the actor that read no journal
    assert eid in await store.run_markers()  # kept: its start landed (a removal is not listed)
    other = escape("m-never")
    await store.mark_run_active(0, other, b"{}")  # a marker whose start never landed
    await store.clear_unstarted(0, other)
    await wait_until(lambda: _gone(engine, other), timeout=5, what="the lone marker to go")


async def test_an_older_fusee_s_marker_written_after_the_listing_goes_too(
    engine: fusee.Engine,
) -> None:
    """A run's end reads the work bucket for a marker there (an older fusee's, a note)
    only when its partition's last listing found one or this store wrote one since.
    One another process writes after that listing (here past the store, on the bucket
    itself) may outlive the end: the next listing finds it and activates the ended
    run, which purges it. Either way it goes."""
    store, run_id = engine.store, "m-late-old"
    eid, p = escape(run_id), partition_of(run_id, engine.partitions)
    key = f"active.{p}.{eid}"

    async def purged() -> bool:
        try:
            entry = await store.work.get(key)
        except nats.js.errors.KeyNotFoundError:
            return True
        return not entry.value

    async with engine.worker() as worker:
        run = await engine.start(wait, run_id)

        async def parked() -> bool:
            return eid in worker.parked

        await wait_until(parked, timeout=20, what="the run to park")
        await store.list_active({p})  # the partition's listing: no marker in the bucket
        await store.work.put(key, b"{}")  # then another process writes one
        assert await run.signal("go", 5)
        assert await run.result(timeout=20) == 5
        await wait_until(purged, timeout=30, what="the bucket's marker to be purged")


async def _in_work(store: Any, key: str) -> bool:
    try:
        entry = await store.work.get(key)
    except nats.js.errors.KeyNotFoundError:
        return False
    return bool(entry.value)


async def _list_partition(engine: fusee.Engine, p: int) -> None:
    await engine.store.list_active({p})  # a worker that owned the partition once


async def _list_objects(engine: fusee.Engine, p: int) -> None:
    await engine.list_objects("anytype")  # every partition, on the engine's store


@pytest.mark.parametrize("listing", [_list_partition, _list_objects], ids=["owner", "objects"])
async def test_an_ended_run_activated_again_purges_a_marker_an_old_listing_missed(
    engine: fusee.Engine,
    nats_server: Any,
    listing: Callable[[fusee.Engine, int], Awaitable[None]],
) -> None:
    """A store's last listing of a partition may be old (its worker owned it once, a
    guest now; or ``Engine.list_objects`` listed every partition): a marker another
    process wrote after it is purged when the ended run is activated again (each time
    its marker is removed the work bucket is read), not skipped for ever because that
    listing did not hold it."""
    other = await fusee.connect(nats_server.url, namespace=engine.namespace, partitions=4)
    try:
        run_id = f"m-stale-{listing.__name__}"
        eid, p = escape(run_id), partition_of(run_id, engine.partitions)
        key = f"active.{p}.{eid}"
        await listing(engine, p)  # listed once, long ago: nothing there
        await other.store.work.put(key, b"{}")  # an older fusee's client, a note
        await engine.store.clear_run_active(p, eid)  # the ended run activated again
        assert not await _in_work(other.store, key), "the marker is left in the work bucket"
    finally:
        await other.close()


async def test_an_ended_run_activated_again_without_its_final_entry_purges_a_late_marker(
    engine: fusee.Engine, nats_server: Any
) -> None:
    """An ended run activated again whose final entry never landed (its worker died
    after the end record, before the entry) writes it through ``end_run``: that is no
    fresh end, so the store's old listing is not trusted and a marker another process
    wrote after it is purged."""
    other = await fusee.connect(nats_server.url, namespace=engine.namespace, partitions=4)
    try:
        run_id = "m-rev5"
        eid, p = escape(run_id), partition_of(run_id, engine.partitions)
        key = f"active.{p}.{eid}"
        await engine.store.list_active({p})  # listed once, long ago: nothing there
        await other.store.work.put(key, b"{}")  # an older fusee's client, a note
        info = RunInfo(run_id=run_id, workflow="w", status="completed", partition=p)
        # RunLife's Project(unmark=True, current=UNREAD) for that run
        await project_index(engine.store, eid, info, 3, unmark=p)
        assert not await _in_work(other.store, key), "the marker is left in the work bucket"
    finally:
        await other.close()
