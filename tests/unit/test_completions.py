"""Completion tokens: format, MAC coverage, malformed input (pure, no server)."""

from __future__ import annotations

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
    changed = list(ARGS)
    changed[field] = changed[field] + 1 if isinstance(changed[field], int) else changed[field] + "x"
    assert not mac_matches(mac, SECRET, *changed)  # type: ignore[arg-type]
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
