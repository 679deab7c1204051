"""``/v1/objects/{type:id}/{key}``: keyed objects' state and queue, and calls to their handlers.

The API knows object types by name only, so every handler is invoked as an exclusive
invocation through the key's inbox (the worker runs it). A handler's failure is the
call's failure: ``500 HandlerFailed`` (``409 HandlerCancelled``, ``404 UnknownHandler``)
with the handler's own ``error_type`` and ``message`` in the error body.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fusee import ObjectKey
from fusee.adapters.http.errors import ApiError, error_response
from fusee.adapters.http.params import parse_wait
from fusee.adapters.http.state import api_state, json_body, json_response, until_disconnect
from fusee.errors import HandlerCancelled, HandlerFailed, InvalidArgument, Timeout
from fusee.runtime.ids import validate_id, validate_name

__all__ = ("routes",)

UNKNOWN_HANDLER = "fusee.UnknownHandler"  # the error_type of a handler the type lacks


def _object(request: Request) -> ObjectKey:
    params = request.path_params
    return api_state(request).engine.object(params["type"], params["key"])


def _timed_out(obj: ObjectKey, what: str, wait: float) -> Response:
    return error_response(
        504,
        "Timeout",
        f"{obj.object_type}/{obj.key}: {what} did not end within {wait:g}s; it stays queued "
        "or running (GET /v1/objects/{type:id}/{key} shows the queue)",
    )


async def list_keys(request: Request) -> Response:
    """``GET /v1/objects/{type:id}``: every key with state, and its state, sorted by key."""
    engine = api_state(request).engine
    keys = await engine.list_objects(request.path_params["type"])
    return json_response({"keys": [{"key": key, "state": state} for key, state in keys]})


async def show(request: Request) -> Response:
    """``GET /v1/objects/{type:id}/{key}``: the state, the running and waiting invocations,
    and the last one that ended (``ObjectKey.show()``)."""
    return json_response(await _object(request).show())


async def state(request: Request) -> Response:
    """``/v1/objects/{type:id}/{key}/state``: ``GET`` reads it, ``PATCH`` edits it,
    ``DELETE`` clears it."""
    if request.method == "PATCH":
        return await _patch_state(request)
    if request.method == "DELETE":
        return await _clear_state(request)
    # GET: the state (``{}`` for a key never used)
    return json_response(await _object(request).state())


_EDIT_FIELDS = frozenset({"set", "delete", "clear", "state"})


async def _patch_state(request: Request) -> Response:
    """``PATCH /v1/objects/{type:id}/{key}/state``: ``{"set", "delete", "clear"}`` or
    ``{"state"}``, applied as one exclusive invocation; answers the new state."""
    obj = _object(request)
    wait = parse_wait(request.query_params.get("timeout"))
    edit = await json_body(request, "the edit")
    if not isinstance(edit, dict):
        raise InvalidArgument(
            'the edit must be a JSON object: {"set": {...}, "delete": [...], "clear": true} '
            'or {"state": {...}}'
        )
    unknown = set(edit) - _EDIT_FIELDS
    if unknown:
        raise InvalidArgument(f"unknown edit field(s) {sorted(unknown)}")
    if "state" in edit and len(edit) > 1:
        raise InvalidArgument("'state' replaces the whole state: send it without set/delete/clear")
    if not isinstance(edit.get("clear", False), bool):
        raise InvalidArgument(f"'clear' must be true or false, got {edit['clear']!r}")
    try:
        new_state = await until_disconnect(
            request,
            lambda: obj.edit(
                set=edit.get("set"),
                delete=edit.get("delete"),
                state=edit.get("state"),
                clear=bool(edit.get("clear", False)),
                timeout=wait,
            ),
        )
    except Timeout:
        return _timed_out(obj, "the edit", wait)
    return json_response(new_state)


async def _clear_state(request: Request) -> Response:
    """``DELETE /v1/objects/{type:id}/{key}/state``: remove every key (an exclusive
    invocation, in its turn); answers the new state, ``{}``."""
    obj = _object(request)
    wait = parse_wait(request.query_params.get("timeout"))
    try:
        await until_disconnect(request, lambda: obj.clear(timeout=wait))
    except Timeout:
        return _timed_out(obj, "the clear", wait)
    return json_response(await obj.state())


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get("idempotency-key")
    return None if key is None else validate_id(key, "Idempotency-Key")


async def call(request: Request) -> Response:
    """``POST /v1/objects/{type:id}/{key}/call/{handler:id}``: invoke the handler with the body
    (JSON; empty: ``null``) and answer ``{"result": ...}`` once it ended."""
    obj = _object(request)
    handler = validate_name(request.path_params["handler"], "handler name")
    wait = parse_wait(request.query_params.get("timeout"))
    idempotency_key = _idempotency_key(request)
    arg = await json_body(request, "the input")
    try:
        result = await until_disconnect(
            request,
            lambda: obj.call(handler, arg, idempotency_key=idempotency_key, timeout=wait),
        )
    except HandlerCancelled as exc:
        return _handler_error(409, "HandlerCancelled", exc)
    except HandlerFailed as exc:
        if exc.error_type == UNKNOWN_HANDLER:
            return _handler_error(404, "UnknownHandler", exc)
        return _handler_error(500, "HandlerFailed", exc)
    except Timeout:
        return _timed_out(obj, f"{handler!r}", wait)
    return json_response({"result": result})


def _handler_error(status: int, type_: str, exc: HandlerFailed) -> Response:
    return error_response(
        status, type_, exc.message, handler=exc.handler, error_type=exc.error_type
    )


async def send(request: Request) -> Response:
    """``POST /v1/objects/{type:id}/{key}/send/{handler:id}``: queue an invocation; ``202
    {"seq": n}`` once it is stored (durable)."""
    obj = _object(request)
    handler = validate_name(request.path_params["handler"], "handler name")
    idempotency_key = _idempotency_key(request)
    arg = await json_body(request, "the input")
    seq = await obj.send(handler, arg, idempotency_key=idempotency_key)
    return json_response({"seq": seq}, 202)


async def cancel(request: Request) -> Response:
    """``POST /v1/objects/{type:id}/{key}/cancel``: ``{"seq": n, "reason": "..."}``; without
    ``seq``, the invocation running (else the next to run). ``202 {"seq", "reason"}``."""
    obj = _object(request)
    body = await json_body(request, "the cancel")
    body = {} if body is None else body
    if not isinstance(body, dict) or set(body) - {"seq", "reason"}:
        raise InvalidArgument('the body must be {"seq": <int>, "reason": "<text>"} (both optional)')
    seq = body.get("seq")
    if isinstance(seq, float) and seq.is_integer():
        seq = int(seq)  # 43.0 is the integer 43 in JSON (and in the OpenAPI schema)
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 1):
        raise InvalidArgument(f"seq={seq!r}: an invocation's number (>= 1), from the queue")
    reason = body.get("reason", "cancelled over HTTP")
    if not isinstance(reason, str):
        raise InvalidArgument(f"reason={reason!r}: must be a string")
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
                "NothingToCancel",
            )
        seq = heads[0]
    await obj.cancel(seq, reason)
    return json_response({"seq": seq, "reason": reason}, 202)


routes: list[BaseRoute] = [
    # `:path`: keys may hold slashes ("user/7"); the suffixed routes come first
    Route(
        "/v1/objects/{type:id}/{key:id}/call/{handler:id}",
        call,
        methods=["POST"],
        name="object_call",
    ),
    Route(
        "/v1/objects/{type:id}/{key:id}/send/{handler:id}",
        send,
        methods=["POST"],
        name="object_send",
    ),
    Route("/v1/objects/{type:id}/{key:id}/cancel", cancel, methods=["POST"], name="object_cancel"),
    Route(
        "/v1/objects/{type:id}/{key:id}/state",
        state,
        methods=["GET", "PATCH", "DELETE"],
        name="object_state",
    ),
    Route("/v1/objects/{type:id}/{key:id}", show, methods=["GET"], name="object_show"),
    Route("/v1/objects/{type:id}", list_keys, methods=["GET"], name="object_keys"),
]
