"""Regions: a namespace's home region and its epoch, as names and metadata (pure).

A namespace opened with a region has a *home*: the JetStream cluster that holds its
journal stream (R3 inside it). A partner region may hold a mirror of it for reads and
failover. Each failover moves the home and bumps the namespace's *epoch*; the journal
stream of epoch ``e`` is named :func:`epoch_stream` (``FUSEE`` for 1, ``FUSEE_E2`` for
2, ...): the mirror made for a failover is already the next epoch's stream, so a
promotion keeps every record's stream sequence (the fences and ``prev`` links hold).

Every append names the stream of its writer's epoch (``Nats-Expected-Stream``): a
writer of an earlier epoch, such as the workers of a region that comes back after a
failover, is refused by the server (10060), whatever its fence says. The stream's
metadata records the home, the epoch and the partition count (the failover carries
the count to the new home, where the work bucket is made again).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from fusee.errors import ConfigError, InvalidArgument

__all__ = (
    "DEFAULT_LEASE",
    "RegionMeta",
    "epoch_bucket_stream",
    "epoch_of_stream",
    "epoch_stream",
    "failover_meta",
    "epoch_order",
    "region_lease",
    "validate_lease",
    "validate_region",
)

_REGION = re.compile(r"[a-z][a-z0-9_-]{0,31}")

# keys of the journal stream's metadata (strings both ways: JetStream's metadata is str→str)
HOME = "fusee.home"
EPOCH = "fusee.epoch"
PARTITIONS = "fusee.partitions"


# The self-fencing lease of a regional namespace's workers, in seconds (research
# reliability.md §1.4: above the meta group's 4-9 s election, so an election alone
# does not stop the home's appends)
DEFAULT_LEASE = 20.0


def region_lease(value: str | None = None) -> float:
    """The region lease in seconds: ``value`` (default ``$FUSEE_REGION_LEASE``), else
    :data:`DEFAULT_LEASE`. Workers and the failover must agree on it.

    Raises:
        ConfigError: not a number of seconds from 1 to 3600.
    """
    raw = os.environ.get("FUSEE_REGION_LEASE") if value is None else value
    if raw is None or raw == "":
        return DEFAULT_LEASE
    try:
        lease = float(raw)
    except ValueError:
        lease = math.nan
    return validate_lease(lease, shown=repr(raw))


def validate_lease(lease: float, *, shown: str | None = None) -> float:
    """``lease`` if it is a number of seconds from 1 to 3600.

    Raises:
        ConfigError: it is not (named as ``shown``, default its repr).
    """
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 1.0 <= lease <= 3600.0:
        # (the range check is False for NaN too)
        raise ConfigError(
            f"region lease {shown or repr(lease)} ($FUSEE_REGION_LEASE): a number of "
            "seconds from 1 to 3600"
        )
    return lease


def epoch_order(theirs: object, mine: int) -> int:
    """How the epoch another worker names (its heartbeat's or ping answer's ``epoch``)
    compares with ``mine``: -1 earlier, 0 the same, 1 later. A missing or malformed
    one (a worker of an earlier version) is taken as the same."""
    if not isinstance(theirs, int) or isinstance(theirs, bool) or theirs == mine:
        return 0
    return -1 if theirs < mine else 1


def validate_region(region: object, what: str = "region") -> str:
    """Check a region's name: the name of its NATS cluster (``cluster.name``).

    Raises:
        ConfigError: ``region`` is not a lower-case name of at most 32 characters
            (letters, digits, ``_`` and ``-``, starting with a letter).

    Example:
        >>> validate_region("east")
        'east'
    """
    if not isinstance(region, str) or _REGION.fullmatch(region) is None:
        raise ConfigError(
            f"invalid {what} {region!r}: it names a NATS cluster (cluster.name), and must "
            "start with a lower-case letter and hold at most 32 lower-case letters, "
            "digits, '_' or '-'"
        )
    return region


def epoch_stream(namespace: str, epoch: int) -> str:
    """The journal stream of ``namespace`` in ``epoch``.

    Example:
        >>> epoch_stream("fusee", 1), epoch_stream("fusee", 2)
        ('FUSEE', 'FUSEE_E2')
    """
    if epoch < 1:
        raise InvalidArgument(f"epoch {epoch}: epochs count from 1")
    base = namespace.upper()
    return base if epoch == 1 else f"{base}_E{epoch}"


def epoch_bucket_stream(bucket: str, epoch: int) -> str:
    """The stream that holds KV bucket ``bucket`` in ``epoch``.

    A bucket keeps its name, and so its subjects (``$KV.<bucket>.<key>``), in every
    epoch; its stream is named after the epoch, as the journal's is: a failover
    promotes the partner's mirror of it in place (a mirror cannot take the old name
    while the old home's stream is known, and a mirror that rewrote the subjects to
    another bucket's would answer Direct Gets of its origin's keys wrongly: the server
    makes every mirror answer its origin's, ``mirror_direct``).

    Example:
        >>> epoch_bucket_stream("fusee_work", 1), epoch_bucket_stream("fusee_work", 2)
        ('KV_fusee_work', 'KV_fusee_work_E2')
    """
    if epoch < 1:
        raise InvalidArgument(f"epoch {epoch}: epochs count from 1")
    base = f"KV_{bucket}"
    return base if epoch == 1 else f"{base}_E{epoch}"


def epoch_of_stream(namespace: str, stream: str) -> int | None:
    """The epoch whose journal stream ``stream`` is, or None for another stream."""
    base = namespace.upper()
    if stream == base:
        return 1
    m = re.fullmatch(re.escape(base) + r"_E([1-9][0-9]*)", stream)
    return int(m.group(1)) if m is not None and int(m.group(1)) >= 2 else None


@dataclass(frozen=True)
class RegionMeta:
    """What a journal stream's metadata says of its namespace: its home region (None:
    a namespace without regions), its epoch, its partition count (None: not recorded)."""

    home: str | None
    epoch: int = 1
    partitions: int | None = None

    def to_metadata(self) -> dict[str, str]:
        out = {EPOCH: str(self.epoch)}
        if self.home is not None:
            out[HOME] = self.home
        if self.partitions is not None:
            out[PARTITIONS] = str(self.partitions)
        return out

    @classmethod
    def from_metadata(cls, metadata: dict[str, str] | None, epoch: int) -> RegionMeta:
        """Read back :meth:`to_metadata`; ``epoch`` is the stream's (from its name), which
        a metadata that says otherwise does not override."""
        md = metadata or {}
        home = md.get(HOME) or None
        parts = md.get(PARTITIONS, "")
        return cls(home, epoch, int(parts) if parts.isdigit() else None)


def failover_meta(current: RegionMeta, to: str) -> RegionMeta:
    """The namespace's metadata once failed over from ``current`` to region ``to``:
    the home moves, the epoch goes up by one, the partition count stays.

    Raises:
        InvalidArgument: ``to`` is already the home, or the namespace has no regions.
    """
    to = validate_region(to, "target region")
    if current.home is None:
        raise InvalidArgument(
            "the namespace has no home region (it was not opened with region=): "
            "there is nothing to fail over"
        )
    if current.home == to:
        raise InvalidArgument(
            f"region {to!r} is already the namespace's home (epoch {current.epoch})"
        )
    return RegionMeta(to, current.epoch + 1, current.partitions)
