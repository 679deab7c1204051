"""``engine.limit()`` and ``engine.limits()``: a limit's config is sent to its actor's
inbox (it journals it) and kept in the work bucket (``limit.<eid>``) for listings; its
holders and waiters are read from the actor's last journaled snapshot."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from fusee.adapters.jetstream.store import NatsStore
from fusee.runtime.ids import escape, partition_of, unescape, validate_name
from fusee.runtime.inbox import LimitSet, encode_message
from fusee.runtime.limits import (
    LimitConfig,
    Snapshot,
    check_config,
    limit_actor_id,
    limit_key,
    parse_limit_id,
)

__all__ = ("LimitInfo", "set_limit", "list_limits")

_config = msgspec.json.Decoder(LimitConfig)
_snapshot = msgspec.json.Decoder(Snapshot)


@dataclass(frozen=True)
class LimitInfo:
    """A limit as its actor last journaled it: ``holders`` (permits held),
    ``waiters`` per fairness key."""

    name: str
    per_second: float | None
    burst: int | None
    concurrent: int | None
    holders: int = 0
    waiters: dict[str, int] = field(default_factory=dict)


async def set_limit(
    store: NatsStore,
    partitions: int,
    name: str,
    per_second: float | None,
    burst: int | None,
    concurrent: int | None,
) -> None:
    name = validate_name(name, "limit name")
    config = check_config(name, per_second, burst, concurrent)  # before anything is stored
    actor = limit_actor_id(name)
    eid = escape(actor)
    p = partition_of(actor, partitions)
    await store.put_limit(limit_key(eid), msgspec.json.encode(config))
    # the marker first: a new owner of the partition activates it (it has waiters)
    await store.ensure_active(p, eid)
    body = LimitSet(config.per_second, config.burst, config.concurrent)
    await store.send_inbox(p, eid, "limit", encode_message(body))


async def list_limits(store: NatsStore) -> list[LimitInfo]:
    out = []
    for key, value in sorted((await store.list_limits()).items()):
        eid = key.removeprefix("limit.")
        name = parse_limit_id(unescape(eid))
        if name is None:
            continue
        config = _config.decode(value)
        holders, waiters = 0, {}
        last = await store.last_in_journal(eid)
        if last is not None:
            snap = _snapshot.decode(last.data)
            if snap.config is not None:
                config = snap.config
            holders = len(snap.holders)
            waiters = {k: len(v) for k, v in snap.queues}
        out.append(
            LimitInfo(name, config.per_second, config.burst, config.concurrent, holders, waiters)
        )
    return out
