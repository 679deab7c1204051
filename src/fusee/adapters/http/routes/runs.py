"""``/v1/runs``: start and list runs; a run's status, journal, result, signals, cancel
and resume."""

from __future__ import annotations

import base64
import hashlib
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, get, post
from litestar.params import Body, HeaderParameter, Parameter

from fusee import Run, RunInfo
from fusee.adapters.http.errors import ApiError
from fusee.adapters.http.models import (
    CancelRun,
    JournalPage,
    JournalRecord,
    OutcomeError,
    ResumeRun,
    RunAccepted,
    RunOutcome,
    RunPage,
    RunWaiting,
    SignalSent,
    StartRun,
    WaitCompleted,
)
from fusee.adapters.http.params import filter_names, parse_wait
from fusee.adapters.http.schemas import (
    BAD_ID,
    ID_SCHEMA,
    NAME_SCHEMA,
    NO_RUN,
    WHEN,
    Name,
    RunId,
    Wait,
    also,
    errors,
)
from fusee.adapters.http.state import api_state, until_disconnect
from fusee.errors import (
    InvalidArgument,
    InvalidId,
    InvalidToken,
    RunCancelled,
    RunFailed,
    Timeout,
)
from fusee.runtime.ids import validate_id, validate_name

__all__ = ("handlers",)

MAX_PAGE = 500
# the run ID the HTTP API cannot start: /v1/runs/bulk/{resume,cancel} are the bulk routes
BULK = "bulk"
ENDED = "`run_ended`: the run has ended; nothing was stored."  # signal and cancel

AnyRequest = Request[Any, Any, Any]
# a cursor's fields, bounded: a made-up one is a 400, never a position NATS refuses
_MAX_STAGE = 64  # the index's stages a listing reads (a handful)
_MAX_SEQ = 2**53  # a stream sequence, as far as JSON numbers are exact (clients, tools)


@post(
    "/v1/runs",
    status_code=201,
    summary="Start a run (idempotent by ID)",
    description="`201` with the run when this request started it; `200` with it when a "
    "run of this ID exists with the same workflow, input and timeout (a retried start); "
    "`409 run_exists` when it exists with another.",
    responses={
        200: also(RunInfo, "The run existed (a retried start)."),
        **errors(
            e400=BAD_ID
            + " The ID `bulk` is refused (`invalid_id`): its paths are the bulk routes.",
            e409="`run_exists`: a run of this ID exists with another workflow, input or timeout.",
        ),
    },
)
async def start_run(request: AnyRequest, data: Annotated[StartRun, Body()]) -> Response[RunInfo]:
    if data.id == BULK:
        raise InvalidId(
            f"run ID {BULK!r} is reserved by the HTTP API (/v1/runs/{BULK}/... are the bulk "
            "operations): pick another"
        )
    engine = api_state(request).engine
    run = await engine.start(data.workflow, data.id, data.input, timeout=data.timeout)
    return Response(await run.describe(), status_code=201 if run.created else 200)


def _fingerprint(filters: tuple[str | None, ...]) -> str:
    return hashlib.sha256(msgspec.json.encode(filters)).hexdigest()[:12]


def _cursor(after: tuple[int, int], filters: tuple[str | None, ...]) -> str:
    raw = msgspec.json.encode([after[0], after[1], _fingerprint(filters)])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _after(cursor: str | None, filters: tuple[str | None, ...]) -> tuple[int, int] | None:
    if cursor is None or cursor == "":
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stage, start, print_ = msgspec.json.decode(raw, type=tuple[int, int, str], strict=True)
        ok = 0 <= stage < _MAX_STAGE and 1 <= start <= _MAX_SEQ
    except (ValueError, TypeError, msgspec.DecodeError):  # (binascii.Error is a ValueError)
        ok = False
    if not ok:
        raise InvalidArgument(
            f"cursor={cursor!r}: not a cursor of this API (pass next_cursor as it came)"
        )
    if print_ != _fingerprint(filters):
        raise InvalidArgument(
            "cursor: made for other filters; send the same filters with each page"
        )
    return stage, start


@get(
    "/v1/runs",
    summary="List runs, filtered, a page at a time",
    description="Reads one page of the run index per request (never every run). A "
    "page can hold fewer runs than `limit`, even none, and still have a `next_cursor`: "
    "follow it until it is null. Runs come grouped by where they are read (the runs "
    "not ended, the paused, then each ended status), each group oldest first (in the "
    "order its index entries were written: an ended run when it ended).",
    responses=errors(
        e400="`config_error`: an unknown status, a bad time, `until` not after `since`, a workflow or ID prefix no run can have; `invalid_argument`: a bad cursor or limit."
    ),
)
async def list_runs(
    request: AnyRequest,
    workflow: Annotated[
        str | None, Parameter(description="Only runs of this workflow.", schema_extra=NAME_SCHEMA)
    ] = None,
    status: Annotated[
        str | None,
        Parameter(
            description="Only runs with this status.",
            schema_extra={
                "enum": [
                    "pending",
                    "running",
                    "waiting",
                    "paused",
                    "completed",
                    "failed",
                    "cancelled",
                ]
            },
        ),
    ] = None,
    since: Annotated[
        str | None,
        Parameter(
            description="Only runs started at or after: a duration back from now (`1h`) or an ISO 8601 time.",
            schema_extra=WHEN,
        ),
    ] = None,
    until: Annotated[
        str | None,
        Parameter(description="Only runs started before (as `since`).", schema_extra=WHEN),
    ] = None,
    id_prefix: Annotated[
        str | None,
        Parameter(description="Only runs whose ID starts with this.", schema_extra=ID_SCHEMA),
    ] = None,
    limit: Annotated[
        int, Parameter(ge=1, le=MAX_PAGE, description="Index entries read for this page.")
    ] = 100,
    cursor: Annotated[
        str | None, Parameter(description="The `next_cursor` of the previous page.")
    ] = None,
) -> RunPage:
    filters = (status, workflow, since, until, id_prefix)
    after = _after(cursor, filters)
    workflow, id_prefix = filter_names(workflow, id_prefix)
    engine = api_state(request).engine
    runs, next_at = await engine.runs_page(
        status=status,
        workflow=workflow,
        since=since,
        until=until,
        id_prefix=id_prefix,
        after=after,
        page=limit,
    )
    return RunPage(runs=runs, next_cursor=_cursor(next_at, filters) if next_at else None)


def _run(request: AnyRequest, run_id: str) -> Run:
    return api_state(request).engine.run(run_id)


@get(
    "/v1/runs/{run_id:str}",
    summary="A run's status",
    responses=errors(e400=BAD_ID, e404=NO_RUN),
)
async def describe(request: AnyRequest, run_id: RunId) -> RunInfo:
    return await _run(request, run_id).describe()


@get(
    "/v1/runs/{run_id:str}/journal",
    summary="A run's journal, a page at a time",
    description="Records as `{seq, record}`, oldest first, with `seq` above `after`. "
    "Records that share a `seq` (a wait's end journaled with the record after it) come "
    "in the same page, so a page can hold a few more than `limit`.",
    responses=errors(e400=BAD_ID, e404=NO_RUN),
)
async def journal(
    request: AnyRequest,
    run_id: RunId,
    after: Annotated[
        int, Parameter(ge=0, le=_MAX_SEQ, description="The last `seq` already read.")
    ] = 0,
    limit: Annotated[int, Parameter(ge=1, le=1000, description="Records at most.")] = 100,
) -> JournalPage:
    run = _run(request, run_id)
    rest = await run.journal(after=after)
    if not rest:
        await run.describe()  # RunNotFound
    # records that share a seq (a wait's end unfolded from the record that carried it)
    # come in one page: the next starts above the seq, so a page ends between seqs
    end = min(limit, len(rest))
    while end < len(rest) and rest[end][0] == rest[end - 1][0]:
        end += 1
    page = rest[:end]
    out = [JournalRecord(seq=seq, record=_as_json(r)) for seq, r in page]
    return JournalPage(records=out, next_after=page[-1][0] if end < len(rest) else None)


def _as_json(record: Any) -> dict[str, Any]:
    """A journal record as JSON (its stored values, ``Raw`` JSON, included as they are)."""
    value = msgspec.json.decode(msgspec.json.encode(record))
    return value if isinstance(value, dict) else {"value": value}


def _waiting(run_id: str, status: Any, reason: str | None) -> Response[RunOutcome | RunWaiting]:
    return Response(RunWaiting(run_id=run_id, status=status, reason=reason), status_code=202)


@get(
    "/v1/runs/{run_id:str}/result",
    summary="Wait for a run's outcome",
    description="`200` with the outcome once it ended: `completed` with `result`, or "
    "`failed` or `cancelled` with `error`. `202` with the current status if it has not "
    "ended when `timeout` passes, or at once if it is paused (it will not end by itself).",
    responses={
        202: also(RunWaiting, "It has not ended yet (or is paused)."),
        **errors(e400=BAD_ID, e404=NO_RUN),
    },
)
async def result(
    request: AnyRequest, run_id: RunId, timeout: Wait = None
) -> Response[RunOutcome | RunWaiting]:
    run = _run(request, run_id)
    wait = parse_wait(timeout)
    info = await run.describe()
    if info.status == "paused":
        return _waiting(run.run_id, info.status, info.reason)
    outcome = await _outcome(request, run, wait)
    if outcome is None:
        info = await run.describe()
        if info.ended:  # it ended just as the wait did
            outcome = await _outcome(request, run, 0)
    if outcome is None:
        return _waiting(run.run_id, info.status, info.reason)
    return Response(outcome)


async def _outcome(request: AnyRequest, run: Run, wait: float) -> RunOutcome | None:
    """The run's outcome, or ``None`` if it did not end within ``wait``."""
    try:
        value = await until_disconnect(request, lambda: run.result(timeout=wait))
    except RunCancelled as exc:
        error = OutcomeError(type=exc.error_type, message=exc.reason)
        return RunOutcome(run_id=run.run_id, status="cancelled", error=error)
    except RunFailed as exc:
        error = OutcomeError(type=exc.error_type, message=exc.message)
        return RunOutcome(run_id=run.run_id, status="failed", error=error)
    except Timeout:
        return None
    return RunOutcome(run_id=run.run_id, status="completed", result=value)


@post(
    "/v1/runs/{run_id:str}/signals/{name:str}",
    status_code=202,
    summary="Send a run a signal",
    description="The body (any JSON; empty: `null`) is the payload `ctx.wait_for(name)` "
    "returns. Durable once answered. An `Idempotency-Key` makes a retried send (within 2 "
    "minutes) store nothing new.",
    responses=errors(e400=BAD_ID, e404=NO_RUN, e409=ENDED),
)
async def signal(
    request: AnyRequest,
    run_id: RunId,
    name: Name,
    idempotency_key: Annotated[
        str | None,
        HeaderParameter(
            name="Idempotency-Key", description="A key for retries.", schema_extra=ID_SCHEMA
        ),
    ] = None,
    data: Annotated[Any, Body()] = None,
) -> SignalSent:
    run = _run(request, run_id)
    name = validate_name(name, "signal name")
    key = None if idempotency_key is None else validate_id(idempotency_key, "Idempotency-Key")
    if not await run.signal(name, data, key=key):
        raise ApiError(409, f"run {run.run_id!r} has ended: the signal was not stored", "run_ended")
    return SignalSent(run_id=run.run_id, signal=name)


@post(
    "/v1/runs/{run_id:str}/cancel",
    status_code=202,
    summary="Cancel a run",
    description="The run stops at its next step boundary and ends `cancelled` with "
    "`reason` (after its compensations). Durable once answered.",
    responses=errors(e400=BAD_ID, e404=NO_RUN, e409=ENDED),
)
async def cancel(
    request: AnyRequest, run_id: RunId, data: Annotated[CancelRun | None, Body()] = None
) -> RunAccepted:
    run = _run(request, run_id)
    body = data or CancelRun()
    if not await run.cancel(body.reason):
        raise ApiError(409, f"run {run.run_id!r} has ended: nothing to cancel", "run_ended")
    return RunAccepted(run_id=run.run_id, status="cancelling")


@post(
    "/v1/runs/{run_id:str}/resume",
    status_code=202,
    summary="Resume a paused run",
    description="`202` once the resume is stored; the run journals `run.resumed` when "
    "its worker reads it.",
    responses=errors(
        e400=BAD_ID,
        e404=NO_RUN,
        e409="`not_paused_error`: the run is not paused, or it is paused on a broken journal chain and needs `force`.",
    ),
)
async def resume(
    request: AnyRequest, run_id: RunId, data: Annotated[ResumeRun | None, Body()] = None
) -> RunAccepted:
    run = _run(request, run_id)
    await run.resume(force=(data or ResumeRun()).force)
    return RunAccepted(run_id=run.run_id, status="resuming")


@post(
    "/v1/runs/{run_id:str}/waits/{pos:int}/complete",
    status_code=200,
    summary="Complete a run's completion wait (an approval) with an API token",
    description="What `POST /v1/completions/{token}` does, for a caller that holds an API "
    "token (`write`) rather than the callback URL: the body (any JSON; empty: `null`) is "
    "the value `ctx.await_completion` returns. `pos` is the wait's position, from its "
    "`wait.started` record in the journal. `stored` is false when the same value was "
    "given before.",
    responses=errors(
        e400=BAD_ID,
        e404=NO_RUN + " `invalid_token`: the run has no completion wait at `pos`.",
        e409="`invalid_token`: the wait is over (timed out, its run ended, or answered "
        "with another value).",
    ),
)
async def complete_wait(
    request: AnyRequest,
    run_id: RunId,
    pos: Annotated[int, Parameter(ge=0, le=_MAX_SEQ, description="The wait's position.")],
    data: Annotated[Any, Body()] = None,
) -> WaitCompleted:
    run = _run(request, run_id)
    try:
        stored = await api_state(request).engine.complete_wait(run.run_id, pos, data)
    except InvalidToken as exc:
        # the caller's API token is fine: the wait is what is missing or over
        if exc.spent:
            raise ApiError(409, str(exc), "wait_over") from None
        raise ApiError(404, str(exc), "wait_not_found") from None
    return WaitCompleted(run_id=run.run_id, pos=pos, stored=stored, value=data)


handlers = [
    start_run,
    list_runs,
    describe,
    journal,
    result,
    signal,
    cancel,
    resume,
    complete_wait,
]
