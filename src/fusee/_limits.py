"""``engine.limit()``, ``engine.update_limit()``, ``engine.limits()`` and
``engine.get_limit()``: a limit's config is sent to its actor's inbox (it journals it)
and kept in the work bucket (``limit.<eid>``) for listings, which show it from there (the
config last set, also before the actor journals it); its holders and waiters are asked
of the live limit actor (``show`` on core NATS: as they are now), else read from its
last journaled snapshot and the requests its inbox got since (a parked limit actor has
read none of them yet)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from fusee.actors.ports import NobodyListens
from fusee.adapters.jetstream.store import NatsStore
from fusee.errors import ConnectionLost, InvalidArgument, UnknownLimit
from fusee.runtime.ids import escape, partition_of, unescape, validate_name
from fusee.runtime.inbox import LimitSet, PermitRequest, decode_message, encode_message
from fusee.runtime.limits import (
    LimitConfig,
    Shown,
    ShowOp,
    Snapshot,
    check_config,
    core_subject,
    encode_core,
    limit_actor_id,
    limit_key,
    parse_limit_id,
)

__all__ = ("LimitInfo", "FIELDS", "set_limit", "update_limit", "list_limits", "get_limit")

# what a partial update may change
FIELDS = ("per_second", "burst", "concurrent")

_config = msgspec.json.Decoder(LimitConfig)
_snapshot = msgspec.json.Decoder(Snapshot)
# How long a listing waits for a live limit actor's answer (else: the journal and inbox).
SHOW_PATIENCE = 1.0


_shown = msgspec.json.Decoder(Shown)


@dataclass(frozen=True)
class LimitInfo:
    """A limit as it is now: ``holders`` (permits held), ``waiters`` per fairness key
    (a step that has asked and not been granted yet)."""

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
    old = await _read(store, partitions, name)
    per_second = changes.get("per_second", old.per_second if old else None)
    if "burst" in changes:
        burst = changes["burst"]
    else:  # a new rate gets its default burst; else the burst is kept
        burst = None if "per_second" in changes or old is None else old.burst
    concurrent = changes.get("concurrent", old.concurrent if old else None)
    # (check_config checks each value's type)
    await set_limit(store, partitions, name, per_second, burst, concurrent)
    info = await _read(store, partitions, name)
    assert info is not None
    return info


async def get_limit(store: NatsStore, partitions: int, name: str) -> LimitInfo:
    """Limit ``name``: its config, holders and waiters.

    Raises:
        InvalidId: ``name`` is not a valid name.
        UnknownLimit: no limit ``name`` was set.
    """
    name = validate_name(name, "limit name")
    info = await _read(store, partitions, name)
    if info is None:
        raise UnknownLimit(f"there is no limit {name!r} (engine.limit() sets one)")
    return info


async def _read(store: NatsStore, partitions: int, name: str) -> LimitInfo | None:
    eid = escape(limit_actor_id(name))
    value = await store.get_limit(limit_key(eid))
    return None if value is None else await _info(store, partitions, name, eid, value)


async def _info(store: NatsStore, partitions: int, name: str, eid: str, value: bytes) -> LimitInfo:
    # the config as last set (the actor journals a change with its next record); the
    # holders and waiters as the live actor has them, else as its journal and inbox do
    config = _config.decode(value)
    shown = await _ask_live(store, eid)
    if shown is None:
        shown = await _from_journal(store, partition_of(unescape(eid), partitions), eid)
    return LimitInfo(
        name, config.per_second, config.burst, config.concurrent, shown.holders, shown.waiters
    )


async def list_limits(store: NatsStore, partitions: int) -> list[LimitInfo]:
    out = []
    for key, value in sorted((await store.list_limits()).items()):
        eid = key.removeprefix("limit.")
        name = parse_limit_id(unescape(eid))
        if name is not None:
            out.append(await _info(store, partitions, name, eid, value))
    return out


async def _ask_live(store: NatsStore, eid: str) -> Shown | None:
    """The live limit actor's answer (its state as it is now), or None: none is live."""
    try:
        answer = await store.request_core(
            core_subject(store.layout.namespace, eid), encode_core(ShowOp()), SHOW_PATIENCE
        )
    except (NobodyListens, ConnectionLost):
        return None
    if answer is None:
        return None
    try:
        return _shown.decode(answer)
    except msgspec.DecodeError:
        return None


async def _from_journal(store: NatsStore, partition: int, eid: str) -> Shown:
    """The last snapshot, and the requests stored in the inbox after what it read (not
    the attempts it holds or queues already: asking again), each a waiter of its key.
    (The snapshot names its waiters by inbox sequence: their attempts are read from
    the inbox, from the oldest, as the limit actor's restore does.)"""
    last = await store.last_in_journal(eid)
    snap = _snapshot.decode(last.data) if last is not None else Snapshot()
    waiters = {k: len(v) for k, v in snap.queues}
    known = {h.key for h in snap.holders}
    queued = {s for _, seqs in snap.queues for s in seqs}
    for msg in await store.read_inbox(partition, eid, min([snap.seen, *(s - 1 for s in queued)])):
        req = decode_message(msg.data)
        if not isinstance(req, PermitRequest):
            continue
        if msg.seq <= snap.seen:
            if msg.seq in queued:
                known.add(req.key)
        elif req.key not in known:
            known.add(req.key)
            waiters[req.fairness] = waiters.get(req.fairness, 0) + 1
    return Shown(snap.config, len(snap.holders), waiters)
