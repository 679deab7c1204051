"""The run index: one small record per run in the ``<ns>_runs`` bucket, for listing.

It is a projection of the journal, written after the journal, so it may lag behind
it for a moment but never runs ahead. ``describe()`` reads the journal for the truth.
"""

from __future__ import annotations

import enum
from typing import Final, Literal, TypeAlias

import msgspec

from fusee.runtime.history import History
from fusee.runtime.records import RunCancelled, RunCompleted, RunFailed

__all__ = (
    "RunInfo",
    "Status",
    "IndexEntry",
    "Unread",
    "UNREAD",
    "Current",
    "info_from_history",
    "supersedes",
    "encode_info",
    "decode_info",
    "info_or_none",
)

Status = Literal["pending", "running", "waiting", "completed", "failed", "cancelled", "paused"]

IndexEntry: TypeAlias = tuple[bytes, int, int]
"""A run's index entry as stored: ``(value, journal sequence, revision)`` (revision 0:
an ended run's final entry, in the journal stream)."""


class Unread(enum.Enum):
    """What the index holds is not known yet: read it first."""

    UNREAD = "unread"


UNREAD: Final = Unread.UNREAD

Current: TypeAlias = IndexEntry | Literal[Unread.UNREAD] | None
"""What the index holds, as a writer of an entry knows it: the entry; None (nothing
there to compare with, as after an end that just landed); or :data:`UNREAD`."""


class RunInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What ``describe()`` and ``fusee runs list`` show about a run."""

    run_id: str
    workflow: str
    status: Status
    partition: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    steps: int = 0
    reason: str | None = None
    error_type: str | None = None
    message: str | None = None
    step: str | None = None
    attempts: int | None = None  # a paused step's attempts (of the budget that ran out)
    generation: int = 1  # how many times it continued as new, plus one

    @property
    def ended(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")


def info_from_history(history: History, *, now: float, running: bool = False) -> RunInfo:
    """The index record the journal implies (``running``: a worker is executing it)."""
    started = history.started
    assert started is not None, "a history always starts with run.started"
    info = RunInfo(
        run_id=history.run_id,
        workflow=started.workflow,
        status="running" if running else "pending",
        partition=started.partition,
        created_at=started.started_at,
        updated_at=now,
        steps=len(history.outcomes),
        generation=history.generation,
    )
    end = history.end
    if isinstance(end, RunCompleted):
        info.status = "completed"
    elif isinstance(end, RunFailed):
        info.status, info.error_type, info.message, info.step = (
            "failed",
            end.error_type,
            end.message,
            end.step,
        )
    elif isinstance(end, RunCancelled):
        info.status, info.reason = "cancelled", end.reason
    elif history.paused is not None:
        paused = history.paused
        info.status, info.reason = "paused", paused.reason
        if isinstance(paused.step, str):  # a step's attempts ran out: which, and how
            info.step = paused.step
            info.error_type = paused.error_type if isinstance(paused.error_type, str) else None
            info.message = paused.message if isinstance(paused.message, str) else None
            info.attempts = paused.attempts if isinstance(paused.attempts, int) else None
    return info


def supersedes(new: RunInfo, new_seq: int, old: RunInfo, old_seq: int) -> bool:
    """Whether ``new``, made from the journal up to sequence ``new_seq``, may replace
    ``old`` (made up to ``old_seq``) in the index: never one made from less of the
    journal (a stale owner that parks after the run ended elsewhere), nor, from as
    much, an ended entry by a live one or anything by a bare ``pending`` (the starter's
    entry landing after the worker's; a worker's ``pending`` with a reason, why nobody
    runs it, is a note that may)."""
    if new_seq != old_seq:
        return new_seq > old_seq
    if old.ended:
        return new.ended
    return new.status != "pending" or old.status == "pending" or new.reason is not None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RunInfo)


def encode_info(info: RunInfo) -> bytes:
    return _encoder.encode(info)


def decode_info(data: bytes) -> RunInfo:
    return _decoder.decode(data)


def info_or_none(data: bytes) -> RunInfo | None:
    """:func:`decode_info`, or None for a value that is not fusee's (nothing to show)."""
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
