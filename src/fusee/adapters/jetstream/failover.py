"""Failing a regional namespace over to its partner region (docs/operations.md, "Two
regions"): the procedure ``fusee region failover --to west`` runs.

1. Read the namespace's epoch and home from its journal stream, and the mirror of the
   next epoch in the target region (its metadata names it as the home-to-be).
2. If the old home still answers (a planned handover: its workers stopped first),
   close its streams and buckets to writes and wait until each mirror holds every
   record of its origin; otherwise note how far behind the
   mirror was when it last heard from its origin: that tail is lost (the RPO).
3. Delete the old home's streams and buckets through the meta group (the witness
   keeps its quorum with a region down; a delete may time out yet land, so each is
   asked again until the stream is gone). A server of the old home that comes back
   is told by the meta group to drop its copies.
4. If the old home did not answer, wait the region lease after the deletes (a home
   that is cut off, not dead, stops appending by then: its last renewal came before
   them).
5. Promote the mirrors in place: the buckets' mirrors become the buckets of the new
   epoch (stream ``KV_<ns>_work_E2``, ...: objects' state, the namespace's secret, API
   tokens, limits, markers), then the token, values and journal mirrors the new epoch's streams
   (subjects, atomic batches, schedules; metadata: the new home, the epoch, the
   partition count), each record keeping its stream sequence (a bucket's revisions).

A failover interrupted after step 3 (its process killed during the lease wait) leaves
no stream binding the journal's subjects: a process connecting then takes the
mirror's epoch (``find_layout``), and the failover asked again resumes at step 4.

Workers started in the new home (``--region west``) then take the runs over: their
active markers are in the journal. A writer of the old epoch names the old stream in
every append and is refused by the promoted one (10060): fenced.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import anyio
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from fusee.adapters.jetstream.direct import retrying
from fusee.adapters.jetstream.layout import BUCKETS, Layout
from fusee.adapters.jetstream.regions import FROM, mirror_layout
from fusee.adapters.jetstream.store import (
    NatsStore,
    journal_stream_config,
    values_stream_config,
)
from fusee.errors import ConnectionLost, FuseeError
from fusee.logs import get_logger
from fusee.runtime.regions import RegionMeta, failover_meta, region_lease

__all__ = ("FailoverReport", "fail_over")

log = get_logger()

# how long a delete of a dead region's stream is asked again, and a planned
# handover waits for its mirror to catch up
DELETE_PATIENCE = 60.0
CATCH_UP = 30.0


@dataclass(frozen=True)
class FailoverReport:
    """What a failover did: from and to which region, the new epoch, the journal's
    last sequence in the promoted stream, how many records the old home held that the
    mirror did not (None: the old home did not answer, so the count is unknown; at
    most the mirror's last reported ``lag``), and how long it took."""

    namespace: str
    from_region: str
    to_region: str
    epoch: int
    stream: str
    last_seq: int
    lost: int | None
    last_lag: int
    planned: bool
    seconds: float


async def fail_over(store: NatsStore, to: str, *, lease: float | None = None) -> FailoverReport:
    """Fail the namespace of ``store`` (connected to region ``to``'s servers) over to
    region ``to`` (see the module's steps). When the old home does not answer, the
    mirrors are promoted only ``lease`` seconds (default: ``region_lease()``, the
    workers' own) after the old home's streams are deleted: a home that is cut off but
    alive has stopped appending by then, its workers' lease run out (they last renewed
    it before the deletes the meta quorum, which this side holds, committed).

    Raises:
        InvalidArgument: ``to`` is already the home, or the namespace has no regions.
        FuseeError: there is no mirror of the journal in ``to`` (name it in
            ``connect(partner=)`` while the home is up), or a stream would not go.
    """
    began = time.monotonic()
    lease = region_lease() if lease is None else lease  # (checked before anything goes)
    layout, js = store.layout, store.js
    nxt = mirror_layout(layout)
    try:
        mirror = await retrying(js.stream_info, nxt.stream, what=f"mirror {nxt.stream}")
    except nats.js.errors.NotFoundError:
        try:
            with anyio.fail_after(5.0):
                own = await js.stream_info(layout.stream)
        except (TimeoutError, nats.errors.Error):
            own = None  # (the home lost: no mirror to promote, said below)
        if own is not None and own.config.mirror is not None:
            # an interrupted failover: the mirror of this epoch waits for its promotion
            return await _promote_pending(store, own, to, lease, began)
        failover_meta(RegionMeta(layout.home, layout.epoch), to)  # ``to`` is home already?
        raise FuseeError(
            f"namespace {layout.namespace!r} has no mirror {nxt.stream}: a failover needs "
            f"the partner region's mirror (connect(partner={to!r}) while {layout.home} is up)"
        ) from None
    recorded = RegionMeta.from_metadata(mirror.config.metadata, nxt.epoch)
    if recorded.home != to:
        raise FuseeError(
            f"mirror {nxt.stream} is for region {recorded.home!r}, not {to!r}: fail over "
            f"to {recorded.home!r}"
        )
    new = failover_meta(RegionMeta(layout.home, layout.epoch, recorded.partitions), to)
    lost, planned = await _catch_up(js, layout, nxt)
    last_lag = int(mirror.mirror.lag or 0) if mirror.mirror is not None else 0
    async with anyio.create_task_group() as tg:
        for name in _kept(layout):
            tg.start_soon(_delete, js, name)
    if not planned:
        # A home cut off (not dead) appends until its workers' lease runs out. Counted
        # from the deletes, which the meta group committed: a renewal after them gets
        # "not found" (the epoch fences what follows), one before them is the last
        # that can hold the lease (a flapping partition may let one through late)
        log.info("region.waiting_for_lease", seconds=lease)
        await anyio.sleep(lease)
    home = Layout(layout.namespace, new.epoch, to)
    replicas = mirror.config.num_replicas or store.replicas
    return await _promote(
        js, home, new, replicas,
        from_region=str(layout.home), lost=lost, last_lag=last_lag, planned=planned,
        began=began,
    )  # fmt: skip


async def _promote(
    js: JetStreamContext,
    home: Layout,
    new: RegionMeta,
    replicas: int,
    *,
    from_region: str,
    lost: int | None,
    last_lag: int,
    planned: bool,
    began: float,
) -> FailoverReport:
    """Step 5: the mirrors become the journal and values streams of ``home``; what
    the failover did, logged."""
    # the buckets and token streams first, the journal last: a process following the
    # failover moves when the journal does, and finds the rest writable
    for kind in BUCKETS:
        bucket = home.bucket(kind)
        await _promote_mirror(js, home.kv_stream(bucket), [f"$KV.{bucket}.>"], new)
    await _promote_mirror(js, home.tokens_stream, [f"{home.namespace}.tok.>"], new)
    journal = journal_stream_config(home, replicas, new)
    values = values_stream_config(home, replicas)
    values.metadata = new.to_metadata()
    for config in (values, journal):
        await retrying(js.update_stream, config, what=f"the promotion of {config.name}")
    info = await retrying(js.stream_info, home.stream, what=f"stream {home.stream}")
    report = FailoverReport(
        namespace=home.namespace,
        from_region=from_region,
        to_region=str(home.home),
        epoch=new.epoch,
        stream=home.stream,
        last_seq=int(info.state.last_seq),
        lost=lost,
        last_lag=last_lag,
        planned=planned,
        seconds=time.monotonic() - began,
    )
    log.info("region.failed_over", **report.__dict__)
    return report


async def _promote_pending(
    store: NatsStore, mirror: Any, to: str, lease: float, began: float
) -> FailoverReport:
    """Steps 4 and 5 of a failover interrupted after its deletes (``store``'s layout is
    the epoch of the mirror no stream binds beside, :func:`find_layout`): the lease
    waited again (when the deletes landed is not known), the epoch-named streams of
    the old epoch deleted if any is left, the mirrors promoted."""
    layout, js = store.layout, store.js
    recorded = RegionMeta.from_metadata(mirror.config.metadata, layout.epoch)
    if recorded.home != to:
        raise FuseeError(
            f"the failover of namespace {layout.namespace!r} to {recorded.home!r} was "
            f"interrupted ({mirror.config.name} is not promoted yet): fail over to "
            f"{recorded.home!r} to finish it"
        )
    log.warning("region.resuming_failover", stream=mirror.config.name, seconds=lease)
    async with anyio.create_task_group() as tg:
        for name in _kept(Layout(layout.namespace, layout.epoch - 1)):
            tg.start_soon(_delete, js, name)
    await anyio.sleep(lease)
    new = RegionMeta(to, layout.epoch, recorded.partitions)
    lag = mirror.mirror
    return await _promote(
        js, Layout(layout.namespace, layout.epoch, to), new,
        mirror.config.num_replicas or store.replicas,
        from_region=str((mirror.config.metadata or {}).get(FROM, "")), lost=None,
        last_lag=int(lag.lag or 0) if lag is not None else 0, planned=False, began=began,
    )  # fmt: skip


def _kept(layout: Layout) -> list[str]:
    """The streams that hold what the namespace keeps in ``layout``'s epoch: the
    journal, values and token streams and each bucket's (what a failover deletes in the
    old home and promotes the mirrors of)."""
    names = [layout.stream, layout.values_stream, layout.tokens_stream]
    return names + [layout.kv_stream(layout.bucket(kind)) for kind in BUCKETS]


async def _promote_mirror(
    js: JetStreamContext, name: str, subjects: list[str], new: RegionMeta
) -> None:
    """Make the mirror ``name`` a stream of the new home taking ``subjects`` (its own
    settings kept: a bucket's, a token stream's retention). A mirror that is not there
    (made by a fusee that mirrored the journal and values only) is left for the new
    home's first process to make empty, as before; one promoted already is left as is
    (a failover asked again)."""
    try:
        info = await retrying(js.stream_info, name, what=f"mirror {name}")
    except nats.js.errors.NotFoundError:
        log.warning("region.no_mirror", stream=name)
        return
    config = info.config
    if config.mirror is None:
        return
    config.mirror = None
    config.subjects = subjects
    config.metadata = {**(config.metadata or {}), **new.to_metadata()}
    config.metadata.pop(FROM, None)
    await retrying(js.update_stream, config, what=f"the promotion of {name}")


async def _catch_up(js: JetStreamContext, layout: Layout, nxt: Layout) -> tuple[int | None, bool]:
    """If the old home answers, close its streams and buckets to writes and wait (up to
    ``CATCH_UP``) until each mirror holds its origin's last record: ``(0, True)``. ``(None,
    False)`` when it does not answer (a region lost).

    Raises:
        FuseeError: the mirror did not catch up in time (nothing deleted; asked again,
            the failover waits again).
    """
    try:
        with anyio.fail_after(5.0):
            origin = await js.stream_info(layout.stream)
    except (TimeoutError, nats.errors.Error, ConnectionLost):
        return None, False
    if origin.cluster is not None and not origin.cluster.leader:
        return None, False  # known to the meta group, but no replica of it answers
    # closed to writes first, so that nothing is stored after the last sequence the
    # mirror must reach (a client, an API or a worker of the old home still appending):
    # what was acknowledged is all in the mirror before anything is deleted. The
    # streams take no subject of the namespace's any more (a stream with message
    # schedules cannot be sealed: nats-server 2.15 refuses it, 10052); their mirrors
    # read on, by consumer
    closed = f"{layout.namespace}.closed.e{layout.epoch}"
    parts = ["run", "val", "tok", *(f"kv.{kind}" for kind in BUCKETS)]  # (_kept's order)
    origins, mirrors = _kept(layout), _kept(nxt)
    targets: dict[str, tuple[str, int]] = {}  # mirror -> (origin, its last sequence)
    for name, mirror_name, part in zip(origins, mirrors, parts, strict=True):
        try:
            closing = (await retrying(js.stream_info, name, what=f"stream {name}")).config
        except nats.js.errors.NotFoundError:
            continue  # (a bucket of an earlier fusee, which made API tokens' at the first)
        if closing.subjects != [f"{closed}.{part}"]:
            closing.subjects = [f"{closed}.{part}"]
            await retrying(js.update_stream, closing, what=f"closing {name} to writes")
        last = int((await retrying(js.stream_info, name, what=f"stream {name}")).state.last_seq)
        targets[mirror_name] = (name, last)
    closed_at = time.monotonic()

    async def behind() -> dict[str, int]:
        out: dict[str, int] = {}
        for mirror_name, (_, target) in targets.items():
            try:
                info = await retrying(js.stream_info, mirror_name, what=f"mirror {mirror_name}")
            except nats.js.errors.NotFoundError:
                if mirror_name == nxt.stream:
                    raise
                continue  # (a fusee that mirrored the journal and values only)
            if int(info.state.last_seq) >= target:
                continue
            # the origin's last message may be gone before the mirror copied it (a
            # message TTL, an idle marker's): then the mirror never reaches its
            # sequence, but it fetched after the close with nothing left to copy
            source = info.mirror
            heard = source.active / 1e9 if source is not None and source.active else None
            if (
                source is not None
                and not source.lag
                and heard is not None
                and 0 <= heard < time.monotonic() - closed_at
            ):
                continue
            out[mirror_name] = target - int(info.state.last_seq)
        return out

    with anyio.move_on_after(CATCH_UP):
        while True:
            if not await behind():
                return 0, True
            await anyio.sleep(0.1)  # a mirror offers no event for its progress
    left = await behind()
    if not left:
        return 0, True
    said = ", ".join(f"{m} {n} behind {targets[m][0]}" for m, n in sorted(left.items()))
    raise FuseeError(
        f"mirrors still behind after {CATCH_UP:.0f}s: {said}; nothing was deleted "
        f"({layout.stream} and the rest take no more writes); run the failover again to "
        "wait again"
    )


async def _delete(js: JetStreamContext, name: str) -> None:
    """Delete stream ``name`` through the meta group, asking again until it is gone
    (with its peers down the answer may not come, though the delete lands)."""
    deadline = time.monotonic() + DELETE_PATIENCE
    while True:
        try:
            # the meta leader answers once the stream's peers do, or not at all
            # (they are down): the delete lands meanwhile, the stream_info below sees it
            with anyio.fail_after(2.0):
                await js.delete_stream(name)
            return
        except nats.js.errors.NotFoundError:
            return
        except (TimeoutError, nats.errors.Error) as exc:
            try:
                with anyio.fail_after(2.0):
                    await js.stream_info(name)
            except nats.js.errors.NotFoundError:
                return
            except (TimeoutError, nats.errors.Error):
                pass
            if time.monotonic() > deadline:
                raise FuseeError(
                    f"stream {name} of the old home was not deleted within "
                    f"{DELETE_PATIENCE:.0f}s: {type(exc).__name__}: {exc}"
                ) from exc
