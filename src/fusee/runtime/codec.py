"""Values in and out of the journal: JSON through msgspec, with errors that say where.

Every value fusee stores (a step's result, a run's input, a signal's payload, an
object's state) must fit in one NATS message with the record around it, and must
nest at most :data:`MAX_DEPTH` levels deep: deeper JSON cannot be read back safely
(msgspec recurses on the C stack, and Python's recursion limit stops it, at a depth
that depends on where it is called from), so it is refused when it is written.
Callers that know the server's limit pass it as ``limit``.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from fusee.errors import NotEncodable

__all__ = (
    "encode_value",
    "decode_value",
    "canonical",
    "check_size",
    "MAX_DEPTH",
    "MAX_LARGE_VALUE",
)

T = TypeVar("T")

MAX_DEPTH = 256  # levels of nested lists and objects in one stored value
# A step's result too large for a record is stored out of line, up to this size.
MAX_LARGE_VALUE = 64 * 1024 * 1024

_encoder = msgspec.json.Encoder()
# Inputs are compared byte for byte to tell "the same start again" from a conflict,
# so they are encoded with sorted keys: {"a":1,"b":2} and {"b":2,"a":1} are one input.
_sorted_encoder = msgspec.json.Encoder(order="sorted")

# A JSON string as msgspec writes it ('"' and '\' inside are escaped); the brackets in
# it are text, not nesting.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def encode_value(value: object, what: str, *, limit: int | None = None) -> bytes:
    """JSON for ``value``; raises :class:`NotEncodable` naming ``what`` otherwise (not
    JSON, nested deeper than :data:`MAX_DEPTH`, or longer than ``limit`` bytes)."""
    try:
        data = _encoder.encode(value)
    except (TypeError, msgspec.EncodeError, OverflowError) as exc:
        raise NotEncodable(
            f"{what} cannot be stored: {type(value).__name__} is not JSON-encodable "
            f"({exc}). Return plain data (dict, list, str, int, float, bool, None), a "
            f"dataclass or a msgspec.Struct."
        ) from None
    except RecursionError:
        raise _too_deep(what) from None
    return _checked(data, what, limit)


def canonical(value: object, what: str, *, limit: int | None = None) -> bytes:
    """JSON with sorted keys, so equal inputs encode to equal bytes."""
    try:
        data = _sorted_encoder.encode(value)
    except (TypeError, msgspec.EncodeError, OverflowError) as exc:
        raise NotEncodable(
            f"{what} cannot be stored: {type(value).__name__} is not JSON-encodable ({exc})"
        ) from None
    except RecursionError:
        raise _too_deep(what) from None
    return _checked(data, what, limit)


_ONE_VALUE = "one stored value (the NATS server's max_payload, less room for the record around it)"


def check_size(data: bytes, what: str, limit: int, *, of: str = _ONE_VALUE) -> bytes:
    """``data`` itself when it is at most ``limit`` bytes; raises :class:`NotEncodable`
    naming ``what``, its size and the limit (``of`` says what it limits) otherwise."""
    if len(data) > limit:
        raise NotEncodable(
            f"{what} is {len(data):,} bytes as JSON, over the limit of {limit:,} bytes for "
            f"{of}. Keep large data out of the journal: store it elsewhere (a file, an "
            f"object store) and pass a reference to it."
        )
    return data


def decode_value(data: bytes, type: type[T] | None = None) -> Any:  # noqa: A002 - mirrors msgspec
    """Decode stored JSON, into ``type`` when given (a dataclass, Struct, TypedDict, ...).

    Raises:
        NotEncodable: the JSON nests too deeply to be read (fusee writes no such value).
    """
    try:
        if type is None:
            return msgspec.json.decode(data)
        return msgspec.json.decode(data, type=type)
    except RecursionError:
        raise NotEncodable(
            f"a stored value of {len(data):,} bytes cannot be read: it nests too deeply "
            f"(fusee stores values nested at most {MAX_DEPTH} levels deep)"
        ) from None


def _too_deep_json(data: bytes) -> bool:
    """Whether the JSON ``data`` nests deeper than ``MAX_DEPTH``. Free for most values
    (fewer brackets than that in all); else the strings are cut out, and each pass
    takes out the innermost pairs of brackets left: one level of nesting."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return False
    shape = _STRING.sub(b"", data).translate(_SQUARE, _NOT_BRACKETS)
    for _ in range(MAX_DEPTH):
        shape = shape.replace(b"[]", b"")
        if not shape:
            return False
    return True


def _checked(data: bytes, what: str, limit: int | None) -> bytes:
    if _too_deep_json(data):
        raise _too_deep(what)
    if limit is not None:
        check_size(data, what, limit)
    return data


def _too_deep(what: str) -> NotEncodable:
    return NotEncodable(
        f"{what} cannot be stored: it nests deeper than {MAX_DEPTH} levels of lists and "
        f"objects, the most fusee stores (deeper JSON cannot be read back safely)"
    )
