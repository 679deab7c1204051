"""Stored values: JSON only, at most MAX_DEPTH levels deep, at most the limit given."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from fusee.errors import NotEncodable
from fusee.runtime.codec import MAX_DEPTH, canonical, check_size, decode_value, encode_value


def _deep(levels: int, *, dicts: bool = False) -> Any:
    value: Any = {} if dicts else []
    for _ in range(levels - 1):
        value = {"k": value} if dicts else [value]
    return value


@pytest.mark.parametrize("encode", [encode_value, canonical])
@pytest.mark.parametrize("dicts", [False, True], ids=["lists", "dicts"])
def test_the_deepest_value_allowed_encodes_and_one_more_level_does_not(
    encode: Any, dicts: bool
) -> None:
    data = encode(_deep(MAX_DEPTH, dicts=dicts), "v")
    assert decode_value(data) == _deep(MAX_DEPTH, dicts=dicts)
    with pytest.raises(
        NotEncodable, match=rf"v cannot be stored: it nests deeper than {MAX_DEPTH}"
    ):
        encode(_deep(MAX_DEPTH + 1, dicts=dicts), "v")
    with pytest.raises(NotEncodable, match="nests deeper"):  # RecursionError, caught
        encode(_deep(10_000, dicts=dicts), "v")


def test_brackets_inside_strings_are_not_nesting() -> None:
    value = ["[[[[{{{{" * 100, {"k": '\\"]]]]' * 100}, [["]"] * 300]]
    assert decode_value(encode_value(value, "v")) == value


def test_wide_values_with_many_brackets_encode() -> None:
    value = [{"id": i, "tags": [[i], {"x": [1]}]} for i in range(5_000)]
    assert decode_value(encode_value(value, "v")) == value


def test_a_value_over_the_limit_names_what_its_size_and_the_limit() -> None:
    assert encode_value("x" * 8, "v", limit=10) == b'"xxxxxxxx"'
    with pytest.raises(NotEncodable) as err:
        encode_value("x" * 2_000, "the result of step 'big'", limit=1_000)
    message = str(err.value)
    assert "the result of step 'big' is 2,002 bytes as JSON" in message
    assert "over the limit of 1,000 bytes" in message
    with pytest.raises(NotEncodable, match="2,002 bytes"):
        check_size(b"x" * 2_002, "v", 2_001)


def test_json_too_deep_to_read_is_a_clear_error() -> None:
    deep = b"[" * 10_000 + b"]" * 10_000
    with pytest.raises(NotEncodable, match="cannot be read: it nests too deeply"):
        decode_value(deep)
    with pytest.raises(msgspec.DecodeError):  # broken JSON stays a decode error
        decode_value(b"[")
