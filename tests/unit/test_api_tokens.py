"""The pure part of API and stream tokens: their shape, hash, signature, and expiry."""

from __future__ import annotations

import pytest

from fusee.errors import Unauthorized
from fusee.runtime.api_tokens import (
    StreamGrant,
    covers,
    parse_stream_token,
    parse_token,
    stream_token_text,
    token_hash,
    token_text,
)

KEY = b"k" * 32


def test_a_token_parses_back_and_its_hash_is_keyed() -> None:
    token = token_text("0123456789ab", b"\x01" * 32)
    parsed = parse_token(token)
    assert parsed.id == "0123456789ab"
    one = token_hash(KEY, "ns", parsed.id, parsed.secret)
    assert one == token_hash(KEY, "ns", parsed.id, parsed.secret)
    assert one != token_hash(b"o" * 32, "ns", parsed.id, parsed.secret)  # another key
    assert one != token_hash(KEY, "other", parsed.id, parsed.secret)  # another namespace
    assert parsed.secret not in one


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "fusee_",
        "fusee_0123456789ab",
        "fusee_XYZ_" + "A" * 43,
        "bearer_x",
        "fusee_0123456789ab_short",
    ],
)
def test_malformed_tokens_are_refused_without_echoing_them(bad: str) -> None:
    with pytest.raises(Unauthorized) as caught:
        parse_token(bad)
    assert bad == "" or bad not in str(caught.value)


def test_scopes_are_ordered() -> None:
    assert covers("admin", "read")
    assert covers("write", "write")
    assert not covers("read", "write")
    assert not covers("write", "admin")


def test_a_stream_token_is_bound_to_its_grant_and_expires() -> None:
    grant = StreamGrant("chat/7", "reply", 1_000, "0123456789ab")
    token = stream_token_text(KEY, "ns", grant)
    assert parse_stream_token(KEY, "ns", token, now=999.0) == grant
    with pytest.raises(Unauthorized, match="expired"):
        parse_stream_token(KEY, "ns", token, now=1_000.0)
    with pytest.raises(Unauthorized, match="not signed"):
        parse_stream_token(KEY, "other", token, now=0.0)
    later = token.replace(".1000.", ".9999.")  # a longer life, the same MAC
    with pytest.raises(Unauthorized, match="not signed"):
        parse_stream_token(KEY, "ns", later, now=0.0)
    with pytest.raises(Unauthorized, match="malformed"):
        parse_stream_token(KEY, "ns", token + ".x", now=0.0)
