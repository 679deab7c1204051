"""The namespace's API tokens in NATS: the ``<ns>_auth`` KV bucket, and a watch on it.

One entry per token, keyed by its ID, holding its hash, scope, name, creation and
expiry as JSON (``fusee._tokens`` makes them; the token itself is never stored). The
bucket is made by the first client that needs it (``fusee tokens create``, an API that
checks tokens), not by every ``connect``: a namespace without tokens has no bucket.
A revoke deletes the entry; the watch (an ordered consumer from "now on", its callback
run by nats-py on the connection) tells the API process at once.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy, KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from fusee.adapters.jetstream.direct import retrying

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from fusee.adapters.jetstream.layout import Layout

__all__ = ("AuthBucket",)

OnChange = Callable[[str, bytes | None], Awaitable[None]]


class AuthBucket:
    """The ``<ns>_auth`` bucket: ``create``/``get``/``entries``/``delete`` and ``follow``."""

    def __init__(self, js: JetStreamContext, layout: Layout, *, replicas: int = 1) -> None:
        self.js = js
        self.name = layout.auth_bucket
        self.replicas = replicas
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await retrying(self.js.key_value, self.name)
            except nats.js.errors.BucketNotFoundError:
                config = KeyValueConfig(
                    bucket=self.name,
                    description="fusee: API tokens (hashes only)",
                    history=1,
                    storage=StorageType.FILE,
                    replicas=self.replicas,
                    direct=True,
                )
                with contextlib.suppress(nats.js.errors.BadRequestError):  # a concurrent maker
                    await retrying(self.js.create_key_value, config)
                self._kv = await retrying(self.js.key_value, self.name)
        return self._kv

    async def create(self, key: str, value: bytes) -> bool:
        """Store ``value`` under ``key`` unless the key holds one: False if it does."""
        kv = await self._bucket()
        try:
            await retrying(kv.create, key, value)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    async def get(self, key: str) -> bytes | None:
        """The value under ``key``; None if there is none (never was, or deleted)."""
        kv = await self._bucket()
        try:
            entry = await retrying(kv.get, key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return entry.value or None

    async def entries(self) -> dict[str, bytes]:
        """Every key with its value (deleted ones left out)."""
        kv = await self._bucket()
        out: dict[str, bytes] = {}
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
        """Delete ``key``'s value: False if it had none."""
        if await self.get(key) is None:
            return False
        kv = await self._bucket()
        await retrying(kv.delete, key)
        return True

    async def follow(self, on_change: OnChange) -> Callable[[], Awaitable[None]]:
        """Call ``on_change(key, value or None for a delete)`` for every change from now
        on, until the returned ``stop()`` is awaited. nats-py's ordered consumer
        recreates itself after a gap or a reconnect, from where it was."""
        await self._bucket()
        prefix = f"$KV.{self.name}."

        async def cb(msg: Msg) -> None:
            op = (msg.headers or {}).get("KV-Operation")
            value = None if op in ("DEL", "PURGE") or not msg.data else msg.data
            await on_change(msg.subject[len(prefix) :], value)

        subscribe = functools.partial(
            self.js.subscribe,
            f"{prefix}>",
            cb=cb,
            stream=f"KV_{self.name}",
            ordered_consumer=True,
            idle_heartbeat=5.0,
            deliver_policy=DeliverPolicy.NEW,
        )
        sub = await retrying(subscribe, what="a watch of the API tokens")

        async def stop() -> None:
            with contextlib.suppress(nats.errors.Error, TimeoutError, OSError):
                await sub.unsubscribe()

        return stop
