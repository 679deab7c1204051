"""The OpenAPI 3.1 document of the HTTP API, written by hand next to the routes.

By hand because the interesting parts (the SSE event grammar, the 200/202 split of
``/result``, the error shape) are what a generator gets wrong. :func:`openapi_document`
checks that every route of the app is documented, so a route added without its entry
fails the first request for the document (and the test that makes it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from starlette.routing import BaseRoute, Route

from fusee.adapters.http.params import DEFAULT_WAIT, MAX_WAIT

__all__ = ("openapi_document", "PATHS")

_JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": _ref("Error")}}}


_RUN_ID = {
    "name": "run_id",
    "in": "path",
    "required": True,
    "description": "The run's ID (it may contain `/`).",
    "schema": {"type": "string", "minLength": 1},
}
_BAD_ID = _error(
    "`InvalidId`: the run ID or stream name cannot exist (empty, too long, control characters)."
)
_NO_RUN = _error("`RunNotFound`: no run with this ID in the namespace.")

PATHS: dict[str, dict[str, Any]] = {
    "/healthz": {
        "get": {
            "operationId": "healthz",
            "summary": "Liveness and readiness",
            "responses": {
                "200": {
                    "description": "Connected to NATS.",
                    "content": {_JSON: {"schema": _ref("Health")}},
                },
                "503": _error("`ServiceUnavailable`: the NATS connection is down (reconnecting)."),
            },
        }
    },
    "/openapi.json": {
        "get": {
            "operationId": "openapi",
            "summary": "This document",
            "responses": {"200": {"description": "The OpenAPI document.", "content": {_JSON: {}}}},
        }
    },
    "/v1/runs/{run_id}": {
        "get": {
            "operationId": "describeRun",
            "summary": "A run's status",
            "description": "What `Run.describe()` returns, read from the run's journal.",
            "parameters": [_RUN_ID],
            "responses": {
                "200": {"description": "The run.", "content": {_JSON: {"schema": _ref("RunInfo")}}},
                "400": _BAD_ID,
                "404": _NO_RUN,
            },
        }
    },
    "/v1/runs/{run_id}/result": {
        "get": {
            "operationId": "runResult",
            "summary": "Wait for a run's outcome",
            "description": (
                "Waits up to `timeout` for the run to end. An ended run answers `200` with its "
                "outcome, whether it completed, failed or was cancelled: the request "
                "succeeded, the run's error is data. A run that has not ended answers `202` "
                "with its status: ask again. A paused run answers `202` at once."
            ),
            "parameters": [
                _RUN_ID,
                {
                    "name": "timeout",
                    "in": "query",
                    "required": False,
                    "description": (
                        f"How long to wait: seconds (`2.5`) or a duration (`30s`, `1m30s`, "
                        f"`500ms`). Default {DEFAULT_WAIT:g}s, at most {MAX_WAIT:g}s; `0` "
                        "answers at once."
                    ),
                    "schema": {"type": "string", "example": "30s"},
                },
            ],
            "responses": {
                "200": {
                    "description": "The run ended: `completed` with `result`, or `failed` / `cancelled` with `error`.",
                    "content": {_JSON: {"schema": _ref("RunOutcome")}},
                },
                "202": {
                    "description": "The run has not ended (`pending`, `running`) or is `paused`.",
                    "content": {_JSON: {"schema": _ref("RunWaiting")}},
                },
                "400": _error("`InvalidId` (run ID) or `InvalidArgument` (`timeout`)."),
                "404": _NO_RUN,
            },
        }
    },
    "/v1/runs/{run_id}/streams/{name}": {
        "get": {
            "operationId": "followStream",
            "summary": "Follow a token stream (server-sent events)",
            "description": (
                "The tokens of the stream `name` of the run (a `model_call`'s name), as "
                "`text/event-stream`, from an offset, while the run goes on and after it "
                "ended. Events:\n\n"
                '- `token`: `id: <index>`, `data: {"text", "index", "attempt"}`\n'
                "- `attempt`: the model call started over (attempt `attempt`); the text "
                "of the earlier attempt is discarded. No `id`.\n"
                "- `end`: the stream is complete; the response then closes. No `id`.\n"
                "- `error`: `data` is an `Error`; the response then closes.\n\n"
                "Comments (`: keep-alive`) come every 15 s while no event does. A client "
                "that reconnects with `Last-Event-ID: <index>` continues at `index + 1`, "
                "without a gap or a duplicate. An offset past the end waits for tokens to "
                "come (the run may still write them)."
            ),
            "parameters": [
                _RUN_ID,
                {
                    "name": "name",
                    "in": "path",
                    "required": True,
                    "description": "The stream's name: the name given to `model_call`.",
                    "schema": {"type": "string", "minLength": 1},
                },
                {
                    "name": "from",
                    "in": "query",
                    "required": False,
                    "description": "The index of the first token to send (default 0).",
                    "schema": {"type": "integer", "minimum": 0},
                },
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "required": False,
                    "description": "The index of the last token the client has; wins over `from`.",
                    "schema": {"type": "integer", "minimum": 0},
                },
            ],
            "responses": {
                "200": {
                    "description": "The event stream.",
                    "content": {
                        "text/event-stream": {
                            "schema": {"type": "string"},
                            "example": (
                                'id: 0\nevent: token\ndata: {"text":"Hel","index":0,"attempt":1}\n\n'
                                'event: end\ndata: {"text":"","index":1,"attempt":1}\n\n'
                            ),
                        }
                    },
                },
                "400": _error(
                    "`InvalidId`, or `InvalidArgument`: `from` or `Last-Event-ID` is not an integer >= 0."
                ),
                "404": _error(
                    "`RunNotFound`, or `StreamNotFound`: the run ended without this stream."
                ),
                "406": _error("`NotAcceptable`: `Accept` excludes `text/event-stream`."),
            },
        }
    },
}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["type", "message", "status"],
                "properties": {
                    "type": {
                        "type": "string",
                        "description": "Stable: `RunNotFound`, `StreamNotFound`, `InvalidId`, "
                        "`InvalidArgument`, `NotFound`, `MethodNotAllowed`, `NotAcceptable`, "
                        "`ServiceUnavailable`, `InternalError`...",
                    },
                    "message": {"type": "string", "description": "For people; may change."},
                    "status": {"type": "integer", "description": "The HTTP status code."},
                },
            }
        },
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"const": "ok"}, "namespace": {"type": "string"}},
    },
    "RunInfo": {
        "type": "object",
        "required": ["run_id", "workflow", "status"],
        "properties": {
            "run_id": {"type": "string"},
            "workflow": {"type": "string"},
            "status": {
                "enum": ["pending", "running", "completed", "failed", "cancelled", "paused"]
            },
            "partition": {"type": "integer"},
            "created_at": {"type": "number", "description": "Unix time, seconds."},
            "updated_at": {"type": "number", "description": "Unix time, seconds."},
            "steps": {"type": "integer", "description": "Steps completed or failed so far."},
            "reason": {"type": "string", "description": "Why it is paused, cancelled or waiting."},
            "error_type": {"type": "string", "description": "A failed run's error type."},
            "message": {"type": "string", "description": "A failed run's error message."},
            "step": {"type": "string", "description": "The step a failed run failed in."},
        },
    },
    "RunOutcome": {
        "type": "object",
        "required": ["run_id", "status"],
        "properties": {
            "run_id": {"type": "string"},
            "status": {"enum": ["completed", "failed", "cancelled"]},
            "result": {"description": "A completed run's result (any JSON value)."},
            "error": {
                "type": "object",
                "description": "A failed or cancelled run's error.",
                "required": ["type", "message"],
                "properties": {
                    "type": {
                        "type": "string",
                        "description": "The exception type raised in the workflow (`ValueError`), or `fusee.Cancelled`.",
                    },
                    "message": {"type": "string"},
                },
            },
        },
    },
    "RunWaiting": {
        "type": "object",
        "required": ["run_id", "status"],
        "properties": {
            "run_id": {"type": "string"},
            "status": {"enum": ["pending", "running", "paused"]},
            "reason": {"type": "string"},
        },
    },
}

_CONVERTER = re.compile(r"\{(\w+):\w+\}")


def documented_path(route_path: str) -> str:
    """A Starlette route path as OpenAPI writes it: ``{run_id:path}`` -> ``{run_id}``."""
    return _CONVERTER.sub(r"{\1}", route_path)


def openapi_document(routes: Sequence[BaseRoute], version: str = "") -> dict[str, Any]:
    """The OpenAPI document for ``routes``.

    Raises:
        RuntimeError: a route has no entry in :data:`PATHS` (a bug of this module).
    """
    served = {documented_path(r.path) for r in routes if isinstance(r, Route)}
    missing = served - PATHS.keys()
    if missing:
        raise RuntimeError(f"routes missing from the OpenAPI document: {sorted(missing)}")
    if not version:
        from fusee import __version__ as version
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fusee HTTP API",
            "version": version,
            "description": "Runs of a fusee namespace over HTTP. Every error is "
            '`{"error": {"type", "message", "status"}}`.',
        },
        "paths": {path: PATHS[path] for path in sorted(served)},
        "components": {"schemas": _SCHEMAS},
    }
