"""The bodies the API takes and answers, as msgspec Structs: the routes' signatures
name them, and the OpenAPI document is generated from them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from fusee import LimitInfo, RunInfo
from fusee.adapters.http.schemas import ID_SCHEMA, NAME_SCHEMA, RUN_ID_SCHEMA


def _doc(**schema: Any) -> msgspec.Meta:
    """Schema the document shows and the framework does not enforce (fusee's own checks
    do, with messages naming the rule)."""
    return msgspec.Meta(extra_json_schema={"extra": schema})


_DURATION = "^([0-9]{1,6}(\\.[0-9]{1,3})?(ms|s|m|h|d))+$"
# a duration back from now ("1h", "90m") or an RFC 3339 time; null: no bound (each
# field of this type is optional, and the generator's oneOf [string, null] is ANDed
# with this anyOf)
_WHEN = _doc(
    any_of=[
        {"type": "string", "pattern": "^([0-9]{1,6}(ms|s|m|h|d))+$"},
        {"type": "string", "format": "date-time"},
        {"type": "null"},
    ]
)
WorkflowName = Annotated[str, _doc(**NAME_SCHEMA)]
RunIdField = Annotated[str, _doc(**RUN_ID_SCHEMA)]
IdPrefix = Annotated[str, _doc(**ID_SCHEMA)]
When = Annotated[str, _WHEN]
_TIMEOUT = _doc(
    one_of=[
        {"type": "string", "pattern": _DURATION},
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "null"},
    ]
)
_TTL = _doc(one_of=[{"type": "string", "pattern": _DURATION}, {"type": "null"}])
_STREAM_TTL = _doc(type="string", pattern=_DURATION)
_KEYS = _doc(
    one_of=[
        {"type": "object", "additionalProperties": True, "propertyNames": {"minLength": 1}},
        {"type": "null"},
    ]
)
_KEY_LIST = _doc(
    one_of=[{"type": "array", "items": {"type": "string", "minLength": 1}}, {"type": "null"}]
)

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
    "WaitCompleted",
    "ObjectTypes",
    "StreamList",
    "StreamSummary",
    "ResumeRun",
    "CancelRun",
    "BulkResume",
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
    "TokenRequest",
    "TokenListed",
    "Tokens",
    "TokenCreated",
    "StreamTokenRequest",
    "StreamToken",
)


class Health(msgspec.Struct):
    status: Literal["ok"]
    namespace: str


class StartRun(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Start ``workflow`` as run ``id`` with ``input``; idempotent by ID."""

    workflow: WorkflowName
    id: RunIdField
    input: Any = None
    # a duration ("15m") or seconds; the run fails with a timeout past it
    timeout: Annotated[str | float | None, _TIMEOUT] = None


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


class RunOutcome(msgspec.Struct, kw_only=True):
    """An ended run: ``completed`` with ``result`` (always there, ``null`` included),
    ``failed``/``cancelled`` with ``error``."""

    run_id: str
    status: Literal["completed", "failed", "cancelled"]
    # UNSET (left out) unless completed: a run that returned None answers "result": null
    result: Any | msgspec.UnsetType = msgspec.UNSET
    error: OutcomeError | msgspec.UnsetType = msgspec.UNSET


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


class StreamSummary(msgspec.Struct, kw_only=True):
    name: str
    messages: int


class StreamList(msgspec.Struct, kw_only=True):
    """A run's token streams that hold anything."""

    streams: list[StreamSummary]


class ObjectTypes(msgspec.Struct, kw_only=True):
    """The object types that have (or had) a key with state."""

    types: list[str]


class WaitCompleted(msgspec.Struct, kw_only=True):
    """A completion wait completed with an API token (the UI's approve button)."""

    run_id: str
    pos: int
    stored: bool
    value: Any = None


class ResumeRun(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # resume a run paused on a broken journal chain
    force: bool = False


class CancelRun(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reason: str = "cancelled over HTTP"


class BulkResume(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Which paused runs: each filter optional; ``dry_run`` counts what would be done."""

    status: Literal["paused"] | None = None
    workflow: WorkflowName | None = None
    since: When | None = None
    until: When | None = None
    id_prefix: IdPrefix | None = None
    dry_run: bool = False


class BulkCancel(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Which runs not ended: each filter optional; ``dry_run`` counts what would be done."""

    status: Literal["pending", "running", "waiting", "paused"] | None = None
    workflow: WorkflowName | None = None
    since: When | None = None
    until: When | None = None
    id_prefix: IdPrefix | None = None
    dry_run: bool = False
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

    set: Annotated[dict[str, Any] | None, _KEYS] = None
    delete: Annotated[list[str] | None, _KEY_LIST] = None
    clear: bool = False
    state: Annotated[dict[str, Any] | None, _KEYS] = None


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


_COUNT: dict[str, Any] = {"oneOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]}


class TokenRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A new API token: its scope, a name to tell it by, how long it lives (none: until
    revoked)."""

    scope: Literal["read", "write", "admin"]
    name: WorkflowName | None = None
    ttl: Annotated[str | None, _TTL] = None


class TokenListed(msgspec.Struct, kw_only=True):
    """An API token as listed: never the token itself."""

    id: str
    scope: Literal["read", "write", "admin"]
    name: str | None
    created_at: str
    expires_at: str | None
    expired: bool


class Tokens(msgspec.Struct, kw_only=True):
    tokens: list[TokenListed]


class TokenCreated(msgspec.Struct, kw_only=True):
    """The token, shown this once (only its hash is kept)."""

    token: str
    id: str
    scope: Literal["read", "write", "admin"]
    expires_at: str | None


class StreamTokenRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # how long the stream token lives: at most 1h
    ttl: Annotated[str, _STREAM_TTL] = "5m"


class StreamToken(msgspec.Struct, kw_only=True):
    """A token that reads one stream (``GET .../streams/{name}?access_token=``) until
    ``expires_at``, and ends with the token that asked for it."""

    access_token: str
    expires_at: str


# Fields whose schema the generator loses (a field that may be left out, msgspec's
# UNSET, keeps only its type): set on the document by the app (``app._finish_document``).
FIELD_SCHEMAS: dict[str, dict[str, dict[str, Any]]] = {
    "RunOutcome": {
        "result": {
            "description": "What the run returned (any JSON, `null` included): when `completed`."
        },
        "error": {"$ref": "#/components/schemas/OutcomeError"},
    },
    "LimitChange": {
        "per_second": {
            "oneOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}],
            "description": "Permits a second (a token bucket); `null`: no rate.",
        },
        "burst": {**_COUNT, "description": "Tokens the bucket holds."},
        "concurrent": {**_COUNT, "description": "Permits held at once at most; `null`: no cap."},
    },
}

# every body above by its schema's name (the app closes those that refuse unknown fields)
STRUCTS: dict[str, type[msgspec.Struct]] = {
    name: value
    for name, value in dict(globals()).items()
    if isinstance(value, type)
    and issubclass(value, msgspec.Struct)
    and value.__module__ == __name__
}
