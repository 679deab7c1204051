"""``engine.limit()``, ``engine.update_limit()``, ``engine.limits()`` and
``engine.get_limit()``: a limit's config is sent to its actor's inbox (it journals it)
and kept in the work bucket (``limit.<eid>``) for listings, which show it from there (the
config last set, also before the actor journals it); its holders and waiters are read
from the actor's last journaled snapshot."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from fusee.adapters.jetstream.store import NatsStore
from fusee.errors import InvalidArgument, UnknownLimit
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

__all__ = ("LimitInfo", "FIELDS", "set_limit", "update_limit", "list_limits", "get_limit")

# what a partial update may change
FIELDS = ("per_second", "burst", "concurrent")

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


async def update_limit(
    store: NatsStore, partitions: int, name: str, changes: Mapping[str, Any]
) -> LimitInfo:
    """Change the fields of limit ``name`` in ``changes`` (``None``: no rate, no cap,
    or the default burst); the others keep their value. A new rate without a burst
    gets its default burst; a burst alone keeps the rate. A limit not set yet is set
    from ``changes`` alone. Answers the limit as it is then.

    Raises:
        InvalidId: ``name`` is not a valid name.
        InvalidArgument: a field that is not one of :data:`FIELDS`, or a config
            :func:`~fusee.runtime.limits.check_config` refuses (nothing is stored).
    """
    name = validate_name(name, "limit name")
    unknown = sorted(set(changes) - set(FIELDS))
    if unknown:
        raise InvalidArgument(
            f"limit {name!r}: unknown field {', '.join(map(repr, unknown))} "
            f"(a limit has {', '.join(FIELDS)})"
        )
    old = await _read(store, name)
    per_second = changes.get("per_second", old.per_second if old else None)
    if "burst" in changes:
        burst = changes["burst"]
    else:  # a new rate gets its default burst; else the burst is kept
        burst = None if "per_second" in changes or old is None else old.burst
    concurrent = changes.get("concurrent", old.concurrent if old else None)
    # (check_config checks each value's type)
    await set_limit(store, partitions, name, per_second, burst, concurrent)
    info = await _read(store, name)
    assert info is not None
    return info


async def get_limit(store: NatsStore, name: str) -> LimitInfo:
    """Limit ``name``: its config, holders and waiters.

    Raises:
        InvalidId: ``name`` is not a valid name.
        UnknownLimit: no limit ``name`` was set.
    """
    name = validate_name(name, "limit name")
    info = await _read(store, name)
    if info is None:
        raise UnknownLimit(f"there is no limit {name!r} (engine.limit() sets one)")
    return info


async def _read(store: NatsStore, name: str) -> LimitInfo | None:
    eid = escape(limit_actor_id(name))
    value = await store.get_limit(limit_key(eid))
    return None if value is None else await _info(store, name, eid, value)


async def _info(store: NatsStore, name: str, eid: str, value: bytes) -> LimitInfo:
    # the config as last set (the actor journals a change with its next record)
    config = _config.decode(value)
    holders, waiters = 0, {}
    last = await store.last_in_journal(eid)
    if last is not None:
        snap = _snapshot.decode(last.data)
        holders = len(snap.holders)
        waiters = {k: len(v) for k, v in snap.queues if v}
    return LimitInfo(name, config.per_second, config.burst, config.concurrent, holders, waiters)


async def list_limits(store: NatsStore) -> list[LimitInfo]:
    out = []
    for key, value in sorted((await store.list_limits()).items()):
        eid = key.removeprefix("limit.")
        name = parse_limit_id(unescape(eid))
        if name is not None:
            out.append(await _info(store, name, eid, value))
    return out
