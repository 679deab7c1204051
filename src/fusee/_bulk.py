"""Filtered listing of runs, and bulk resume and cancel: the engine's side, shared by the
CLI (``fusee runs list``, ``fusee runs bulk``) and the HTTP API (``/v1/runs/bulk/...``).

Runs are read a page at a time from the run index (``NatsStore.listed_pages``,
``paused_pages`` and the active markers), never all at once, and acted on with at most
``concurrency`` calls in flight. A bulk action is safe to run again after an
interruption: what it did is in the runs themselves (a cancelled run has ended, a resumed
one is no longer paused, and the resume of one pause is idempotent), so a second pass
skips it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

import anyio
import msgspec

from fusee.errors import ConfigError, FuseeError, NotPausedError, RunNotFound
from fusee.runtime.bulk import ENDED_STATUSES, BulkSummary, RunFilter, matches, sources
from fusee.runtime.ids import escape
from fusee.runtime.index import RunInfo, info_or_none

if TYPE_CHECKING:
    from fusee.adapters.jetstream.store import NatsStore


class _Handle(Protocol):
    async def cancel(self, reason: str = ..., *, dry_run: bool = ...) -> bool: ...

    async def resume(self, *, force: bool = ..., dry_run: bool = ...) -> None: ...


class Engine(Protocol):
    """What these functions use of ``fusee.Engine`` (which imports them)."""

    @property
    def store(self) -> NatsStore: ...

    def run(self, run_id: str) -> _Handle: ...


__all__ = ("iter_runs", "runs_page", "stages", "bulk", "PAGE", "CONCURRENCY", "Action", "OnRun")

PAGE = 500  # index entries read per page (one batched Direct Get)
CONCURRENCY = 32  # resumes or cancels in flight at once
Action = Literal["resume", "cancel"]
T = TypeVar("T")
R = TypeVar("R")
# (the run, "done" | "skipped" | "failed" | "would": a dry run's done)
OnRun = Callable[[RunInfo, str], None]


async def _gather(items: list[T], fn: Callable[[T], Awaitable[R]], limit: int) -> list[R]:
    """``fn`` of each item, at most ``limit`` at once; the results in the items' order."""
    sem = anyio.Semaphore(limit)
    out: dict[int, R] = {}

    async def one(i: int, item: T) -> None:
        async with sem:
            out[i] = await fn(item)

    async with anyio.create_task_group() as tg:
        for i, item in enumerate(items):
            tg.start_soon(one, i, item)
    return [out[i] for i in range(len(items))]


async def _entry(engine: Engine, eid: str, *, leader: bool = False) -> RunInfo | None:
    entry = await engine.store.get_index_entry(eid, leader=leader)
    return info_or_none(entry[0]) if entry and entry[0] else None


async def _still_paused(
    engine: Engine, eid: str, info: RunInfo, seq: int, prune: bool
) -> RunInfo | None:
    """The run's entry if it is paused still. A ``run.resumed`` removes the listing in
    its write; one that is still there while the run is not paused (resumed by a worker
    of an earlier version, listed by the sweep of earlier pauses after its resume, or
    the resume sent and not taken yet: its marker is back) is not listed, and pruned
    (unless ``prune`` is False: a dry run writes nothing): removed if it is still the
    entry stored at ``seq`` (a run that paused again meanwhile wrote a newer one, which
    stays; one that pauses again later writes its own)."""
    now = await _paused_now(engine, eid, info.partition, leader=False)
    if now is not None or not prune:
        return now
    # before the listing goes, the leaders say: on R3 the replica that answered may not
    # hold the pause yet (a paused run would drop out of the paused listing for good)
    now = await _paused_now(engine, eid, info.partition, leader=True)
    if now is None:
        await engine.store.unlist("paused", info.workflow, eid, seq)
    return now


async def _paused_now(engine: Engine, eid: str, partition: int, *, leader: bool) -> RunInfo | None:
    """The run's entry if it is paused and has no active marker (not resumed)."""
    now = await _entry(engine, eid, leader=leader)
    if now is None or now.status != "paused":
        return None
    if await engine.store.has_run_marker(partition, eid, leader=leader):
        return None
    return now


async def _listed(
    engine: Engine, f: RunFilter, page: int, _prune: bool
) -> AsyncIterator[list[RunInfo]]:
    """Ended runs: their listing entries (final), then a previous fusee's final entries."""
    store = engine.store
    wanted = [f.status] if f.status is not None else list(ENDED_STATUSES)
    for status in wanted:
        async for found in store.listed_pages(status, f.workflow, page=page):
            yield _listed_of(f, found)
    async for old in store.legacy_pages(page=page):
        yield [i for _, raw in old if (i := info_or_none(raw)) and matches(i, f)]


def _listed_of(f: RunFilter, found: list[tuple[str, bytes, int]]) -> list[RunInfo]:
    return [i for _, raw, _ in found if (i := info_or_none(raw)) and matches(i, f)]


async def _paused(
    engine: Engine, f: RunFilter, page: int, prune: bool
) -> AsyncIterator[list[RunInfo]]:
    """Paused runs: their listing entries, each checked against the run's entry and
    marker (a listing stays when the run resumes: the marker it gets back says so)."""
    async for found in engine.store.listed_pages("paused", f.workflow, page=page):
        yield await _paused_of(engine, f, found, prune)


async def _paused_of(
    engine: Engine, f: RunFilter, found: list[tuple[str, bytes, int]], prune: bool
) -> list[RunInfo]:
    pf = msgspec.structs.replace(f, status="paused")
    candidates = [
        (eid, i, seq) for eid, raw, seq in found if (i := info_or_none(raw)) and matches(i, pf)
    ]
    checked = await _gather(candidates, lambda c: _still_paused(engine, *c, prune), CONCURRENCY)
    return [i for i in checked if i is not None]


async def _active(
    engine: Engine, f: RunFilter, page: int, _prune: bool
) -> AsyncIterator[list[RunInfo]]:
    """Runs that have not ended or paused: their active markers (each holds the run's
    workflow and start time), with the bucket's entry of each (``waiting``, a note);
    without one, ``running`` while the partition's owner answers, else ``pending``."""
    async for found in engine.store.marker_pages(page=page):
        yield await _active_of(engine, f, found)


async def _active_of(engine: Engine, f: RunFilter, found: list[tuple[str, bytes]]) -> list[RunInfo]:
    store = engine.store
    pre = None if f.id_prefix is None else escape(f.id_prefix)
    marked: dict[str, RunInfo] = {}
    for eid, raw in found:
        if pre is not None and not eid.startswith(pre):
            continue
        info = info_or_none(raw)
        if info is None or not matches(info, msgspec.structs.replace(f, status=None)):
            continue
        marked[eid] = info
    entries = dict(
        zip(
            marked,
            await _gather(list(marked), lambda e: _entry(engine, e), CONCURRENCY),
            strict=True,
        )
    )
    unindexed = []
    out = []
    for eid, info in marked.items():
        entry = entries.get(eid)
        if entry is not None and entry.ended:
            continue  # it ended: listed with the ended runs (its marker lingers a second)
        if entry is not None and entry.status != "paused":
            info = entry  # waiting, or a note on why nobody runs it
        else:
            # no entry, or a pause it was resumed from (its marker is back)
            info.status = "pending"
            unindexed.append(info)
        out.append(info)
    if unindexed:
        live = await store.live_partitions({i.partition for i in unindexed})
        for info in unindexed:
            if info.partition in live:
                info.status = "running"
    return [i for i in out if matches(i, f)]


async def iter_runs(
    engine: Engine,
    f: RunFilter,
    *,
    page: int = PAGE,
    only: tuple[str, ...] | None = None,
    prune: bool = True,
) -> AsyncIterator[list[RunInfo]]:
    """The runs the filter matches, a page at a time (each run once), from the parts of
    the index that can hold them (``only``: of those, these sources). ``prune``: remove
    the stale paused listings found (False: nothing is written)."""
    readers = {"active": _active, "paused": _paused, "listed": _listed}
    # Each run once per pass. A run read from the active or the paused source can be
    # met again later in the pass: a resume writes its marker again, a paused run
    # activated again lists itself again, and a run that ends or pauses between the
    # sources is listed again under its new status. So the IDs those two sources
    # yielded are kept, and dropped from every later page (the ended runs' pages
    # too). Ended runs' entries are final and are not remembered: the set holds the
    # active and paused runs only.
    seen: set[str] = set()
    for source in sources(f):
        if only is not None and source not in only:
            continue
        async for found in readers[source](engine, f, page, prune):
            found = [i for i in found if i.run_id not in seen]
            if source != "listed":
                seen.update(i.run_id for i in found)
            if found:
                yield found


def stages(f: RunFilter) -> list[tuple[str, str | None]]:
    """Where :func:`runs_page` reads, in order: ``(source, status)`` (``status`` for the
    ended runs' listings, one stage each)."""
    out: list[tuple[str, str | None]] = []
    for source in sources(f):
        if source == "listed":
            wanted = [f.status] if f.status is not None else list(ENDED_STATUSES)
            out += [("listed", status) for status in wanted]
        else:
            out.append((source, None))
    return out


async def runs_page(
    engine: Engine, f: RunFilter, *, stage: int = 0, start: int = 1, page: int = 100
) -> tuple[list[RunInfo], tuple[int, int] | None]:
    """One page of the runs the filter matches, for a reader that pages across calls
    (the HTTP API's cursor): the matches among at most ``page`` index entries read from
    stream sequence ``start`` of stage ``stage`` of :func:`stages`, and where the next
    page starts (``(stage, start)``; None: nothing more). A page can hold fewer than
    ``page`` runs (or none) and still have a next one. Nothing is remembered between
    pages: a run that ends or pauses between two calls can be met again in a later
    stage (the pass of :func:`iter_runs` keeps a set; a cursor cannot), and the final
    entries of a fusee before listings (``legacy_pages``) are not read."""
    plan = stages(f)
    store = engine.store
    while stage < len(plan):
        source, status = plan[stage]
        if source == "active":
            markers, after = await store.marker_page(start=start, page=page)
            found = await _active_of(engine, f, markers)
        elif source == "paused":
            listed, after = await store.listed_page("paused", f.workflow, start=start, page=page)
            found = await _paused_of(engine, f, listed, True)
        else:
            listed, after = await store.listed_page(status, f.workflow, start=start, page=page)
            found = _listed_of(f, listed)
        if after is not None:
            return found, (stage, after)
        stage, start = stage + 1, 1
        if found:
            return found, ((stage, start) if stage < len(plan) else None)
    return [], None


async def bulk(
    engine: Engine,
    action: Action,
    f: RunFilter,
    *,
    reason: str = "cancelled",
    dry_run: bool = False,
    concurrency: int = CONCURRENCY,
    page: int = PAGE,
    on_run: OnRun | None = None,
) -> BulkSummary:
    """Resume or cancel every run the filter matches; see :meth:`Engine.bulk_cancel`."""
    if concurrency < 1:
        raise ConfigError(f"concurrency={concurrency!r}: must be at least 1")
    if action == "resume":
        if f.status not in (None, "paused"):
            raise ConfigError(f"status={f.status!r}: bulk resume acts on paused runs only")
        f = msgspec.structs.replace(f, status="paused")
        only: tuple[str, ...] = ("paused",)
    else:
        if f.status in ENDED_STATUSES:
            raise ConfigError(f"status={f.status!r}: an ended run cannot be cancelled")
        only = ("active", "paused")
    summary = BulkSummary(action=action, dry_run=dry_run)
    tell = on_run or (lambda _info, _what: None)

    async def act(info: RunInfo) -> None:
        # a dry run asks each run the same (dry_run: the same reads, nothing stored)
        run = engine.run(info.run_id)
        failure: FuseeError | None = None
        acted = False
        try:
            if action == "cancel":
                acted = await run.cancel(reason, dry_run=dry_run)  # False: it ended meanwhile
            else:
                await run.resume(dry_run=dry_run)
                acted = True
        except NotPausedError as exc:
            # resumed since it was listed (skipped), or paused on a broken journal chain:
            # that one needs resume(force=True) and stays paused, for an operator to see
            failure = exc if exc.status == "paused" else None
        except RunNotFound:
            pass  # gone since it was listed
        except FuseeError as exc:
            failure = exc
        if failure is not None:
            summary.failed[info.run_id] = f"{type(failure).__name__}: {failure}"
            tell(info, "failed")
            return
        if acted:
            summary.done += 1
        else:
            summary.skipped += 1
        tell(info, ("would" if dry_run else "done") if acted else "skipped")

    async for found in iter_runs(engine, f, page=page, only=only, prune=not dry_run):
        await _gather(found, act, concurrency)
    return summary
