"""Query parameters and headers as the API reads them: pure functions, clear errors.

Each raises :class:`fusee.errors.InvalidArgument` naming the parameter, which the app
turns into a ``400`` with ``type: "InvalidArgument"``.
"""

from __future__ import annotations

import re

from fusee.errors import ConfigError, InvalidArgument, InvalidId
from fusee.runtime.durations import format_duration, parse_duration
from fusee.runtime.ids import validate_id, validate_name

__all__ = (
    "DEFAULT_WAIT",
    "MAX_WAIT",
    "parse_wait",
    "parse_offset",
    "resume_offset",
    "filter_names",
)

DEFAULT_WAIT = 30.0
# Longer waits than this are better done as several requests: proxies and load balancers
# commonly cut idle connections after 60 to 100 s.
MAX_WAIT = 300.0

_SECONDS = re.compile(r"\d+(?:\.\d+)?")
_INT = re.compile(r"\d+")


def parse_wait(value: str | None, name: str = "timeout") -> float:
    """``?timeout=``: a number of seconds (``2.5``) or a duration (``30s``, ``1m``).

    No value is :data:`DEFAULT_WAIT`; ``0`` answers at once. More than :data:`MAX_WAIT`
    is an error rather than silently cut, so a client never waits less than it asked.

    Raises:
        InvalidArgument: not a duration, negative, or above the cap.

    Example:
        >>> parse_wait("1m30s")
        90.0
    """
    if value is None:
        return DEFAULT_WAIT
    text = value.strip()
    try:
        seconds = float(text) if _SECONDS.fullmatch(text) else parse_duration(text, name)
    except ConfigError as exc:
        raise InvalidArgument(f"query parameter {name}: {exc}") from None
    if seconds > MAX_WAIT:
        raise InvalidArgument(
            f"query parameter {name}={value!r}: at most {format_duration(MAX_WAIT)}; "
            f"to wait longer, ask again when this request returns 202"
        )
    return seconds


def parse_offset(value: str, name: str) -> int:
    """A token index: a decimal integer ``>= 0`` (``?from=``, ``Last-Event-ID``).

    Raises:
        InvalidArgument: empty, not a decimal integer, or negative.

    Example:
        >>> parse_offset("42", "from")
        42
    """
    text = value.strip()
    if text.startswith("-") and _INT.fullmatch(text[1:]):
        raise InvalidArgument(f"{name}={value!r}: a token index must not be negative")
    if not _INT.fullmatch(text):
        raise InvalidArgument(f"{name}={value!r}: a token index is an integer >= 0")
    return int(text)


def resume_offset(from_query: str | None, last_event_id: str | None) -> int:
    """Where a stream request starts: after ``Last-Event-ID`` if sent, else ``?from=``, else 0.

    ``Last-Event-ID`` wins because a browser's ``EventSource`` reconnects to the URL it
    was first given (with its original ``?from=``) and adds the header: the header is
    the newer position. It names the last token the client has, so reading resumes at
    the one after it.

    Raises:
        InvalidArgument: either value is not an integer ``>= 0``.

    Example:
        >>> resume_offset("0", "41")
        42
    """
    if last_event_id is not None and last_event_id.strip() != "":
        return parse_offset(last_event_id, "Last-Event-ID") + 1
    if from_query is not None:
        return parse_offset(from_query, "query parameter from")
    return 0


def filter_names(workflow: str | None, id_prefix: str | None) -> tuple[str | None, str | None]:
    """A run filter's ``workflow`` and ``id_prefix`` (list, bulk), checked by the name and
    ID rules: one that no run can have (a control character, too long) is refused, as
    the document's schema for it says, rather than matching nothing.

    Raises:
        ConfigError: the rule it breaks, naming the field.

    Example:
        >>> filter_names("support", "ticket-")
        ('support', 'ticket-')
    """
    try:
        if workflow is not None and workflow != "":
            workflow = validate_name(workflow, "workflow")
        if id_prefix is not None and id_prefix != "":
            id_prefix = validate_id(id_prefix, "id_prefix")
    except InvalidId as exc:
        raise ConfigError(str(exc)) from None
    return workflow, id_prefix
