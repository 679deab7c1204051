"""A namespace's regions on JetStream: which stream is its journal now, its mirror in
the partner region, and how far behind that mirror is.

The names and metadata are the pure core's (``fusee.runtime.regions``); this module
reads and writes them with nats-py. The failover procedure is in ``failover.py``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import Placement, StorageType, StreamConfig, StreamSource

from fusee.adapters.jetstream.buckets import DESCRIPTIONS, bucket_config, open_bucket
from fusee.adapters.jetstream.direct import retrying, retrying_for
from fusee.adapters.jetstream.layout import BUCKETS, Layout
from fusee.errors import ConfigError, ConnectionLost, FuseeError
from fusee.runtime.regions import HOME, RegionMeta, epoch_of_stream, epoch_stream

# in a mirror's metadata: the region of its origin (read when that region does not answer)
FROM = "fusee.from"

# how long a connect asks the journal stream for its metadata before it reads its
# mirror's instead (a lost region's stream is known to the meta group, but silent)
ORIGIN_PATIENCE = 5.0

__all__ = (
    "MirrorLag",
    "current_stream",
    "ensure_mirror",
    "find_layout",
    "mirror_configs",
    "mirror_lag",
    "pending_promotion",
)


async def _stream_names(nc: Client, request: dict[str, Any]) -> dict[str, Any]:
    """The meta leader's answer to a ``STREAM.NAMES`` request (its error raised as
    nats-py's ``APIError``: nats-py's own call of it has no subject filter)."""
    body = json.dumps(request).encode()
    reply: dict[str, Any] = json.loads(
        (await nc.request("$JS.API.STREAM.NAMES", body, timeout=5.0)).data
    )
    if "error" in reply:
        err = reply["error"]
        raise nats.js.errors.APIError(
            code=err.get("code"), err_code=err.get("err_code"), description=err.get("description")
        )
    return reply


async def current_stream(
    nc: Client, namespace: str, refused: Callable[[], FuseeError | None] | None = None
) -> str | None:
    """The stream that binds the namespace's journal subjects now (mirrors bind none),
    or the one a planned handover closed to writes, as the meta leader knows it; None
    when there is none."""

    async def names(subject: str) -> list[str]:
        return list((await _stream_names(nc, {"subject": subject})).get("streams") or [])

    what = "the namespace's journal stream"
    for subject in (f"{namespace}.run.>", f"{namespace}.closed.>"):
        # then one a planned handover closed to writes (failover.py) and has not
        # deleted yet: still the namespace's current epoch
        found = await retrying(names, subject, what=what, refused=refused)
        ours = [n for n in found if epoch_of_stream(namespace, n) is not None]
        if ours:
            return ours[0]
    return None


async def pending_promotion(
    nc: Client, namespace: str, refused: Callable[[], FuseeError | None] | None = None
) -> str | None:
    """The journal mirror of the namespace's latest epoch when no stream binds its
    journal subjects (:func:`current_stream` is None): a failover between the deletion
    of the old home's streams and the promotion of the mirror (its lease wait, or one
    interrupted there). None when the namespace has no such stream (a new namespace)."""

    async def page(offset: int) -> tuple[list[str], int]:
        reply = await _stream_names(nc, {"offset": offset})
        return list(reply.get("streams") or []), int(reply.get("total") or 0)

    candidates: list[tuple[int, str]] = []
    offset = 0
    while True:
        found, total = await retrying(page, offset, what="the streams", refused=refused)
        for name in found:
            epoch = epoch_of_stream(namespace, name)
            if epoch is not None and epoch > 1:
                candidates.append((epoch, name))
        offset += len(found)
        if not found or offset >= total:
            break
    js = nc.jetstream(timeout=5.0)
    for epoch, name in sorted(candidates, reverse=True):
        # only the mirror of this namespace's previous epoch: a name alone may be
        # another namespace's own stream (namespace "app_e2" has stream APP_E2)
        try:
            info = await retrying(js.stream_info, name, what=f"stream {name}", refused=refused)
        except nats.js.errors.NotFoundError:
            continue
        mirror = info.config.mirror
        origin = epoch_stream(namespace, epoch - 1)
        recorded = RegionMeta.from_metadata(info.config.metadata, epoch)
        if mirror is not None and mirror.name == origin and recorded.home is not None:
            return name  # (a fusee mirror records its home-to-be)
    return None


async def find_layout(nc: Client, namespace: str, region: str) -> tuple[Layout, RegionMeta]:
    """The layout of ``namespace`` for a process in ``region``: the epoch and home its
    journal stream names, or, for a namespace not created yet, epoch 1 with its home
    in ``region`` (the first process makes it so).

    Raises:
        ConfigError: the namespace exists without regions (its stream records no home).
    """
    js = nc.jetstream(timeout=5.0)
    name = await current_stream(nc, namespace)
    if name is None:
        # no stream binds the journal: a new namespace, or one failing over (its old
        # home's streams deleted, its mirror not promoted yet). The latter's layout is
        # the mirror's epoch: a process made now must not make an epoch-1 stream, whose
        # subjects would stop the promotion (its appends wait for the promotion)
        name = await pending_promotion(nc, namespace)
        if name is None:
            return Layout(namespace, 1, region), RegionMeta(region, 1)
    epoch = epoch_of_stream(namespace, name)
    assert epoch is not None
    try:
        with retrying_for(ORIGIN_PATIENCE):
            info = await retrying(js.stream_info, name, what=f"stream {name}")
        meta = RegionMeta.from_metadata(info.config.metadata, epoch)
    except ConnectionLost:
        # no replica of it answers (its region is lost): what its mirror recorded
        nxt = Layout(namespace, epoch + 1).stream
        try:
            mirror = await retrying(js.stream_info, nxt, what=f"mirror {nxt}")
        except nats.js.errors.NotFoundError:
            raise ConnectionLost(
                f"stream {name} of namespace {namespace!r} does not answer, and it has no mirror"
            ) from None
        md = dict(mirror.config.metadata or {})
        md[HOME] = md.get(FROM, "")
        meta = RegionMeta.from_metadata(md, epoch)
    if meta.home is None:
        raise ConfigError(
            f"namespace {namespace!r} was created without a region (stream {name} records "
            "no home): connect to it without region=, or use a new namespace"
        )
    return Layout(namespace, epoch, meta.home), meta


def mirror_layout(layout: Layout) -> Layout:
    """The layout the mirror of ``layout``'s journal belongs to: the next epoch's."""
    return Layout(layout.namespace, layout.epoch + 1, None)


async def ensure_mirror(
    js: JetStreamContext,
    layout: Layout,
    partner: str,
    replicas: int,
    partitions: int,
    tokens: StreamConfig | None = None,
    refused: Callable[[], FuseeError | None] | None = None,
) -> None:
    """Create the partner region's mirrors of what the namespace keeps, if missing:
    the journal, values and token streams and the four KV buckets, each named as the
    next epoch's (:func:`mirror_configs`), so that a failover promotes them in place
    (same sequences: a bucket's revisions and a token stream's offsets carry over).
    ``tokens``: the token stream's configuration in the next epoch (its retention),
    None for no token mirror."""
    for kind in BUCKETS:
        # a mirror made before its origin waits for it with the server's backoff (a
        # drill's API-token bucket, made after, was still 1 behind 30 s later): each
        # bucket is made first (API tokens' is otherwise made by the first token)
        await open_bucket(
            js, layout, layout.bucket(kind), create=True, replicas=replicas,
            description=DESCRIPTIONS[kind], refused=refused,
        )  # fmt: skip
    for config in mirror_configs(layout, partner, replicas, partitions, tokens):
        try:
            await retrying(
                js.stream_info, config.name, what=f"mirror {config.name}", refused=refused
            )
        except nats.js.errors.NotFoundError:
            with contextlib.suppress(nats.js.errors.BadRequestError):  # a concurrent maker
                await retrying(js.add_stream, config, what=f"mirror {config.name}", refused=refused)


def mirror_configs(
    layout: Layout,
    partner: str,
    replicas: int,
    partitions: int,
    tokens: StreamConfig | None = None,
) -> list[StreamConfig]:
    """The mirrors :func:`ensure_mirror` makes in ``partner``, in the order a failover
    promotes them (the journal last: a process that follows the failover sees the
    journal move once everything else has). Their metadata records the partner as
    their home-to-be and the partition count.

    A bucket's mirror keeps its subjects (``$KV.<ns>_work.<key>``): promoted, it is
    the same bucket on the next epoch's stream (``Layout.kv_stream``). The mirror of
    a bucket not made yet (API tokens are made when the first one is) waits for its
    origin."""
    nxt = mirror_layout(layout)
    meta = RegionMeta(partner, nxt.epoch, partitions).to_metadata()
    if layout.home is not None:
        meta[FROM] = layout.home
    out: list[StreamConfig] = []
    for kind in BUCKETS:
        bucket = layout.bucket(kind)
        origin = layout.kv_stream(bucket)
        mirrored = bucket_config(nxt, bucket, replicas=replicas)
        mirrored.description = (
            f"fusee: mirror of bucket {bucket}'s {origin} (promoted by a failover to {partner})"
        )
        mirrored.subjects = None
        mirrored.mirror = StreamSource(name=origin)
        mirrored.placement = Placement(cluster=partner)
        mirrored.metadata = meta
        out.append(mirrored)
    if tokens is not None:
        mirrored = StreamConfig.from_response(tokens.as_dict())
        mirrored.name = nxt.tokens_stream
        mirrored.description = (
            f"fusee: mirror of {layout.tokens_stream} (promoted by a failover to {partner})"
        )
        mirrored.subjects = None
        mirrored.mirror = StreamSource(name=layout.tokens_stream)
        mirrored.placement = Placement(cluster=partner)
        mirrored.num_replicas = replicas
        mirrored.metadata = meta
        out.append(mirrored)
    for origin, name in ((layout.values_stream, nxt.values_stream), (layout.stream, nxt.stream)):
        out.append(
            StreamConfig(
                name=name,
                description=f"fusee: mirror of {origin} (promoted by a failover to {partner})",
                mirror=StreamSource(name=origin),
                storage=StorageType.FILE,
                num_replicas=replicas,
                placement=Placement(cluster=partner),
                allow_direct=True,
                # as its origin (a promotion may not lift it: 10052)
                deny_delete=origin == layout.stream,
                metadata=meta,
            )
        )
    return out


@dataclass(frozen=True)
class MirrorLag:
    """How far the partner region's mirror of the journal is behind its origin.

    ``behind``: records the origin holds that the mirror does not (what a failover now
    would lose at most); ``lag``: the mirror's own count, as of its last fetch
    (``mirror.lag`` of ``nats stream info``); ``active``: seconds since the mirror last
    heard from its origin (None: never)."""

    origin: str
    mirror: str
    region: str | None
    origin_last_seq: int
    mirror_last_seq: int
    lag: int
    active: float | None

    @property
    def behind(self) -> int:
        return max(0, self.origin_last_seq - self.mirror_last_seq)


async def mirror_lag(js: JetStreamContext, layout: Layout) -> MirrorLag | None:
    """The journal mirror's lag, or None when the namespace has no mirror."""
    nxt = mirror_layout(layout)
    try:
        mirror = await retrying(js.stream_info, nxt.stream, what=f"mirror {nxt.stream}")
    except nats.js.errors.NotFoundError:
        return None
    origin = await retrying(js.stream_info, layout.stream, what=f"stream {layout.stream}")
    source = mirror.mirror
    # nanoseconds since the mirror last heard from its origin (-1: never)
    nanos = source.active if source is not None else None
    active = nanos / 1e9 if nanos is not None and nanos >= 0 else None
    return MirrorLag(
        origin=layout.stream,
        mirror=nxt.stream,
        region=(mirror.config.metadata or {}).get("fusee.home"),
        origin_last_seq=int(origin.state.last_seq),
        mirror_last_seq=int(mirror.state.last_seq),
        lag=int(source.lag or 0) if source is not None else 0,
        active=active,
    )
