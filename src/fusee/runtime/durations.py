"""Durations as users write them (``"30s"``, ``"1h30m"``) and as fusee prints them.

Pure functions, no I/O.
"""

from __future__ import annotations

import datetime
import math
import re

from fusee.errors import ConfigError

__all__ = ("parse_duration", "format_duration")

_UNITS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_UNITS_HELP = "ms, s, m, h, d (e.g. '200ms', '30s', '1h30m', '1.5s')"
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
# "ms" before "m" so that "200ms" is not read as 200 minutes and a stray "s".
_PART = re.compile(rf"({_NUMBER})(ms|s|m|h|d)")
_WHOLE = re.compile(rf"(?:{_NUMBER}(?:ms|s|m|h|d))+")


def parse_duration(value: str | int | float | datetime.timedelta, what: str = "duration") -> float:
    """Read a duration and return it in seconds.

    Accepts a number of seconds (``int`` or ``float``), a :class:`datetime.timedelta`,
    or a string of one or more ``<number><unit>`` parts with units ``ms``, ``s``, ``m``,
    ``h`` and ``d``: ``"200ms"``, ``"1.5s"``, ``"15m"``, ``"1h30m"``, ``"1d"``.

    Raises:
        ConfigError: the value is negative, NaN, infinite, empty, a bool, or a string
            with a missing or unknown unit; the message names ``what`` and the value.

    Example:
        >>> parse_duration("1h30m")
        5400.0
    """
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(
            f"{what} must be a number of seconds, a timedelta or a string like '30s', "
            f"got {type(value).__name__}: {value!r}"
        )
    elif isinstance(value, str):
        seconds = _parse_text(value, what)
    else:
        seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ConfigError(f"{what} must be a finite number of seconds, got {value!r}")
    if seconds < 0:
        raise ConfigError(f"{what} must not be negative, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Write a duration in seconds the short way :func:`parse_duration` reads back.

    Under a second it is milliseconds (``"200ms"``), under a minute seconds
    (``"2.5s"``), above that days, hours, minutes and seconds with zero parts left out
    (``"15m"``, ``"1h30m"``, ``"1d2h"``). Values are rounded to the millisecond, except
    under a second where up to three decimals of a millisecond are kept.

    Raises:
        ConfigError: ``seconds`` is negative, NaN or infinite.

    Example:
        >>> format_duration(5400)
        '1h30m'
    """
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ConfigError(f"cannot format {seconds!r} as a duration: not a finite value >= 0")
    if seconds == 0:
        return "0s"
    if seconds < 1:
        ms = _trim(f"{seconds * 1000:.3f}")
        if ms != "1000":  # 0.9999996 s rounds up: fall through and print "1s"
            return f"{ms}ms"
    total_ms = round(seconds * 1000)
    days, rest = divmod(total_ms, 86_400_000)
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    parts = [f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "m")) if n]
    if rest:
        parts.append(_trim(f"{rest / 1000:.3f}") + "s")
    return "".join(parts)


def _parse_text(value: str, what: str) -> float:
    text = value.strip()
    if not text:
        raise ConfigError(f"{what} must not be empty; write a number and a unit: {_UNITS_HELP}")
    if text.startswith("-"):
        raise ConfigError(f"{what} must not be negative, got {value!r}")
    if _WHOLE.fullmatch(text) is None:
        raise ConfigError(
            f"invalid {what} {value!r}: write one or more number-and-unit parts with units "
            f"{_UNITS_HELP}"
        )
    return sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))


def _trim(number: str) -> str:
    return number.rstrip("0").rstrip(".") if "." in number else number
