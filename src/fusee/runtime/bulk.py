"""Filters over the run index, and what a bulk action makes of one run: pure.

A :class:`RunFilter` is what ``fusee runs list`` and ``fusee runs bulk`` take (status,
workflow, a window of start times, an ID prefix), checked once (:func:`make_filter`) so
that bad input is refused before anything is read or done. :func:`sources` says where in
the index a filter's runs are (see "The run index is a projection" in docs/design.md).
"""

from __future__ import annotations

import datetime
import math
from typing import Final, Literal, get_args

import msgspec

from fusee.errors import ConfigError
from fusee.runtime.durations import parse_duration
from fusee.runtime.index import RunInfo, Status

__all__ = (
    "STATUSES",
    "ENDED_STATUSES",
    "ACTIVE_STATUSES",
    "RunFilter",
    "TimeLike",
    "Source",
    "make_filter",
    "parse_time",
    "sources",
    "matches",
    "BulkSummary",
)

STATUSES: Final[tuple[str, ...]] = get_args(Status)
ENDED_STATUSES: Final = ("completed", "failed", "cancelled")
# statuses of runs with an active marker (the marker lists them, with the bucket's entry)
ACTIVE_STATUSES: Final = ("pending", "running", "waiting")

TimeLike = str | float | datetime.datetime | datetime.timedelta
Source = Literal["listed", "paused", "active"]


class RunFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which runs: every field None matches all. ``since``/``until``: start times
    (seconds since the epoch), ``since`` included, ``until`` excluded."""

    status: str | None = None
    workflow: str | None = None
    since: float | None = None
    until: float | None = None
    id_prefix: str | None = None


def parse_time(value: TimeLike | None, what: str, *, now: float) -> float | None:
    """A point in time: a duration back from ``now`` (``"1h"``: an hour ago, or a
    :class:`datetime.timedelta`), an ISO 8601 time (``"2026-12-01T10:00:00Z"``; without a
    zone: UTC), a :class:`datetime.datetime`, or a number of seconds since the epoch (as
    ``RunInfo.created_at``).

    Raises:
        ConfigError: none of these (a negative or garbled duration, a bad date).
    """
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)  # seconds since the epoch, as RunInfo.created_at
    if isinstance(value, datetime.timedelta):
        return now - parse_duration(value, what)
    if isinstance(value, datetime.datetime):
        return _timestamp(value if value.tzinfo else value.replace(tzinfo=datetime.UTC))
    if isinstance(value, str) and value[:1].isdigit() and ("-" in value or "T" in value):
        try:
            moment = datetime.datetime.fromisoformat(value)
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=datetime.UTC)
            return _timestamp(moment)
        except ValueError:
            raise ConfigError(
                f"{what}={value!r}: not an ISO 8601 time (like 2026-12-01T10:00:00Z) "
                f"nor a duration (like 1h: since an hour ago)"
            ) from None
    try:
        return now - parse_duration(value, what)
    except ConfigError as exc:
        raise ConfigError(
            f"{exc} ({what} takes a duration back from now, like 1h, or an ISO 8601 time)"
        ) from None


def _timestamp(moment: datetime.datetime) -> float:
    try:
        return moment.timestamp()
    except (OverflowError, ValueError):  # at the ends of datetime's range: before any run
        return 0.0 if moment.year < 1970 else 1e12


def make_filter(
    *,
    status: str | None = None,
    workflow: str | None = None,
    since: TimeLike | None = None,
    until: TimeLike | None = None,
    id_prefix: str | None = None,
    now: float,
) -> RunFilter:
    """A checked filter.

    Raises:
        ConfigError: an unknown status, a bad time, ``until`` not after ``since``, an
            empty workflow or prefix.
    """
    if status is not None and status not in STATUSES:
        raise ConfigError(f"status={status!r}: not a run status (one of {', '.join(STATUSES)})")
    for name, text in (("workflow", workflow), ("id_prefix", id_prefix)):
        if text is not None and (not isinstance(text, str) or not text):
            raise ConfigError(f"{name}={text!r}: must be a non-empty string")
    start = parse_time(since, "since", now=now)
    end = parse_time(until, "until", now=now)
    if start is not None and end is not None and end <= start:
        raise ConfigError(f"until={until!r} is not after since={since!r}: no run can match")
    for name, t in (("since", start), ("until", end)):
        if t is not None and not math.isfinite(t):
            raise ConfigError(f"{name}: not a finite time")
    return RunFilter(status=status, workflow=workflow, since=start, until=end, id_prefix=id_prefix)


def sources(f: RunFilter) -> tuple[Source, ...]:
    """Where the filter's runs are: ``listed`` (the listing entries of ended runs, and
    the final entries of a previous fusee's), ``paused`` (paused runs' listing entries,
    checked against the run's entry), ``active`` (the active markers, with the bucket's
    entry of each)."""
    if f.status in ENDED_STATUSES:
        return ("listed",)
    if f.status == "paused":
        return ("paused",)
    if f.status in ACTIVE_STATUSES:
        return ("active",)
    return ("active", "paused", "listed")


def matches(info: RunInfo, f: RunFilter) -> bool:
    """Whether the run ``info`` describes passes the filter."""
    if f.status is not None and info.status != f.status:
        return False
    if f.workflow is not None and info.workflow != f.workflow:
        return False
    if f.since is not None and info.created_at < f.since:
        return False
    if f.until is not None and info.created_at >= f.until:
        return False
    return f.id_prefix is None or info.run_id.startswith(f.id_prefix)


class BulkSummary(msgspec.Struct, kw_only=True):
    """What one pass of a bulk action did, counting the runs it listed:

    - ``done``: the resume or cancel was *sent* (stored in the run's inbox, a resume's
      marker written; one already stored, deduplicated by its ``Nats-Msg-Id``, counts
      too). Not *taken*: the run journals ``run.resumed`` / ends ``cancelled`` when its
      worker reads it, which the pass does not wait for. With ``dry_run``: the runs it
      would send to, each asked as the real pass asks it (``Run.resume(dry_run=True)``,
      ``Run.cancel(dry_run=True)``: the same reads, nothing stored); ``skipped`` and
      ``failed`` likewise say what the pass would make of each run when it was read.
    - ``skipped``: listed, but needing nothing by the time it was acted on (ended
      meanwhile, or resumed since: by another pass, or by the interrupted one).
    - ``failed``: run ID -> why (a store error, a run paused on a broken journal chain,
      which needs ``resume(force=True)``).

    A pass run again after an interruption acts on each run once more at most: it does
    not list the runs the first one sent a resume to (their marker is back, their
    listing removed once taken), nor the runs it cancelled that have ended, and a
    resume sent twice is one message (each run is resumed once). The two passes'
    ``done`` need not add up to the runs acted on: the sends the first pass had in
    flight when it stopped (at most ``concurrency - 1`` besides the one it counted
    last) may have landed uncounted, and are not counted by the second either (the
    total falls short); a cancel stored and not read yet when the second pass lists
    its run is sent, and counted, again (the total goes over: the run ends once)."""

    action: str
    dry_run: bool = False
    done: int = 0
    skipped: int = 0
    failed: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed
