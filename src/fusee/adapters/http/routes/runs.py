"""``/v1/runs/{run_id}``: a run's status, and its result (waiting for it)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fusee import Run
from fusee.adapters.http.params import parse_wait
from fusee.adapters.http.state import api_state, json_body, json_response, until_disconnect
from fusee.errors import InvalidArgument, RunCancelled, RunFailed, Timeout

__all__ = ("routes",)


async def describe(request: Request) -> Response:
    """``GET /v1/runs/{run_id}``: the run's status (``Run.describe()``) as JSON."""
    run = api_state(request).engine.run(request.path_params["run_id"])
    return json_response(await run.describe())


def _waiting(run_id: str, status: str, reason: str | None) -> Response:
    body: dict[str, Any] = {"run_id": run_id, "status": status}
    if reason:
        body["reason"] = reason
    return json_response(body, 202)


async def result(request: Request) -> Response:
    """``GET /v1/runs/{run_id}/result?timeout=30s``: wait for the run to end.

    ``200`` with the outcome once it ended: ``completed`` with ``result``, or ``failed``
    or ``cancelled`` with ``error``. ``202`` with the current status if it has not
    ended when ``timeout`` passes, or at once if it is paused (it will not end by itself).
    """
    run = api_state(request).engine.run(request.path_params["run_id"])
    wait = parse_wait(request.query_params.get("timeout"))
    info = await run.describe()
    if info.status == "paused":
        return _waiting(run.run_id, info.status, info.reason)
    outcome = await _outcome(request, run, wait)
    if outcome is None:
        info = await run.describe()
        if info.ended:  # it ended just as the wait did
            outcome = await _outcome(request, run, 0)
    return outcome or _waiting(run.run_id, info.status, info.reason)


async def _outcome(request: Request, run: Run, wait: float) -> Response | None:
    """The run's outcome as a response, or ``None`` if it did not end within ``wait``."""
    try:
        value = await until_disconnect(request, lambda: run.result(timeout=wait))
    except RunCancelled as exc:
        error = {"type": exc.error_type, "message": exc.reason}
        return json_response({"run_id": run.run_id, "status": "cancelled", "error": error})
    except RunFailed as exc:
        error = {"type": exc.error_type, "message": exc.message}
        return json_response({"run_id": run.run_id, "status": "failed", "error": error})
    except Timeout:
        return None
    return json_response({"run_id": run.run_id, "status": "completed", "result": value})


async def resume(request: Request) -> Response:
    """``POST /v1/runs/{run_id}/resume`` with an optional ``{"force": true}``: resume a
    paused run (``Run.resume()``); ``202 {"run_id", "status": "resuming"}`` once the
    resume is stored, ``409 NotPausedError`` when the run is not paused."""
    run = api_state(request).engine.run(request.path_params["run_id"])
    body = await json_body(request, "the resume")
    body = {} if body is None else body
    if (
        not isinstance(body, dict)
        or set(body) - {"force"}
        or not isinstance(body.get("force", False), bool)
    ):
        raise InvalidArgument('the body must be {"force": true|false} (optional)')
    await run.resume(force=body.get("force", False))
    return json_response({"run_id": run.run_id, "status": "resuming"}, 202)


routes: list[BaseRoute] = [
    Route("/v1/runs/{run_id:id}/resume", resume, methods=["POST"], name="run_resume"),
    # `:id`: one percent-encoded segment (a run ID's "/" is %2F), so no order matters
    Route("/v1/runs/{run_id:id}/result", result, methods=["GET"], name="run_result"),
    Route("/v1/runs/{run_id:id}", describe, methods=["GET"], name="run_describe"),
]
