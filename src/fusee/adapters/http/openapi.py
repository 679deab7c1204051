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


# What the ID checks accept (runtime/ids.py), as a schema: no control characters (C0,
# DEL, C1). The byte limits (256 UTF-8 bytes for IDs and keys, 128 for names) have no
# JSON Schema form: the character limits below always fit them.
_NO_CONTROL = "\\x00-\\x1f\\x7f-\\x9f"
_ID = {"type": "string", "minLength": 1, "maxLength": 64, "pattern": f"^[^{_NO_CONTROL}]+$"}
_NAME = {"type": "string", "minLength": 1, "maxLength": 32, "pattern": f"^[^{_NO_CONTROL}]+$"}
# a run ID must not start with "@" (objects' actors); an object type holds no "/" either
_RUN_ID_SCHEMA = {**_ID, "pattern": f"^[^@{_NO_CONTROL}][^{_NO_CONTROL}]*$"}
_TYPE_SCHEMA = {**_NAME, "pattern": f"^[^@/{_NO_CONTROL}][^/{_NO_CONTROL}]*$"}


_RUN_ID = {
    "name": "run_id",
    "in": "path",
    "required": True,
    "description": "The run's ID, percent-encoded as one path segment (a `/` in it is "
    "`%2F`): at most 256 UTF-8 bytes, no control characters, not starting with `@`.",
    "schema": _RUN_ID_SCHEMA,
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
    "/v1/runs/{run_id}/resume": {
        "post": {
            "operationId": "resumeRun",
            "summary": "Resume a paused run",
            "description": (
                "What `Run.resume()` does: a step whose attempts ran out under "
                "`Retry(on_exhausted='pause')` runs again with a fresh retry budget; a run "
                "paused on a determinism error is replayed by the code deployed now. "
                "Idempotent: two resumes of one pause resume it once. `force`: resume a run "
                "paused on a broken journal chain."
            ),
            "parameters": [_RUN_ID],
            "requestBody": {
                "required": False,
                "content": {_JSON: {"schema": _ref("RunResume")}},
            },
            "responses": {
                "202": {
                    "description": "The resume is stored.",
                    "content": {_JSON: {"schema": _ref("RunResuming")}},
                },
                "400": _error("`InvalidId` (run ID) or `InvalidArgument` (the body)."),
                "404": _NO_RUN,
                "409": _error(
                    "`NotPausedError`: the run is not paused (nothing stored), or it is "
                    "paused on a broken journal chain and `force` is not set."
                ),
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
                    "schema": _NAME,
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

_TYPE = {
    "name": "type",
    "in": "path",
    "required": True,
    "description": "The object type: the name given to `fusee.object` (no `/`, not "
    "starting with `@`).",
    "schema": _TYPE_SCHEMA,
}
_KEY = {
    "name": "key",
    "in": "path",
    "required": True,
    "description": "The object's key, percent-encoded as one path segment (a `/` in it is `%2F`).",
    "schema": _ID,
}
_HANDLER = {
    "name": "handler",
    "in": "path",
    "required": True,
    "description": "The handler's name, as registered in `fusee.object`.",
    "schema": _NAME,
}
_WAIT = {
    "name": "timeout",
    "in": "query",
    "required": False,
    "description": (
        f"How long to wait for the invocation to end: seconds or a duration. Default "
        f"{DEFAULT_WAIT:g}s, at most {MAX_WAIT:g}s."
    ),
    "schema": {"type": "string", "example": "30s"},
}
_IDEMPOTENCY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "A retried request with the same key (within 2 minutes) does not run "
    "the handler again: it gets the first invocation's outcome.",
    "schema": _ID,
}
_BAD_OBJECT = _error(
    "`InvalidId`: the type, key or handler name cannot exist; or `InvalidArgument`: a "
    "bad body, `timeout` or `Idempotency-Key`."
)
_OBJECT_TIMEOUT = _error(
    "`Timeout`: the invocation did not end within `timeout`; it stays queued or running."
)
_ANY_JSON: dict[str, Any] = {"description": "Any JSON value."}

OBJECT_PATHS: dict[str, dict[str, Any]] = {
    "/v1/objects/{type}": {
        "get": {
            "operationId": "listObjects",
            "summary": "The keys of an object type that have state",
            "parameters": [_TYPE],
            "responses": {
                "200": {
                    "description": "Every key with state, sorted by key.",
                    "content": {_JSON: {"schema": _ref("ObjectKeys")}},
                },
                "400": _BAD_OBJECT,
            },
        }
    },
    "/v1/objects/{type}/{key}": {
        "get": {
            "operationId": "showObject",
            "summary": "An object's state and queue",
            "description": "What `ObjectKey.show()` returns: the state, the invocation "
            "running, those waiting (in the order they run) and the last one that ended.",
            "parameters": [_TYPE, _KEY],
            "responses": {
                "200": {
                    "description": "The object.",
                    "content": {_JSON: {"schema": _ref("ObjectInfo")}},
                },
                "400": _BAD_OBJECT,
            },
        }
    },
    "/v1/objects/{type}/{key}/state": {
        "get": {
            "operationId": "getObjectState",
            "summary": "An object's state",
            "description": "`{}` for a key never used.",
            "parameters": [_TYPE, _KEY],
            "responses": {
                "200": {
                    "description": "The state.",
                    "content": {_JSON: {"schema": _ref("ObjectState")}},
                },
                "400": _BAD_OBJECT,
            },
        },
        "patch": {
            "operationId": "editObjectState",
            "summary": "Change an object's state",
            "description": "Applied as one exclusive invocation: it waits for the "
            "invocations queued before it. A bad edit is a `400` and nothing is queued.",
            "parameters": [_TYPE, _KEY, _WAIT],
            "requestBody": {
                "required": True,
                "content": {_JSON: {"schema": _ref("ObjectEdit")}},
            },
            "responses": {
                "200": {
                    "description": "The state after the edit.",
                    "content": {_JSON: {"schema": _ref("ObjectState")}},
                },
                "400": _BAD_OBJECT,
                "504": _OBJECT_TIMEOUT,
            },
        },
        "delete": {
            "operationId": "clearObjectState",
            "summary": "Remove every key of an object's state",
            "description": "An exclusive invocation, in its turn.",
            "parameters": [_TYPE, _KEY, _WAIT],
            "responses": {
                "200": {
                    "description": "The state after: `{}`.",
                    "content": {_JSON: {"schema": _ref("ObjectState")}},
                },
                "400": _BAD_OBJECT,
                "504": _OBJECT_TIMEOUT,
            },
        },
    },
    "/v1/objects/{type}/{key}/call/{handler}": {
        "post": {
            "operationId": "callObject",
            "summary": "Invoke a handler and wait for its result",
            "description": "The body is the handler's input (JSON; an empty body is "
            "`null`). The invocation waits its turn behind those queued before it. A "
            "handler that raises makes the call fail: `500 HandlerFailed` with the "
            "handler's `error_type` and `message`.",
            "parameters": [_TYPE, _KEY, _HANDLER, _WAIT, _IDEMPOTENCY],
            "requestBody": {"required": False, "content": {_JSON: {"schema": _ANY_JSON}}},
            "responses": {
                "200": {
                    "description": "The handler's result.",
                    "content": {_JSON: {"schema": _ref("CallResult")}},
                },
                "400": _BAD_OBJECT,
                "404": _error("`UnknownHandler`: the object type has no such handler."),
                "409": _error("`HandlerCancelled`: the invocation was cancelled."),
                "500": _error(
                    "`HandlerFailed`: the handler raised; `error_type` and `message` are its own."
                ),
                "504": _OBJECT_TIMEOUT,
            },
        }
    },
    "/v1/objects/{type}/{key}/send/{handler}": {
        "post": {
            "operationId": "sendObject",
            "summary": "Queue an invocation without waiting for it",
            "description": "Answers once the invocation is stored (durable). `seq` is its "
            "number, for `cancel`.",
            "parameters": [_TYPE, _KEY, _HANDLER, _IDEMPOTENCY],
            "requestBody": {"required": False, "content": {_JSON: {"schema": _ANY_JSON}}},
            "responses": {
                "202": {
                    "description": "Queued.",
                    "content": {_JSON: {"schema": _ref("Queued")}},
                },
                "400": _BAD_OBJECT,
            },
        }
    },
    "/v1/objects/{type}/{key}/cancel": {
        "post": {
            "operationId": "cancelObject",
            "summary": "Cancel an invocation",
            "description": "Cancels invocation `seq`, or without `seq` the one running "
            "(else the next to run). A running handler's step is cancelled, a queued one "
            "never runs; either ends `fusee.Cancelled` with its state changes dropped.",
            "parameters": [_TYPE, _KEY],
            "requestBody": {
                "required": False,
                "content": {_JSON: {"schema": _ref("ObjectCancel")}},
            },
            "responses": {
                "202": {
                    "description": "The cancel is stored.",
                    "content": {_JSON: {"schema": _ref("ObjectCancel")}},
                },
                "400": _BAD_OBJECT,
                "409": _error("`NothingToCancel`: no `seq` given and nothing is queued."),
            },
        }
    },
}

# a duration back from now ("1h", "90m", "1h30m") or an RFC 3339 time
_WHEN = {
    "anyOf": [
        {"type": "string", "pattern": "^([0-9]{1,6}(ms|s|m|h|d))+$"},
        {"type": "string", "format": "date-time"},
    ]
}
_BULK_FILTERS = {
    "status": {
        "enum": ["pending", "running", "waiting", "paused"],
        "description": "Only runs with this status (bulk resume: `paused` only).",
    },
    "workflow": {**_NAME, "description": "Only runs of this workflow."},
    "since": {
        **_WHEN,
        "description": "Only runs started at or after: a duration back from now (`1h`) "
        "or an ISO 8601 time. With `until`, `until` must be after it (else 400).",
    },
    "until": {**_WHEN, "description": "Only runs started before (as `since`)."},
    "id_prefix": {**_ID, "description": "Only runs whose ID starts with this."},
    "dry_run": {"type": "boolean", "description": "Count what would be done; change nothing."},
}


def _bulk(action: str, summary: str, description: str, body: str) -> dict[str, Any]:
    return {
        "post": {
            "operationId": f"bulk{action.title()}Runs",
            "summary": summary,
            "description": description + " The index is read a page at a time, 32 runs "
            "are acted on at once, and the request answers when all are done. Safe to send "
            "again after an interruption: runs already acted on are skipped.",
            "requestBody": {"required": False, "content": {_JSON: {"schema": _ref(body)}}},
            "responses": {
                "200": {
                    "description": "What was done (with `dry_run`: what would be).",
                    "content": {_JSON: {"schema": _ref("BulkSummary")}},
                },
                "400": _error(
                    "`InvalidArgument` / `ConfigError`: an unknown status, a bad time, "
                    "`until` not after `since`, an unknown field; nothing was done."
                ),
            },
        }
    }


PATHS["/v1/runs/bulk/resume"] = _bulk(
    "resume", "Resume paused runs in bulk", "Resumes every paused run the filters match.",
    "BulkFilters",
)  # fmt: skip
PATHS["/v1/runs/bulk/cancel"] = _bulk(
    "cancel", "Cancel runs in bulk", "Cancels every run that has not ended and that the "
    "filters match, with `reason`.", "BulkCancel",
)  # fmt: skip
PATHS.update(OBJECT_PATHS)

_TOKEN = {
    "name": "token",
    "in": "path",
    "required": True,
    "description": "The completion token `ctx.await_completion` made (the callback URL's "
    "last segment): it authenticates the request by itself.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 2048},
}
_TOKEN_UNKNOWN = _error(
    "`InvalidToken`: the token is malformed or forged, or names no completion wait."
)
_TOKEN_SPENT = _error(
    "`InvalidToken`: the wait is over: it timed out, its run ended, or it was completed "
    "with another value."
)
PATHS["/v1/completions/{token}"] = {
    "get": {
        "operationId": "showCompletion",
        "summary": "What a completion wait asks for (the callback URL)",
        "description": "JSON, or an HTML page with Approve and Reject buttons when the "
        "client accepts `text/html` (a browser).",
        "parameters": [_TOKEN],
        "responses": {
            "200": {
                "description": "The wait, and whether it still waits.",
                "content": {
                    _JSON: {"schema": _ref("Completion")},
                    "text/html": {"schema": {"type": "string"}},
                },
            },
            "404": _TOKEN_UNKNOWN,
        },
    },
    "post": {
        "operationId": "complete",
        "summary": "Complete a wait: approve, reject, or answer with any JSON value",
        "description": "The body is the value the workflow's `await_completion` returns: "
        '`true`, `false`, `{"approved": false, "reason": "..."}` or any JSON. The HTML '
        "page's form (`approved=true|false`, `reason`) works too. Completing again with "
        "the same value is a no-op (`stored: false`).",
        "parameters": [_TOKEN],
        "requestBody": {
            "required": True,
            "content": {
                _JSON: {"schema": _ANY_JSON},
                "application/x-www-form-urlencoded": {
                    "schema": {
                        "type": "object",
                        "required": ["approved"],
                        "properties": {
                            "approved": {"enum": ["true", "false"]},
                            "reason": {"type": "string"},
                        },
                    }
                },
            },
        },
        "responses": {
            "200": {
                "description": "Completed (JSON), or the page again (form).",
                "content": {
                    _JSON: {"schema": _ref("Completed")},
                    "text/html": {"schema": {"type": "string"}},
                },
            },
            "400": _error("`InvalidArgument`: the body is not JSON, or the form is not."),
            "404": _TOKEN_UNKNOWN,
            "409": _TOKEN_SPENT,
        },
    },
}

_LIMIT_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "The limit's name (what `ctx.step(..., limit=)` names), percent-encoded "
    "as one path segment.",
    "schema": _NAME,
}
_BAD_LIMIT = _error(
    "`InvalidId`: the limit name cannot exist (empty, too long, control characters)."
)
PATHS["/v1/limits"] = {
    "get": {
        "operationId": "listLimits",
        "summary": "Every limit, with its holders and waiters",
        "description": "What `fusee limits ls --json` shows, sorted by name: each limit's "
        "config as last set, and the permits held and the waiters per fairness key as of "
        "the limit's last journaled snapshot.",
        "responses": {
            "200": {
                "description": "The limits.",
                "content": {_JSON: {"schema": _ref("Limits")}},
            }
        },
    }
}
PATHS["/v1/limits/{name}"] = {
    "get": {
        "operationId": "getLimit",
        "summary": "A limit",
        "parameters": [_LIMIT_NAME],
        "responses": {
            "200": {"description": "The limit.", "content": {_JSON: {"schema": _ref("Limit")}}},
            "400": _BAD_LIMIT,
            "404": _error("`UnknownLimit`: no limit of this name was set."),
        },
    },
    "put": {
        "operationId": "setLimit",
        "summary": "Set or change a limit (`fusee limits set`)",
        "description": "Changes the fields given; the others keep their value (`null` "
        "removes a rate or a cap, or sets the default burst). A new rate without a burst "
        "gets its default burst (one second's worth); a burst alone keeps the rate. A "
        "limit not set yet is set from the body alone: it needs `per_second` or "
        "`concurrent`. Every worker applies the change at once; waiting steps are served "
        "by the new config.",
        "parameters": [_LIMIT_NAME],
        "requestBody": {"required": True, "content": {_JSON: {"schema": _ref("LimitChange")}}},
        "responses": {
            "200": {
                "description": "The limit as it is now.",
                "content": {_JSON: {"schema": _ref("Limit")}},
            },
            "400": _error(
                "`InvalidId` (the name), or `InvalidArgument`: not an object, an unknown "
                "field, a rate or count that is not positive, a burst without a rate, "
                "nothing to set on a new limit; nothing was stored."
            ),
        },
    },
}

# -- tokens (docs/security.md) -----------------------------------------------------------

_STREAM_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "The stream's name, one path segment.",
    "schema": _NAME,
}
_TOKEN_ID = {
    "name": "token_id",
    "in": "path",
    "required": True,
    "description": "The token's ID (12 hex digits, as `fusee tokens ls` shows).",
    "schema": {"type": "string", "minLength": 1, "maxLength": 64},
}
_TOKEN_INFO = {
    "type": "object",
    "required": ["id", "scope", "name", "created_at", "expires_at", "expired"],
    "properties": {
        "id": {"type": "string"},
        "scope": {"enum": ["read", "write", "admin"]},
        "name": {"type": ["string", "null"]},
        "created_at": {"type": "string", "format": "date-time"},
        "expires_at": {"type": ["string", "null"], "format": "date-time"},
        "expired": {"type": "boolean"},
    },
}
_TTL = {
    "oneOf": [
        {"type": "string", "pattern": "^([1-9][0-9]{0,2}(ms|s|m|h|d)){1,3}$"},
        {"type": "number", "exclusiveMinimum": 0, "maximum": 315_360_000},
    ],
    "description": 'A duration ("30d", "5m") or seconds; at most 10 years (a stream token\'s: 1h).',
}
PATHS["/v1/tokens"] = {
    "get": {
        "operationId": "listTokens",
        "summary": "The namespace's API tokens (admin; never the tokens themselves)",
        "responses": {
            "200": {
                "description": "Every token, oldest first.",
                "content": {
                    _JSON: {
                        "schema": {
                            "type": "object",
                            "required": ["tokens"],
                            "properties": {"tokens": {"type": "array", "items": _TOKEN_INFO}},
                        }
                    }
                },
            }
        },
    },
    "post": {
        "operationId": "createToken",
        "summary": "Make an API token (admin); the answer is the only place it is shown",
        "requestBody": {
            "required": True,
            "content": {
                _JSON: {
                    "schema": {
                        "type": "object",
                        "required": ["scope"],
                        "additionalProperties": False,
                        "properties": {
                            "scope": {"enum": ["read", "write", "admin"]},
                            "name": _NAME,
                            "ttl": _TTL,
                        },
                    }
                }
            },
        },
        "responses": {
            "201": {
                "description": "The token, shown this once.",
                "content": {
                    _JSON: {
                        "schema": {
                            "type": "object",
                            "required": ["token", "id", "scope", "expires_at"],
                            "properties": {
                                "token": {"type": "string"},
                                "id": {"type": "string"},
                                "scope": {"enum": ["read", "write", "admin"]},
                                "expires_at": {"type": ["string", "null"], "format": "date-time"},
                            },
                        }
                    }
                },
            },
            "400": _error("`InvalidArgument`: an unknown scope, a bad name or ttl."),
        },
    },
}
PATHS["/v1/tokens/{token_id}"] = {
    "delete": {
        "operationId": "revokeToken",
        "summary": "Revoke an API token (admin): refused from now on",
        "parameters": [_TOKEN_ID],
        "responses": {
            "204": {"description": "Revoked."},
            "404": _error("`UnknownToken`: no token with this ID."),
        },
    }
}
PATHS["/v1/runs/{run_id}/streams/{name}/token"] = {
    "post": {
        "operationId": "streamToken",
        "summary": "A short-lived token that reads this one stream (for a browser's EventSource)",
        "description": "Use it as `GET /v1/runs/{run_id}/streams/{name}?access_token=...`; "
        "it opens no other route. It lives `ttl` (default 5m, at most 1h) and stops working "
        "when the token that asked for it is revoked.",
        "parameters": [_RUN_ID, _STREAM_NAME],
        "requestBody": {
            "required": False,
            "content": {
                _JSON: {
                    "schema": {
                        "type": ["object", "null"],
                        "additionalProperties": False,
                        "properties": {"ttl": _TTL},
                    }
                }
            },
        },
        "responses": {
            "201": {
                "description": "The stream token.",
                "content": {
                    _JSON: {
                        "schema": {
                            "type": "object",
                            "required": ["access_token", "expires_at"],
                            "properties": {
                                "access_token": {"type": "string"},
                                "expires_at": {"type": "string", "format": "date-time"},
                            },
                        }
                    }
                },
            },
            "400": _error("`InvalidId` or `InvalidArgument` (a ttl that is not 0 to 1h)."),
            "404": _NO_RUN,
        },
    }
}

_INVOCATION = {
    "type": "object",
    "required": ["seq", "handler"],
    "properties": {
        "seq": {"type": "integer", "description": "The invocation's number (for cancel)."},
        "handler": {"type": "string", "description": "`fusee.edit` for an edit or a clear."},
        "queued_at": {"type": ["number", "null"], "description": "Unix time, seconds."},
        "running_since": {"type": ["number", "null"], "description": "Unix time, seconds."},
        "cancelling": {"type": "boolean", "description": "A cancel for it is stored."},
    },
}

_LIMIT: dict[str, Any] = {
    "type": "object",
    "required": ["name", "per_second", "burst", "concurrent", "holders", "waiters"],
    "properties": {
        "name": {"type": "string"},
        "per_second": {
            "type": ["number", "null"],
            "description": "Permits a second (a token bucket); `null`: no rate.",
        },
        "burst": {"type": ["integer", "null"], "description": "Tokens the bucket holds."},
        "concurrent": {
            "type": ["integer", "null"],
            "description": "Permits held at once at most; `null`: no cap.",
        },
        "holders": {"type": "integer", "minimum": 0, "description": "Permits held now."},
        "waiters": {
            "type": "object",
            "additionalProperties": {"type": "integer", "minimum": 1},
            "description": 'Fairness key (`""`: none) -> steps waiting for a permit.',
        },
    },
}
LIMIT_SCHEMAS: dict[str, Any] = {
    "Limit": _LIMIT,
    "Limits": {
        "type": "object",
        "required": ["limits"],
        "properties": {"limits": {"type": "array", "items": _ref("Limit")}},
    },
    "LimitChange": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "per_second": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "burst": {"type": ["integer", "null"], "minimum": 1},
            "concurrent": {"type": ["integer", "null"], "minimum": 1},
        },
    },
}

OBJECT_SCHEMAS: dict[str, Any] = {
    "ObjectState": {
        "type": "object",
        "description": "The state: top-level keys to JSON values.",
        "additionalProperties": True,
        "propertyNames": {"minLength": 1},
    },
    "ObjectKeys": {
        "type": "object",
        "required": ["keys"],
        "properties": {
            "keys": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["key", "state"],
                    "properties": {"key": {"type": "string"}, "state": _ref("ObjectState")},
                },
            }
        },
    },
    "ObjectInfo": {
        "type": "object",
        "required": ["object_type", "key", "state", "running", "waiting", "last"],
        "properties": {
            "object_type": {"type": "string"},
            "key": {"type": "string"},
            "state": _ref("ObjectState"),
            "running": {"oneOf": [_INVOCATION, {"type": "null"}]},
            "waiting": {"type": "array", "items": _INVOCATION},
            "last": {
                "oneOf": [
                    {
                        "type": "object",
                        "required": ["seq", "handler", "ok"],
                        "properties": {
                            "seq": {"type": "integer"},
                            "handler": {"type": "string"},
                            "ok": {"type": "boolean"},
                            "error": {"type": "string", "description": "`Type: message`."},
                        },
                    },
                    {"type": "null"},
                ]
            },
            "crashed": {
                "description": "Set while the key's actor is quarantined after crashing: "
                "`crashes` in a row, the last `error`, when (`at`, Unix time), `retry_in` "
                "seconds and the `worker`.",
                "oneOf": [{"type": "object"}, {"type": "null"}],
            },
            "unserved": {
                "description": "Set while no live worker serves the key's object type: why.",
                "oneOf": [{"type": "string"}, {"type": "null"}],
            },
        },
    },
    "ObjectEdit": {
        "type": "object",
        "description": 'Either `{"state": {...}}` (replaces the whole state) or any of '
        "`set`, `delete`, `clear` (`clear` first, then `delete`, then `set`).",
        "properties": {
            "state": _ref("ObjectState"),
            "set": {
                "type": "object",
                "additionalProperties": True,
                "propertyNames": {"minLength": 1},
            },
            "delete": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "clear": {"type": "boolean"},
        },
        "additionalProperties": False,
        # something to do: a whole state alone, or a key to set, one to delete, a clear
        "anyOf": [
            {"required": ["state"], "maxProperties": 1},
            {
                "required": ["set"],
                "not": {"required": ["state"]},
                "properties": {"set": {"minProperties": 1}},
            },
            {
                "required": ["delete"],
                "not": {"required": ["state"]},
                "properties": {"delete": {"minItems": 1}},
            },
            {
                "required": ["clear"],
                "not": {"required": ["state"]},
                "properties": {"clear": {"const": True}},
            },
        ],
    },
    "CallResult": {
        "type": "object",
        "required": ["result"],
        "properties": {"result": _ANY_JSON},
    },
    "Queued": {
        "type": "object",
        "required": ["seq"],
        "properties": {"seq": {"type": "integer"}},
    },
    "ObjectCancel": {
        "type": "object",
        "properties": {
            "seq": {"type": "integer", "minimum": 1},
            "reason": {"type": "string"},
        },
        "additionalProperties": False,
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
                    "error_type": {
                        "type": "string",
                        "description": "An object handler's failure: the exception type it "
                        "raised (`ValueError`), `fusee.Cancelled`, `fusee.Timeout`.",
                    },
                    "handler": {
                        "type": "string",
                        "description": "An object handler's failure: the handler.",
                    },
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
            "step": {
                "type": "string",
                "description": "The step a failed run failed in, or a paused run paused at.",
            },
            "attempts": {
                "type": "integer",
                "description": "A paused step's attempts (of the retry budget that ran out).",
            },
            "generation": {"type": "integer"},
        },
    },
    "BulkFilters": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            **_BULK_FILTERS,
            "status": {"enum": ["paused"], "description": "Paused runs (the default)."},
        },
    },
    "BulkCancel": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            **_BULK_FILTERS,
            "reason": {"type": "string", "description": "Why (shown on each run)."},
        },
    },
    "BulkSummary": {
        "type": "object",
        "required": ["action", "dry_run", "done", "skipped", "failed"],
        "properties": {
            "action": {"enum": ["resume", "cancel"]},
            "dry_run": {"type": "boolean"},
            "done": {
                "type": "integer",
                "description": (
                    "Runs the resume or cancel was sent to (stored in the run's inbox; the "
                    "run takes it when its worker reads it, which is not waited for). With "
                    "`dry_run`: the runs it would be sent to."
                ),
            },
            "skipped": {
                "type": "integer",
                "description": "Runs listed that needed nothing when acted on: resumed since, or ended meanwhile.",
            },
            "failed": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": (
                    "Run ID -> why its action failed (a store error; a run paused on a "
                    "broken journal chain, which needs a forced resume)."
                ),
            },
        },
    },
    "RunResume": {
        "type": "object",
        "properties": {
            "force": {
                "type": "boolean",
                "description": "Resume a run paused on a broken journal chain.",
            }
        },
        "additionalProperties": False,
    },
    "RunResuming": {
        "type": "object",
        "required": ["run_id", "status"],
        "properties": {"run_id": {"type": "string"}, "status": {"const": "resuming"}},
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
    "Completion": {
        "type": "object",
        "required": ["run_id", "workflow", "name", "status"],
        "properties": {
            "run_id": {"type": "string"},
            "workflow": {"type": "string"},
            "name": {"type": "string"},
            "status": {"enum": ["waiting", "completed", "expired"]},
            "until": {"type": ["number", "null"]},
            "value": {},
            "reason": {"type": ["string", "null"]},
        },
    },
    "Completed": {
        "type": "object",
        "required": ["completed", "stored", "value"],
        "properties": {
            "completed": {"const": True},
            "stored": {"type": "boolean"},
            "value": {},
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


_TOO_LARGE = _error(
    "`PayloadTooLarge`: the body is over the API's limit (`fusee api --max-body`, default "
    "1 MiB); it was not kept."
)


_OPEN = ("/healthz", "/openapi.json", "/v1/completions/{token}")  # no token (auth.py)
_AUTH_ERROR = {
    "description": "`unauthorized` (401: no token, or a malformed, unknown, revoked, "
    "expired or forged one) or `forbidden` (403: its scope is too low).",
    "content": {
        _JSON: {
            "schema": {
                "type": "object",
                "required": ["error"],
                "properties": {
                    "error": {
                        "type": "object",
                        "required": ["code", "message", "request_id"],
                        "properties": {
                            "code": {"enum": ["unauthorized", "forbidden"]},
                            "message": {"type": "string"},
                            "request_id": {"type": "string"},
                        },
                    }
                },
            }
        }
    },
}


def _with_common(item: dict[str, Any], path: str = "") -> dict[str, Any]:
    """Statuses every operation of a kind can answer: ``413`` where a body is taken,
    ``401``/``403`` where a token is needed."""
    out: dict[str, Any] = {}
    for method, op in item.items():
        if isinstance(op, dict) and "requestBody" in op:
            op = {**op, "responses": {**op["responses"], "413": _TOO_LARGE}}
        if isinstance(op, dict) and path not in _OPEN:
            op = {
                **op,
                "security": [{"bearer": []}],
                "responses": {**op["responses"], "401": _AUTH_ERROR, "403": _AUTH_ERROR},
            }
        out[method] = op
    return out


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
            "description": "Runs, keyed objects and limits of a fusee namespace over HTTP. Every error is "
            '`{"error": {"type", "message", "status"}}`.',
        },
        "paths": {path: _with_common(PATHS[path], path) for path in sorted(served)},
        "components": {
            "schemas": {**_SCHEMAS, **OBJECT_SCHEMAS, **LIMIT_SCHEMAS},
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API token (`fusee tokens create`), or on a stream's "
                    "GET a stream token (also as `?access_token=`). See docs/security.md.",
                }
            },
        },
    }
