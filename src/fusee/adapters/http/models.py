"""The bodies the API takes and answers, as msgspec Structs: the routes' signatures
name them, and the OpenAPI document is generated from them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from fusee import LimitInfo, RunInfo

__all__ = (
    "Health",
    "StartRun",
    "RunPage",
    "JournalRecord",
    "JournalPage",
    "RunOutcome",
    "OutcomeError",
    "RunWaiting",
    "RunAccepted",
    "SignalSent",
    "ResumeRun",
    "CancelRun",
    "BulkFilters",
    "BulkCancel",
    "Limits",
    "LimitChange",
    "ObjectKeys",
    "ObjectKeyState",
    "ObjectEdit",
    "ObjectCancel",
    "CallResult",
    "Queued",
    "CancelQueued",
    "Completed",
)


class Health(msgspec.Struct):
    status: Literal["ok"]
    namespace: str


class StartRun(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Start ``workflow`` as run ``id`` with ``input``; idempotent by ID."""

    workflow: str
    id: str
    input: Any = None
    # a duration ("15m") or seconds; the run fails with a timeout past it
    timeout: str | float | None = None


class RunPage(msgspec.Struct, kw_only=True):
    """A page of runs; ``next_cursor`` (``?cursor=``) reads the next, None: the last."""

    runs: list[RunInfo]
    next_cursor: str | None


class JournalRecord(msgspec.Struct, kw_only=True):
    seq: int
    record: dict[str, Any]


class JournalPage(msgspec.Struct, kw_only=True):
    """Records after ``?after=``; ``next_after`` reads the next page, None: the last."""

    records: list[JournalRecord]
    next_after: int | None


class OutcomeError(msgspec.Struct, kw_only=True):
    # the exception type raised in the workflow (ValueError), or fusee.Cancelled
    type: str
    message: str


class RunOutcome(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An ended run: ``completed`` with ``result``, ``failed``/``cancelled`` with ``error``."""

    run_id: str
    status: Literal["completed", "failed", "cancelled"]
    result: Any = None
    error: OutcomeError | None = None


class RunWaiting(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A run that has not ended (``202``): ask again."""

    run_id: str
    status: Literal["pending", "running", "waiting", "paused"]
    reason: str | None = None


class RunAccepted(msgspec.Struct, kw_only=True):
    """A resume or cancel stored in the run's inbox; the run takes it when its worker
    reads it."""

    run_id: str
    status: Literal["resuming", "cancelling"]


class SignalSent(msgspec.Struct, kw_only=True):
    run_id: str
    signal: str


class ResumeRun(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # resume a run paused on a broken journal chain
    force: bool = False


class CancelRun(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reason: str = "cancelled over HTTP"


class BulkFilters(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Which runs: each filter optional; ``dry_run`` counts what would be done."""

    status: str | None = None
    workflow: str | None = None
    since: str | None = None
    until: str | None = None
    id_prefix: str | None = None
    dry_run: bool = False


class BulkCancel(BulkFilters, forbid_unknown_fields=True, kw_only=True):
    reason: str | None = None


class Limits(msgspec.Struct):
    limits: list[LimitInfo]


class LimitChange(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The fields to change, each optional; ``null`` removes it."""

    per_second: float | msgspec.UnsetType | None = msgspec.UNSET
    burst: int | msgspec.UnsetType | None = msgspec.UNSET
    concurrent: int | msgspec.UnsetType | None = msgspec.UNSET


class ObjectKeyState(msgspec.Struct):
    key: str
    state: dict[str, Any]


class ObjectKeys(msgspec.Struct):
    keys: list[ObjectKeyState]


class ObjectEdit(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``{"state": {...}}`` (the whole state) or any of ``set``, ``delete``, ``clear``."""

    set: dict[str, Any] | None = None
    delete: list[str] | None = None
    clear: bool = False
    state: dict[str, Any] | None = None


class ObjectCancel(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # without seq: the invocation running (else the next to run)
    seq: Annotated[int, msgspec.Meta(ge=1)] | None = None
    reason: str = "cancelled over HTTP"


class CallResult(msgspec.Struct):
    result: Any


class Queued(msgspec.Struct):
    seq: int


class CancelQueued(msgspec.Struct):
    seq: int
    reason: str


class Completed(msgspec.Struct):
    completed: bool
    stored: bool
    value: Any
