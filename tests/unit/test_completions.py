"""Completion tokens: format, MAC coverage, malformed input (pure, no server)."""

from __future__ import annotations

from typing import Any

import pytest

from fusee.errors import InvalidToken
from fusee.runtime.completions import completion_token, completion_url, mac_matches, parse_token

SECRET = bytes(range(32))
ARGS = ("fusee", "chat-7/turn 3", 11, 4, "refund-ok")


def test_a_token_parses_back_and_its_mac_matches() -> None:
    token = completion_token(SECRET, *ARGS)
    run_id, pos, mac = parse_token(token)
    assert (run_id, pos) == ("chat-7/turn 3", 4)
    assert len(mac) == 32
    assert mac_matches(mac, SECRET, *ARGS)
    assert all(c.isalnum() or c in "-_." for c in token)  # URL-safe as it is


@pytest.mark.parametrize("field", range(5))
def test_the_mac_covers_every_field(field: int) -> None:
    _, _, mac = parse_token(completion_token(SECRET, *ARGS))
    changed: list[Any] = list(ARGS)
    changed[field] = changed[field] + 1 if isinstance(changed[field], int) else changed[field] + "x"
    assert not mac_matches(mac, SECRET, *changed)
    assert not mac_matches(mac, bytes(32), *ARGS)


@pytest.mark.parametrize(
    "bad", ["", "x", "a.b", "a.1.b.c", "YQ.1.%%%", "YQ.-1.AAAA", "YQ.1.AAAA", "..", None, 3]
)
def test_malformed_tokens_are_invalid(bad: object) -> None:
    with pytest.raises(InvalidToken, match="malformed"):
        parse_token(bad)


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(InvalidToken):
        completion_token(b"short", *ARGS)


def test_the_url_puts_the_token_under_v1_completions() -> None:
    assert (
        completion_url("https://x.example/a/", "t.1.m")
        == "https://x.example/a/v1/completions/t.1.m"
    )


def _spare_bits_set(part: str) -> str:
    """The same bytes written another way: the last character's unused low bits set."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    spare = {2: 4, 3: 2}[len(part) % 4]  # unused bits in the last char of 2- or 3-char tails
    last = alphabet.index(part[-1])
    return part[:-1] + alphabet[last | ((1 << spare) - 1)]


def test_only_the_canonical_encoding_is_accepted() -> None:
    token = completion_token(SECRET, *ARGS)
    run_part, pos_part, mac_part = token.split(".")
    # 32 MAC bytes are 43 characters, 2 spare bits: same bytes, another string
    other = _spare_bits_set(mac_part)
    assert other != mac_part
    with pytest.raises(InvalidToken, match="malformed"):
        parse_token(f"{run_part}.{pos_part}.{other}")
    with pytest.raises(InvalidToken, match="bad position"):
        parse_token(f"{run_part}.0{pos_part}.{mac_part}")  # 04: a leading zero
    if len(run_part) % 4 in (2, 3):
        with pytest.raises(InvalidToken, match="malformed"):
            parse_token(f"{_spare_bits_set(run_part)}.{pos_part}.{mac_part}")
    assert parse_token(token)[1] == 4
    assert parse_token(completion_token(SECRET, "fusee", "r", 1, 0, "w"))[1] == 0
