"""A namespace's KV buckets on the stream of its epoch.

A bucket keeps its name and subjects (``$KV.<bucket>.<key>``) in every epoch; its
stream is the epoch's (``Layout.kv_stream``: ``KV_<bucket>``, then ``KV_<bucket>_E2``
...), so that a failover promotes the partner region's mirror of it in place, as it
does the journal's. nats-py's ``key_value``/``create_key_value`` know only
``KV_<bucket>``: this opens and makes a bucket on the epoch's stream, with the
settings ``create_key_value`` gives a bucket of history 1 with direct gets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, Placement, StorageType, StreamConfig
from nats.js.kv import KeyValue

from fusee.adapters.jetstream.direct import retrying
from fusee.adapters.jetstream.layout import EXPECTED_STREAM, WRONG_STREAM, Layout
from fusee.errors import ConfigError, FailedOver, FuseeError

__all__ = ("DESCRIPTIONS", "BucketFence", "bucket_config", "bucket_on", "open_bucket")

# what each bucket holds, by kind (``layout.BUCKETS``): its stream's description
DESCRIPTIONS = {
    "runs": "fusee: the run index",
    "work": "fusee: active runs and partition owners",
    "objects": "fusee: keyed objects' state",
    "auth": "fusee: API tokens (hashes only)",
}


def bucket_config(
    layout: Layout, bucket: str, *, replicas: int, description: str | None = None
) -> StreamConfig:
    """The stream of ``bucket`` in ``layout``'s epoch, placed in its home region."""
    return StreamConfig(
        name=layout.kv_stream(bucket),
        description=description,
        subjects=[f"$KV.{bucket}.>"],
        storage=StorageType.FILE,
        num_replicas=replicas,
        placement=Placement(cluster=layout.home) if layout.home else None,
        # as nats-py's create_key_value makes a bucket of history 1 with direct gets
        max_msgs_per_subject=1,
        discard=DiscardPolicy.NEW,
        allow_rollup_hdrs=True,
        allow_msg_ttl=True,
        allow_direct=True,
        deny_delete=True,
        duplicate_window=120.0,
    )


@dataclass(frozen=True)
class BucketFence:
    """When a bucket's writes name its epoch's stream: while ``applies()`` (a process
    that does not follow a failover, a worker's); ``over()`` says what a refusal
    (10060) means, raised as :class:`FailedOver`."""

    applies: Callable[[], bool]
    over: Callable[[], str]


class _FencedPublisher:
    """The JetStream context a fenced bucket's KV client publishes through: every
    write (put, update, create, delete, purge: nats-py's KV client has no headers
    parameter, and publishes each through ``js.publish``) names the bucket's stream in
    ``Nats-Expected-Stream`` while the fence applies. A bucket keeps its subjects
    across a failover, so a zombie's write reaches the new home's bucket, whose stream
    is the next epoch's: refused there (10060) instead of stored, where a release with
    the zombie's revision (the mirror kept them) could delete a live owner's record.
    Everything else is the context's own."""

    def __init__(self, js: JetStreamContext, stream: str, fence: BucketFence) -> None:
        self._js = js
        self._stream = stream
        self._fence = fence

    def __getattr__(self, name: str) -> Any:
        return getattr(self._js, name)

    async def publish(self, subject: str, *args: Any, **kwargs: Any) -> Any:
        if self._fence.applies():
            kwargs["headers"] = {**(kwargs.get("headers") or {}), EXPECTED_STREAM: self._stream}
        try:
            return await self._js.publish(subject, *args, **kwargs)
        except nats.js.errors.APIError as exc:
            if exc.err_code == WRONG_STREAM:
                raise FailedOver(self._fence.over()) from None
            raise


def bucket_on(
    js: JetStreamContext,
    layout: Layout,
    bucket: str,
    *,
    direct: bool = True,
    fence: BucketFence | None = None,
) -> KeyValue:
    """The KV client of ``bucket`` on its epoch's stream (nothing asked of the server),
    its writes fenced by the epoch with ``fence``."""
    stream = layout.kv_stream(bucket)
    via = js if fence is None else cast("JetStreamContext", _FencedPublisher(js, stream, fence))
    return KeyValue(name=bucket, stream=stream, pre=f"$KV.{bucket}.", js=via, direct=direct)


async def open_bucket(
    js: JetStreamContext,
    layout: Layout,
    bucket: str,
    *,
    create: bool,
    replicas: int = 1,
    description: str | None = None,
    refused: Callable[[], FuseeError | None] | None = None,
    fence: BucketFence | None = None,
) -> KeyValue | None:
    """The bucket, made if it does not exist and ``create`` (None when it does not and
    not ``create``; its writes fenced with ``fence``). A concurrent maker's bucket is
    taken as it is."""
    stream = layout.kv_stream(bucket)
    try:
        info = await retrying(js.stream_info, stream, refused=refused)
    except nats.js.errors.NotFoundError:
        if not create:
            return None
        config = bucket_config(layout, bucket, replicas=replicas, description=description)
        try:
            await retrying(js.add_stream, config, refused=refused)
        except nats.js.errors.BadRequestError as exc:
            # a concurrent maker's is taken; any other refusal is said (10065: another
            # stream binds the bucket's subjects, e.g. one left by an earlier layout)
            try:
                await retrying(js.stream_info, stream, refused=refused)
            except nats.js.errors.NotFoundError:
                raise ConfigError(
                    f"bucket {bucket}: its stream {stream} cannot be made: {exc.description} "
                    f"(err {exc.err_code}; a stream of an earlier fusee may bind "
                    f'$KV.{bucket}.>: docs/operations.md, "Two regions")'
                ) from None
        return bucket_on(js, layout, bucket, fence=fence)
    return bucket_on(js, layout, bucket, direct=bool(info.config.allow_direct), fence=fence)
