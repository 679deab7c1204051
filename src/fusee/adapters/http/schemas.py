"""What the routes' signatures share: path parameters with their documented form, and
the error responses each route lists in the OpenAPI document.

IDs are checked by fusee's own rules (``runtime/ids.py``) inside the handlers, so a bad
one gets ``invalid_id`` with a message naming the rule; the schemas below only document
them (``schema_extra``: the framework does not enforce them): no control characters,
and the byte limits (256 UTF-8 bytes for IDs and keys, 128 for names) as ``maxLength``
of that many characters, since JSON Schema counts characters. An ASCII ID of 256
characters is taken; one of 256 characters some of which take several bytes is
refused (``invalid_id``, the message names the byte limit).
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar.openapi import ResponseSpec
from litestar.params import Parameter, QueryParameter

from fusee.adapters.http.errors import ErrorBody
from fusee.adapters.http.params import DEFAULT_WAIT, MAX_WAIT

__all__ = (
    "RunId",
    "Name",
    "ObjectTypeName",
    "Key",
    "Token",
    "Wait",
    "errors",
    "also",
    "BAD_ID",
    "NO_RUN",
)

_NO_CONTROL = "\\x00-\\x1f\\x7f-\\x9f"
ID_SCHEMA: dict[str, Any] = {
    "minLength": 1,
    "maxLength": 256,
    "pattern": f"^[^{_NO_CONTROL}]+$",
}
NAME_SCHEMA: dict[str, Any] = {
    "minLength": 1,
    "maxLength": 128,
    "pattern": f"^[^{_NO_CONTROL}]+$",
}
# a run ID must not start with "@" (objects' actors); an object type holds no "/" either
RUN_ID_SCHEMA = {**ID_SCHEMA, "pattern": f"^[^@{_NO_CONTROL}][^{_NO_CONTROL}]*$"}
TYPE_SCHEMA = {**NAME_SCHEMA, "pattern": f"^[^@/{_NO_CONTROL}][^/{_NO_CONTROL}]*$"}

# a duration back from now ("1h", "90m") or an RFC 3339 time
WHEN: dict[str, Any] = {
    "any_of": [
        {"type": "string", "pattern": "^([0-9]{1,6}(ms|s|m|h|d))+$"},
        {"type": "string", "format": "date-time"},
    ]
}

RunId = Annotated[
    str,
    Parameter(
        description="The run's ID, percent-encoded as one path segment (a `/` in it is "
        "`%2F`): at most 256 UTF-8 bytes, no control characters, not starting with `@`.",
        schema_extra=RUN_ID_SCHEMA,
    ),
]
Name = Annotated[
    str,
    Parameter(
        description="A name (stream, signal, limit, handler), one path segment.",
        schema_extra=NAME_SCHEMA,
    ),
]
ObjectTypeName = Annotated[
    str,
    Parameter(
        description="The object type: the name given to `fusee.object` (no `/`, not "
        "starting with `@`).",
        schema_extra=TYPE_SCHEMA,
    ),
]
Key = Annotated[
    str,
    Parameter(
        description="The object's key, percent-encoded as one path segment (a `/` in it is `%2F`).",
        schema_extra=ID_SCHEMA,
    ),
]
Token = Annotated[
    str,
    Parameter(description="The completion token (from the URL `ctx.await_completion` made)."),
]
Wait = Annotated[
    str | None,
    QueryParameter(
        name="timeout",
        description=f"How long to wait: seconds or a duration. Default {DEFAULT_WAIT:g}s, "
        f"at most {MAX_WAIT:g}s.",
        schema_extra={"examples": ["30s"]},
    ),
]


def also(container: Any, description: str) -> ResponseSpec:
    """A second success response of a route (``200`` beside a ``201``, ``202``)."""
    return ResponseSpec(data_container=container, description=description, generate_examples=False)


def errors(**described: str) -> dict[int, ResponseSpec]:
    """Error responses for a route's ``responses=``: ``errors(e404="`run_not_found`: ...")``.
    Every route also lists ``400`` (a request that cannot be taken as sent) and ``413``
    (a body over the limit: the limit applies to any request)."""
    described = {"e400": BAD_REQUEST, "e413": TOO_LARGE, **described}
    out = {}
    for key, text in described.items():
        out[int(key[1:])] = ResponseSpec(
            data_container=ErrorBody, description=text, generate_examples=False
        )
    return out


BAD_REQUEST = (
    "`bad_request`, `invalid_argument`: the request cannot be taken as sent (the message "
    "says what)."
)
TOO_LARGE = (
    "`payload_too_large`: the body is over the API's limit (`fusee api --max-body`, "
    "default 1 MiB); it was not kept."
)
BAD_ID = "`invalid_id` (an ID or name that cannot exist: empty, too long, control characters) or `invalid_argument` (a bad query parameter or body)."
NO_RUN = "`run_not_found`: no run with this ID in the namespace."
