"""``POST /v1/runs/bulk/resume`` and ``POST /v1/runs/bulk/cancel``: the engine's bulk
actions (``Engine.bulk_resume``, ``Engine.bulk_cancel``), filters in a JSON body, the
summary in the answer. The request lasts as long as the action (one page of the index at
a time, 32 runs in flight); a client that gives up may send it again: runs already
resumed or cancelled are skipped."""

from __future__ import annotations

from typing import Any, TypedDict

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fusee.adapters.http.state import api_state, json_body, json_response
from fusee.errors import InvalidArgument

__all__ = ("routes", "FILTERS")

FILTERS = ("status", "workflow", "since", "until", "id_prefix")


def _body(body: Any, *, cancel: bool) -> dict[str, Any]:
    allowed = {*FILTERS, "dry_run", *(("reason",) if cancel else ())}
    if body is None:
        body = {}
    if not isinstance(body, dict) or set(body) - allowed:
        raise InvalidArgument(
            f"the body must be an object with only {', '.join(sorted(allowed))} (all optional)"
        )
    for name in (*FILTERS, "reason"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"{name}={value!r}: must be a string")
    if not isinstance(body.get("dry_run", False), bool):
        raise InvalidArgument(f"dry_run={body['dry_run']!r}: must be true or false")
    return body


class _Filters(TypedDict):
    status: str | None
    workflow: str | None
    since: str | None
    until: str | None
    id_prefix: str | None


def _filters(body: dict[str, Any]) -> _Filters:
    return _Filters(
        status=body.get("status"),
        workflow=body.get("workflow"),
        since=body.get("since"),
        until=body.get("until"),
        id_prefix=body.get("id_prefix"),
    )


async def bulk_resume(request: Request) -> Response:
    body = _body(await json_body(request, "the filters"), cancel=False)
    engine = api_state(request).engine
    summary = await engine.bulk_resume(**_filters(body), dry_run=body.get("dry_run", False))
    return json_response(summary)


async def bulk_cancel(request: Request) -> Response:
    body = _body(await json_body(request, "the filters"), cancel=True)
    engine = api_state(request).engine
    summary = await engine.bulk_cancel(
        **_filters(body),
        dry_run=body.get("dry_run", False),
        reason=body.get("reason") or "cancelled in bulk over HTTP",
    )
    return json_response(summary)


routes: list[BaseRoute] = [
    # before the runs' routes: "bulk" is no run ID here
    Route("/v1/runs/bulk/resume", bulk_resume, methods=["POST"], name="runs_bulk_resume"),
    Route("/v1/runs/bulk/cancel", bulk_cancel, methods=["POST"], name="runs_bulk_cancel"),
]
