"""The paused runs' listing entries (issue 12's review): a resume removes its run's in
the write of ``run.resumed``; a stale one (a resume of an earlier version) is pruned by
the reader that finds it, unless a newer pause replaced it; a run an earlier version
paused is listed once a worker of this version opens the namespace; and only workers
write ``config.listed_from``, never a reader."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import nats.js.errors
import pytest

import fusee
from fusee.adapters.jetstream.store import LISTED_FROM, PAUSED_LISTED, NatsStore
from fusee.errors import ConnectionLost
from fusee.runtime.index import RunInfo, encode_info
from tests.helpers import run_cli
from tests.integration.test_bulk import start_settled
from tests.workers.procs import wait_until


@fusee.workflow("ls_echo")
async def ls_echo(ctx: fusee.Context, args: dict[str, Any]) -> dict[str, Any]:
    return args


async def _config(store: NatsStore, key: str) -> bytes | None:
    try:
        return (await store.work.get(key)).value
    except nats.js.errors.KeyNotFoundError:
        return None


async def _paused_listings(store: NatsStore) -> list[str]:
    """The run IDs (escaped) the stream lists under ``paused``, stale ones included."""
    return [eid async for found in store.listed_pages("paused", None) for eid, _, _ in found]


def _paused(run_id: str) -> bytes:
    info = RunInfo(
        run_id=run_id, workflow="w", status="paused", created_at=time.time(), partition=0
    )
    return encode_info(info)


async def test_a_reader_writes_no_listed_from_and_a_worker_does(
    nats_server: Any, namespace: str
) -> None:
    eng = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        assert await eng.list_runs(status="failed") == []
        done = await run_cli(
            "runs", "list", "--status", "failed", "--nats", nats_server.url,
            "--namespace", namespace,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert await _config(eng.store, LISTED_FROM) is None
        async with eng.worker():
            pass
        assert await _config(eng.store, LISTED_FROM) is not None
    finally:
        await eng.close()


async def test_a_resume_removes_the_paused_listing_in_its_write(
    engine: fusee.Engine, bulk_workers: Any, tmp_path: Path
) -> None:
    await start_settled(engine, tmp_path, "bk_b", "pause", ["r-1"])
    assert await _paused_listings(engine.store) == ["r-1"]
    (tmp_path / "fixed").touch()
    await engine.run("r-1").resume()
    assert await engine.run("r-1").result(timeout=30) == "answered"
    assert await _paused_listings(engine.store) == []  # not left for readers to check


async def test_a_stale_paused_listing_is_pruned_by_the_reader_that_finds_it(
    engine: fusee.Engine,
) -> None:
    store = engine.store
    await store.open_listings()  # as the worker that ended it did
    raw = _paused("s-1")
    assert await store.put_index("s-1", raw, journal_seq=1, last=0) is not None
    await store.mark_run_active(0, "s-1", raw)
    await store.clear_run_active(0, "s-1", listed=raw)  # paused: listed
    # resumed by an earlier version (no removal with its run.resumed), then ended
    await store.mark_run_active(0, "s-1", raw)
    done = RunInfo(run_id="s-1", workflow="w", status="completed", created_at=time.time())
    await store.end_run(0, "s-1", encode_info(done), journal_seq=3)
    assert await _paused_listings(store) == ["s-1"]
    assert await engine.list_runs(status="paused") == []
    assert await _paused_listings(store) == []  # pruned
    assert [i.run_id for i in await engine.list_runs(status="completed")] == ["s-1"]


async def test_a_listing_newer_than_the_one_read_is_not_pruned(engine: fusee.Engine) -> None:
    store = engine.store
    raw = _paused("n-1")
    await store.clear_run_active(0, "n-1", listed=raw)
    [[(_, _, first)]] = [found async for found in store.listed_pages("paused", "w")]
    await store.clear_run_active(0, "n-1", listed=raw)  # it paused again since
    assert await store.unlist("paused", "w", "n-1", first) is False
    assert await _paused_listings(store) == ["n-1"]


async def test_a_run_an_earlier_version_paused_is_listed_once_a_worker_opens(
    engine: fusee.Engine,
) -> None:
    store = engine.store
    # paused by an earlier version: its entry in the bucket, no listing entry
    assert await store.put_index("old-p", _paused("old-p"), journal_seq=1, last=0) is not None
    # and one paused by this version since, whose listing must stay as it is
    assert await store.put_index("new-p", _paused("new-p"), journal_seq=1, last=0) is not None
    await store.clear_run_active(0, "new-p", listed=_paused("new-p"))
    [[(_, _, new_seq)]] = [found async for found in store.listed_pages("paused", "w")]
    assert [i.run_id for i in await engine.list_runs(status="paused")] == ["new-p"]
    await store.open_listings()
    assert await _config(store, PAUSED_LISTED) is not None
    assert sorted(i.run_id for i in await engine.list_runs(status="paused")) == ["new-p", "old-p"]
    seqs = {eid: seq async for found in store.listed_pages("paused", "w") for eid, _, seq in found}
    assert seqs["new-p"] == new_seq


@pytest.mark.parametrize("key", [LISTED_FROM, PAUSED_LISTED])
async def test_opening_the_listings_again_changes_nothing(engine: fusee.Engine, key: str) -> None:
    await engine.store.open_listings()
    before = await _config(engine.store, key)
    await engine.store.open_listings()
    assert await _config(engine.store, key) == before is not None


async def test_the_listing_of_earlier_pauses_skips_the_runs_that_ended(
    engine: fusee.Engine,
) -> None:
    """An earlier version's ``end_run`` left the bucket's entry as it was: a run it
    paused, resumed and completed reads ``paused`` there, and has a final entry."""
    store = engine.store
    # the version before this one (issue 11's) set config.listed_from at its connect
    await store.note_listed_from()
    for n in range(5):  # three pages of two
        assert await store.put_index(f"e-{n}", _paused(f"e-{n}"), journal_seq=1, last=0)
    for n in (0, 3):  # ended, on the first and the second page
        done = RunInfo(run_id=f"e-{n}", workflow="w", status="completed", created_at=time.time())
        await store.end_run(0, f"e-{n}", encode_info(done), journal_seq=5)
    await store.list_old_pauses(page=2)
    assert sorted(await _paused_listings(store)) == ["e-1", "e-2", "e-4"]
    assert await store.count_listed("paused", None) == 3
    assert sorted(i.run_id for i in await engine.list_runs(status="completed")) == ["e-0", "e-3"]


async def test_a_page_with_more_ended_runs_than_one_read_of_final_entries_answers(
    engine: fusee.Engine,
) -> None:
    """The final entries of a page are read 1,000 subjects a request: the server answers
    1,024 messages at most (413 Too Many Results), and a page of 1,100 paused entries
    may name more ended runs than that."""
    store = engine.store
    ids = [f"m-{n:04}" for n in range(1030)]
    kept = {ids[0], ids[600], ids[-1]}
    limit = anyio.CapacityLimiter(64)

    async def write(run_id: str) -> None:
        async with limit:
            assert await store.put_index(run_id, _paused(run_id), journal_seq=1, last=0)
            if run_id not in kept:
                done = RunInfo(run_id=run_id, workflow="w", status="completed", created_at=1.0)
                await store.end_run(0, run_id, encode_info(done), journal_seq=5)

    async with anyio.create_task_group() as tg:
        for run_id in ids:
            tg.start_soon(write, run_id)
    await store.list_old_pauses(page=1100)
    assert sorted(await _paused_listings(store)) == sorted(kept)


async def test_a_failed_listing_of_earlier_pauses_does_not_stop_the_worker(
    engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = engine.store
    assert await store.put_index("old-p", _paused("old-p"), journal_seq=1, last=0) is not None
    real, tries = store.list_old_pauses, []

    async def once_lost(*, page: int = 500) -> None:  # NATS lost on the first try
        tries.append(page)
        if len(tries) == 1:
            raise ConnectionLost("listing earlier pauses: NATS did not answer (the test's)")
        await real(page=page)

    monkeypatch.setattr(store, "list_old_pauses", once_lost)
    async with engine.worker():  # it starts: the listing is tried again in the background
        run = await engine.start("ls_echo", "after-lost", {"x": 1})
        assert await run.result(timeout=30) == {"x": 1}
        await wait_until(
            lambda: _config(store, PAUSED_LISTED), timeout=20, what="the listing tried again"
        )
    assert len(tries) == 2
    assert [i.run_id for i in await engine.list_runs(status="paused")] == ["old-p"]


async def test_count_paused_counts_the_listings_and_is_none_when_nats_cannot(
    nats_server: Any, namespace: str
) -> None:
    eng = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        for run_id, workflow in (("c-1", "w"), ("c-2", "w"), ("c-3", "v")):
            info = RunInfo(run_id=run_id, workflow=workflow, status="paused", created_at=1.0)
            await eng.store.clear_run_active(0, run_id, listed=encode_info(info))
        assert await eng.count_paused() == 3
        assert await eng.count_paused(workflow="w") == 2
        with pytest.raises(fusee.ConfigError, match="workflow=''"):
            await eng.count_paused(workflow="")
    finally:
        await eng.close()
    assert await eng.count_paused() is None  # (closed: a progress bar without a total)


async def test_a_dry_run_writes_nothing(engine: fusee.Engine) -> None:
    """Not even the prune of a stale paused listing that a reader does."""
    store = engine.store
    await store.open_listings()
    raw = _paused("s-1")
    await store.put_index("s-1", raw, journal_seq=1, last=0)
    await store.clear_run_active(0, "s-1", listed=raw)  # paused: listed
    await store.mark_run_active(0, "s-1", raw)  # a resume sent, not taken yet
    assert await _paused_listings(store) == ["s-1"]
    summary = await engine.bulk_resume(workflow="w", dry_run=True)
    assert summary.done == 0
    assert await _paused_listings(store) == ["s-1"]  # a dry run changes nothing stored
    await engine.bulk_resume(workflow="w")  # the real pass prunes it, as a reader does
    assert await _paused_listings(store) == []
