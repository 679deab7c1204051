"""``POST /v1/runs/bulk/resume`` and ``POST /v1/runs/bulk/cancel``: the engine's bulk
actions (``Engine.bulk_resume``, ``Engine.bulk_cancel``), filters in a JSON body, the
summary in the answer. The request lasts as long as the action (one page of the index at
a time, 32 runs in flight); a client that gives up may send it again: runs already
resumed or cancelled are skipped."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, post
from litestar.params import Body

from fusee import BulkSummary
from fusee.adapters.http.models import BulkCancel, BulkResume
from fusee.adapters.http.params import filter_names
from fusee.adapters.http.schemas import errors
from fusee.adapters.http.state import api_state

__all__ = ("handlers",)

_BAD = errors(
    e400="`config_error`: an unknown status, a status the action cannot act on, a bad "
    "time, `until` not after `since`, a workflow or ID prefix no run can have; `bad_request`: a body of another shape."
)


@post(
    "/v1/runs/bulk/resume",
    status_code=200,
    summary="Resume every paused run the filters match",
    responses=_BAD,
)
async def bulk_resume(
    request: Request[Any, Any, Any], data: Annotated[BulkResume | None, Body()] = None
) -> BulkSummary:
    body = data or BulkResume()
    workflow, id_prefix = filter_names(body.workflow, body.id_prefix)
    return await api_state(request).engine.bulk_resume(
        status=body.status,
        workflow=workflow,
        since=body.since,
        until=body.until,
        id_prefix=id_prefix,
        dry_run=body.dry_run,
    )


@post(
    "/v1/runs/bulk/cancel",
    status_code=200,
    summary="Cancel every run not ended that the filters match",
    responses=_BAD,
)
async def bulk_cancel(
    request: Request[Any, Any, Any], data: Annotated[BulkCancel | None, Body()] = None
) -> BulkSummary:
    body = data or BulkCancel()
    workflow, id_prefix = filter_names(body.workflow, body.id_prefix)
    return await api_state(request).engine.bulk_cancel(
        status=body.status,
        workflow=workflow,
        since=body.since,
        until=body.until,
        id_prefix=id_prefix,
        dry_run=body.dry_run,
        reason=body.reason or "cancelled in bulk over HTTP",
    )


handlers = [bulk_resume, bulk_cancel]
