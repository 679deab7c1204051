"""The namespace's API tokens in NATS: the ``<ns>_auth`` KV bucket, and a watch on it.

One entry per token, keyed by its ID, holding its hash, scope, name, creation and
expiry as JSON (``fusee._tokens`` makes them; the token itself is never stored). The
bucket is made only by :meth:`AuthBucket.create` (``fusee tokens create``, an admin's
NATS rights), never by a read: an API that checks tokens needs only read and watch
rights on it (docs/security.md lists the subjects), and a namespace without tokens has
no bucket. A revoke deletes the entry. :meth:`AuthBucket.follow` delivers every entry
(the last of each key), then every change, to the API process: an ordered consumer,
its callback run by nats-py on the connection.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.kv import KeyValue

from fusee.adapters.jetstream.buckets import DESCRIPTIONS, open_bucket
from fusee.adapters.jetstream.direct import retrying

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from fusee.adapters.jetstream.layout import Layout

__all__ = ("AuthBucket",)

OnChange = Callable[[str, bytes | None], Awaitable[None]]
OnCurrent = Callable[[], None]

# what a key's last message says when it holds no value (a delete, a purge, or a
# server-placed marker of nats-server 2.11+)
_GONE_OPS = frozenset({"DEL", "PURGE"})
_GONE_MARKERS = frozenset({"MaxAge", "Purge", "Remove"})


class AuthBucket:
    """The ``<ns>_auth`` bucket: ``create``/``get``/``entries``/``delete`` and ``follow``."""

    def __init__(
        self, nc: Client, js: JetStreamContext, layout: Layout, *, replicas: int = 1
    ) -> None:
        self.nc = nc
        self.js = js
        self.layout = layout  # the epoch names the bucket's stream (Layout.kv_stream)
        self.name = layout.auth_bucket
        self.replicas = replicas
        self._kv: KeyValue | None = None

    def follow_epoch(self, layout: Layout) -> None:
        """The namespace failed over (``NatsStore.follow_epoch``): the bucket of
        ``layout``'s epoch (the old home's promoted mirror) from now on."""
        self.layout = layout
        self._kv = None

    @property
    def connected(self) -> bool:
        """Whether the connection is up (a watch is current only while it is)."""
        return bool(self.nc.is_connected)

    async def _existing(self) -> KeyValue | None:
        """The bucket, if it exists: reads never make it."""
        if self._kv is None:
            self._kv = await open_bucket(self.js, self.layout, self.name, create=False)
        return self._kv

    async def _bucket(self) -> KeyValue:
        """The bucket, made if it does not exist (``create`` only: an admin's right)."""
        kv = await self._existing()
        if kv is not None:
            return kv
        self._kv = await open_bucket(
            self.js, self.layout, self.name, create=True, replicas=self.replicas,
            description=DESCRIPTIONS["auth"],
        )  # fmt: skip
        assert self._kv is not None
        return self._kv

    async def create(self, key: str, value: bytes) -> bool:
        """Store ``value`` under ``key`` unless the key holds one: False if it does.
        Makes the bucket if there is none."""
        kv = await self._bucket()
        try:
            await retrying(kv.create, key, value)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    async def get(self, key: str) -> bytes | None:
        """The value under ``key``; None if there is none (never was, deleted, or no
        bucket)."""
        kv = await self._existing()
        if kv is None:
            return None
        try:
            entry = await retrying(kv.get, key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return entry.value or None

    async def entries(self) -> dict[str, bytes]:
        """Every key with its value (deleted ones left out; none without a bucket)."""
        kv = await self._existing()
        out: dict[str, bytes] = {}
        if kv is None:
            return out
        watcher = await retrying(functools.partial(kv.watch, ">", ignore_deletes=True))
        try:
            async for entry in watcher:
                if entry is None:
                    break
                if entry.value:
                    out[entry.key] = entry.value
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py is untyped
        return out

    async def delete(self, key: str) -> bool:
        """Delete ``key``'s value: False if it had none (or there is no bucket)."""
        if await self.get(key) is None:
            return False
        kv = await self._bucket()
        await retrying(kv.delete, key)
        return True

    async def follow(
        self, on_change: OnChange, on_current: OnCurrent
    ) -> Callable[[], Awaitable[None]] | None:
        """Call ``on_change(key, value or None when it has none)`` for the last message
        of every key, then for every change, until the returned ``stop()`` is awaited;
        ``on_current()`` once every key's last message has been delivered. None (and no
        call) if there is no bucket yet. nats-py's ordered consumer recreates itself
        after a gap or a reconnect, from where it was, so a change made meanwhile still
        comes."""
        if await self._existing() is None:
            return None
        prefix = f"$KV.{self.name}."
        stream = self.layout.kv_stream(self.name)
        current = False

        def caught_up() -> None:
            nonlocal current
            if not current:
                current = True
                on_current()

        async def cb(msg: Msg) -> None:
            headers = msg.headers or {}
            gone = (
                headers.get("KV-Operation") in _GONE_OPS
                or headers.get("Nats-Marker-Reason") in _GONE_MARKERS
            )
            await on_change(msg.subject[len(prefix) :], None if gone or not msg.data else msg.data)
            # (the message's own count: the consumer's info can lag its deliveries, and
            # say 1 pending for a message already delivered)
            if msg.metadata.num_pending == 0:
                caught_up()

        subscribe = functools.partial(
            self.js.subscribe,
            f"{prefix}>",
            cb=cb,
            stream=stream,
            ordered_consumer=True,
            idle_heartbeat=5.0,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        )
        sub = await retrying(subscribe, what="a watch of the API tokens")

        async def stop() -> None:
            with contextlib.suppress(nats.errors.Error, TimeoutError, OSError):
                await sub.unsubscribe()

        try:
            info = await retrying(self.js.stream_info, stream, what="the API tokens' bucket")
        except BaseException:
            with anyio.CancelScope(shield=True):
                await stop()
            raise
        if info.state.messages == 0:  # an empty bucket: nothing will come but changes
            caught_up()
        return stop
