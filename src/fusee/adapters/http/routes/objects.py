"""``/v1/objects/{type}/{key}``: keyed objects' state and queue, and calls to their handlers.

The API knows object types by name only, so every handler is invoked as an exclusive
invocation through the key's inbox (the worker runs it). A handler's failure is the
call's failure: ``500 handler_failed`` (``409 handler_cancelled``, ``404
unknown_handler``) with the handler's own ``error_type`` and ``handler`` in the error body.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, delete, get, patch, post
from litestar.params import Body, HeaderParameter

from fusee import ObjectInfo, ObjectKey
from fusee.adapters.http.errors import ApiError
from fusee.adapters.http.models import (
    CallResult,
    CancelQueued,
    ObjectCancel,
    ObjectEdit,
    ObjectKeys,
    ObjectKeyState,
    ObjectTypes,
    Queued,
)
from fusee.adapters.http.params import parse_wait
from fusee.adapters.http.schemas import ID_SCHEMA, Key, Name, ObjectTypeName, Wait, errors
from fusee.adapters.http.state import api_state, until_disconnect
from fusee.errors import HandlerCancelled, HandlerFailed, InvalidArgument, Timeout
from fusee.runtime.ids import validate_id, validate_name

__all__ = ("handlers",)

UNKNOWN_HANDLER = "fusee.UnknownHandler"  # the error_type of a handler the type lacks
AnyRequest = Request[Any, Any, Any]

_BAD = (
    "`invalid_id`: the type, key or handler name cannot exist; or `invalid_argument`: a "
    "bad body, `timeout` or `Idempotency-Key`."
)
_TIMEOUT = "`timeout`: the invocation did not end within `timeout`; it stays queued or running."

IdempotencyKey = Annotated[
    str | None,
    HeaderParameter(
        name="Idempotency-Key",
        description="A retried request with the same key (within 2 minutes) does not run "
        "the handler again: it gets the first invocation's outcome.",
        schema_extra=ID_SCHEMA,
    ),
]

# something to do: a whole state alone, or a key to set, one to delete, a clear
_EDIT_RULES: dict[str, Any] = {
    "anyOf": [
        {"required": ["state"], "maxProperties": 1, "properties": {"state": {"type": "object"}}},
        {
            "required": ["set"],
            "not": {"required": ["state"]},
            "properties": {"set": {"type": "object", "minProperties": 1}},
        },
        {
            "required": ["delete"],
            "not": {"required": ["state"]},
            "properties": {"delete": {"type": "array", "minItems": 1}},
        },
        {
            "required": ["clear"],
            "not": {"required": ["state"]},
            "properties": {"clear": {"const": True}},
        },
    ]
}


def _object(request: AnyRequest, object_type: str, key: str) -> ObjectKey:
    return api_state(request).engine.object(object_type, key)


def _timed_out(obj: ObjectKey, what: str, wait: float) -> ApiError:
    return ApiError(
        504,
        f"{obj.object_type}/{obj.key}: {what} did not end within {wait:g}s; it stays queued "
        "or running (GET /v1/objects/{type}/{key} shows the queue)",
        "timeout",
    )


@get("/v1/objects", summary="The object types that have (or had) a key with state")
async def list_types(request: AnyRequest) -> ObjectTypes:
    return ObjectTypes(types=await api_state(request).engine.object_types())


@get(
    "/v1/objects/{object_type:str}",
    summary="The keys of an object type that have state",
    responses=errors(e400=_BAD),
)
async def list_keys(request: AnyRequest, object_type: ObjectTypeName) -> ObjectKeys:
    keys = await api_state(request).engine.list_objects(object_type)
    return ObjectKeys(keys=[ObjectKeyState(key=k, state=s) for k, s in keys])


@get(
    "/v1/objects/{object_type:str}/{key:str}",
    summary="An object's state and queue",
    responses=errors(e400=_BAD),
)
async def show(request: AnyRequest, object_type: ObjectTypeName, key: Key) -> ObjectInfo:
    return await _object(request, object_type, key).show()


@get(
    "/v1/objects/{object_type:str}/{key:str}/state",
    summary="An object's state (`{}` for a key never used)",
    responses=errors(e400=_BAD),
)
async def get_state(request: AnyRequest, object_type: ObjectTypeName, key: Key) -> dict[str, Any]:
    return await _object(request, object_type, key).state()


@patch(
    "/v1/objects/{object_type:str}/{key:str}/state",
    summary="Change an object's state",
    description="Applied as one exclusive invocation, in its turn; answers the new state.",
    responses=errors(e400=_BAD, e504=_TIMEOUT),
)
async def patch_state(
    request: AnyRequest,
    object_type: ObjectTypeName,
    key: Key,
    data: Annotated[ObjectEdit, Body(schema_extra=_EDIT_RULES)],
    timeout: Wait = None,
) -> dict[str, Any]:
    obj = _object(request, object_type, key)
    wait = parse_wait(timeout)
    if data.state is not None and (data.set or data.delete or data.clear):
        raise InvalidArgument("'state' replaces the whole state: send it without set/delete/clear")
    if data.state is None and not (data.set or data.delete or data.clear):
        raise InvalidArgument(
            'nothing to edit: send {"set": {...}}, {"delete": [...]}, {"clear": true} '
            'or {"state": {...}}'
        )
    try:
        return await until_disconnect(
            request,
            lambda: obj.edit(
                set=data.set, delete=data.delete, state=data.state, clear=data.clear, timeout=wait
            ),
        )
    except Timeout:
        raise _timed_out(obj, "the edit", wait) from None


@delete(
    "/v1/objects/{object_type:str}/{key:str}/state",
    status_code=200,
    summary="Remove every key of an object's state",
    responses=errors(e400=_BAD, e504=_TIMEOUT),
)
async def clear_state(
    request: AnyRequest, object_type: ObjectTypeName, key: Key, timeout: Wait = None
) -> dict[str, Any]:
    obj = _object(request, object_type, key)
    wait = parse_wait(timeout)
    try:
        await until_disconnect(request, lambda: obj.clear(timeout=wait))
    except Timeout:
        raise _timed_out(obj, "the clear", wait) from None
    return await obj.state()


def _idempotency(key: str | None) -> str | None:
    return None if key is None else validate_id(key, "Idempotency-Key")


@post(
    "/v1/objects/{object_type:str}/{key:str}/call/{handler:str}",
    status_code=200,
    summary="Invoke a handler and wait for its result",
    description="The body (any JSON; empty: `null`) is the handler's input.",
    responses=errors(
        e400=_BAD,
        e404="`unknown_handler`: the object type has no such handler.",
        e409="`handler_cancelled`: the invocation was cancelled.",
        e500="`handler_failed`: the handler raised; `error_type` and `handler` say which.",
        e504=_TIMEOUT,
    ),
)
async def call(
    request: AnyRequest,
    object_type: ObjectTypeName,
    key: Key,
    handler: Name,
    timeout: Wait = None,
    idempotency_key: IdempotencyKey = None,
    data: Annotated[Any, Body()] = None,
) -> CallResult:
    obj = _object(request, object_type, key)
    handler = validate_name(handler, "handler name")
    wait = parse_wait(timeout)
    ikey = _idempotency(idempotency_key)
    try:
        result = await until_disconnect(
            request, lambda: obj.call(handler, data, idempotency_key=ikey, timeout=wait)
        )
    except HandlerCancelled as exc:
        raise _handler_error(409, "handler_cancelled", exc) from None
    except HandlerFailed as exc:
        if exc.error_type == UNKNOWN_HANDLER:
            raise _handler_error(404, "unknown_handler", exc) from None
        raise _handler_error(500, "handler_failed", exc) from None
    except Timeout:
        raise _timed_out(obj, f"{handler!r}", wait) from None
    return CallResult(result=result)


def _handler_error(status: int, code: str, exc: HandlerFailed) -> ApiError:
    return ApiError(status, exc.message, code, handler=exc.handler, error_type=exc.error_type)


@post(
    "/v1/objects/{object_type:str}/{key:str}/send/{handler:str}",
    status_code=202,
    summary="Queue an invocation without waiting for it",
    description="`202 {seq}` once it is stored (durable).",
    responses=errors(e400=_BAD),
)
async def send(
    request: AnyRequest,
    object_type: ObjectTypeName,
    key: Key,
    handler: Name,
    idempotency_key: IdempotencyKey = None,
    data: Annotated[Any, Body()] = None,
) -> Queued:
    obj = _object(request, object_type, key)
    handler = validate_name(handler, "handler name")
    seq = await obj.send(handler, data, idempotency_key=_idempotency(idempotency_key))
    return Queued(seq=seq)


@post(
    "/v1/objects/{object_type:str}/{key:str}/cancel",
    status_code=202,
    summary="Cancel an invocation",
    description="Without `seq`: the invocation running, else the next to run.",
    responses=errors(e400=_BAD, e409="`nothing_to_cancel`: no `seq` given and nothing is queued."),
)
async def cancel(
    request: AnyRequest,
    object_type: ObjectTypeName,
    key: Key,
    data: Annotated[ObjectCancel | None, Body()] = None,
) -> CancelQueued:
    obj = _object(request, object_type, key)
    body = data or ObjectCancel()
    seq = body.seq
    if seq is not None and seq < 1:
        raise InvalidArgument(f"seq={seq!r}: an invocation's number (>= 1), from the queue")
    if seq is None:
        # A numbered cancel: one without a target stays in the inbox and could be
        # applied again to a later invocation when the object is re-activated.
        info = await obj.show()
        queued = [*([info.running] if info.running else []), *info.waiting]
        heads = [inv.seq for inv in queued if not inv.cancelling]
        if not heads:
            raise ApiError(
                409,
                f"{obj.object_type}/{obj.key} runs nothing and has nothing queued to cancel",
                "nothing_to_cancel",
            )
        seq = heads[0]
    await obj.cancel(seq, body.reason)
    return CancelQueued(seq=seq, reason=body.reason)


handlers = [list_types, list_keys, show, get_state, patch_state, clear_state, call, send, cancel]
