from __future__ import annotations

import datetime
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusee.errors import ConfigError
from fusee.runtime.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("200ms", 0.2),
        ("30s", 30.0),
        ("15m", 900.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("1d2h3m4s5ms", 93784.005),
        ("0s", 0.0),
        (".5s", 0.5),
        (" 10s ", 10.0),
    ],
)
def test_parse_strings(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (5, 5.0),
        (2.5, 2.5),
        (datetime.timedelta(minutes=2), 120.0),
        (datetime.timedelta(milliseconds=1), 0.001),
    ],
)
def test_parse_numbers_and_timedeltas(value: float | datetime.timedelta, seconds: float) -> None:
    result = parse_duration(value)
    assert isinstance(result, float)
    assert result == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("-1s", "must not be negative"),
        (-1, "must not be negative"),
        (datetime.timedelta(seconds=-1), "must not be negative"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        ("9" * 400 + "s", "finite"),
        ("5", "units ms, s, m, h, d"),
        ("5x", "units ms, s, m, h, d"),
        ("5 s", "units ms, s, m, h, d"),
        ("1h 30m", "units ms, s, m, h, d"),
        ("s", "units ms, s, m, h, d"),
        ("1w", "units ms, s, m, h, d"),
        ("1e3s", "units ms, s, m, h, d"),
        ("nan", "units ms, s, m, h, d"),
        (True, "got bool"),
        (None, "got NoneType"),
    ],
)
def test_parse_rejects(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_duration(value, "step timeout")  # type: ignore[arg-type]
    assert "step timeout" in str(info.value)


def test_error_shows_the_value() -> None:
    with pytest.raises(ConfigError, match="'5x'"):
        parse_duration("5x")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.2, "200ms"),
        (0.0005, "0.5ms"),
        (1, "1s"),
        (2.5, "2.5s"),
        (30, "30s"),
        (900, "15m"),
        (3600, "1h"),
        (5400, "1h30m"),
        (86400, "1d"),
        (90061, "1d1h1m1s"),
        (61.5, "1m1.5s"),
        (0.9999996, "1s"),
    ],
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_format_rejects(bad: float) -> None:
    with pytest.raises(ConfigError):
        format_duration(bad)


@given(st.floats(min_value=0.001, max_value=10 * 365 * 86400, allow_nan=False))
def test_format_parses_back(seconds: float) -> None:
    # format rounds to the millisecond (or finer below one second)
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, abs=0.0005)


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=999), st.sampled_from(["ms", "s", "m", "h", "d"])
        ),
        min_size=1,
        max_size=5,
    )
)
def test_parse_sums_parts(parts: list[tuple[int, str]]) -> None:
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    text = "".join(f"{n}{u}" for n, u in parts)
    assert parse_duration(text) == pytest.approx(sum(n * unit[u] for n, u in parts))
