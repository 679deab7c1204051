"""Values in and out of the journal: JSON through msgspec, with errors that say where."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from fusee.errors import NotEncodable

__all__ = ("encode_value", "decode_value", "canonical")

T = TypeVar("T")

_encoder = msgspec.json.Encoder()
# Inputs are compared byte for byte to tell "the same start again" from a conflict,
# so they are encoded with sorted keys: {"a":1,"b":2} and {"b":2,"a":1} are one input.
_sorted_encoder = msgspec.json.Encoder(order="sorted")


def encode_value(value: object, what: str) -> bytes:
    """JSON for ``value``; raises :class:`NotEncodable` naming ``what`` otherwise."""
    try:
        return _encoder.encode(value)
    except (TypeError, msgspec.EncodeError, OverflowError) as exc:
        raise NotEncodable(
            f"{what} cannot be stored: {type(value).__name__} is not JSON-encodable "
            f"({exc}). Return plain data (dict, list, str, int, float, bool, None), a "
            f"dataclass or a msgspec.Struct."
        ) from None


def canonical(value: object, what: str) -> bytes:
    """JSON with sorted keys, so equal inputs encode to equal bytes."""
    try:
        return _sorted_encoder.encode(value)
    except (TypeError, msgspec.EncodeError, OverflowError) as exc:
        raise NotEncodable(
            f"{what} cannot be stored: {type(value).__name__} is not JSON-encodable ({exc})"
        ) from None


def decode_value(data: bytes, type: type[T] | None = None) -> Any:  # noqa: A002 - mirrors msgspec
    """Decode stored JSON, into ``type`` when given (a dataclass, Struct, TypedDict, ...)."""
    if type is None:
        return msgspec.json.decode(data)
    return msgspec.json.decode(data, type=type)
