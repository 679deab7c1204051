"""Strict decoding of what a route takes: its JSON body and its numeric query parameters.

Litestar converts a handler's arguments with msgspec's lax rules (``strict=False``, which
query strings need), and that applies to the body as well: ``"20"`` is taken for a
number, ``"true"`` for a boolean, ``"1e3"`` for an integer. The document says
``type: number``, ``boolean``, ``integer``, and a client that sends a string has a bug
worth telling. So before the handler's arguments are converted, :func:`strict_inputs`
(the app's ``before_request`` hook) decodes the body strictly into the type the handler
declares, and checks that each ``int`` or ``float`` query parameter is written as one
(``?limit=1.0`` is refused). A JSON number that is whole (``3.0``) stays an
integer, as JSON Schema has it. A failure raises :class:`fusee.errors.InvalidArgument`
naming the field; nothing else changes (the handler still gets its arguments as before).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from litestar import Request
from litestar.enums import ParamType
from litestar.params import BodyKwarg, ParameterKwarg

from fusee.errors import InvalidArgument

__all__ = ("strict_inputs",)

_INT = re.compile(r"-?[0-9]+")
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")


async def strict_inputs(request: Request[Any, Any, Any]) -> None:
    """Refuse a body or a numeric query parameter that only lax decoding would take.

    Raises:
        InvalidArgument: the body does not decode strictly into the handler's body type,
            or an ``int``/``float`` query parameter is not written as one.
    """
    handler = request.route_handler
    for name, field in handler.parsed_fn_signature.parameters.items():
        kwarg = field.kwarg_definition
        if isinstance(kwarg, BodyKwarg) or name == "data":
            await _strict_body(request, field.annotation)
        elif field.annotation in (int, float) and (
            kwarg is None
            or (isinstance(kwarg, ParameterKwarg) and kwarg.param_type is ParamType.QUERY)
        ):
            key = kwarg.query if isinstance(kwarg, ParameterKwarg) and kwarg.query else name
            value = request.query_params.get(key)
            rule = _INT if field.annotation is int else _NUMBER
            if value is not None and not rule.fullmatch(value):
                kind = "an integer" if field.annotation is int else "a number"
                raise InvalidArgument(f"query parameter {key}={value!r}: must be {kind}")


async def _strict_body(request: Request[Any, Any, Any], annotation: Any) -> None:
    if annotation is Any:
        return
    data = await request.body()
    if not data.strip():  # no body: the handler's default (or its "missing" error)
        return
    try:
        value = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return  # not JSON at all: the framework's own error says so
    try:
        msgspec.convert(_integral(value), type=annotation, strict=True)
    except msgspec.ValidationError as exc:
        text = str(exc)
        at = _AT.search(text)
        if at is None:
            raise InvalidArgument(f"the body: {text}") from None
        raise InvalidArgument(f"the body's field {at['path']!r}: {text[: at.start()]}") from None
    except RecursionError:
        return  # the framework's own error says so


def _integral(value: Any) -> Any:
    """``value`` with each float that is a whole number (``3.0``) as an int: JSON Schema
    takes it for an ``integer``, as msgspec's strict mode does not."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value
