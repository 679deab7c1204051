"""Log output for programs built on fusee: the CLI calls this, the library never does.

fusee's modules log through :func:`get_logger` with dotted event names
(``step.completed``) and bind ``run_id``, ``worker`` and ``step`` through contextvars.

As a library fusee configures nothing and prints nothing of its own: while nobody has
configured structlog (the CLI does, with :func:`configure_logging`; an application may),
its log lines go to the standard library's ``logging.getLogger("fusee")`` as
``event key=value`` messages. With no logging configured, Python shows warnings and
errors on stderr and drops the rest; ``logging.basicConfig(level=logging.DEBUG)`` shows
everything. Once structlog is configured, they go through that configuration.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal, TextIO

import structlog

__all__ = ("configure_logging", "get_logger", "LogFormat", "LEVELS")

LogFormat = Literal["console", "json"]

LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")


class _Logger:
    """fusee's logger: structlog's configured one once an application configured
    structlog, else the standard library's ``fusee`` logger (looked up on each call, so
    configuring logging after import works)."""

    def __init__(self) -> None:
        self._stdlib: Any = structlog.wrap_logger(
            logging.getLogger("fusee"),
            processors=[
                structlog.stdlib.filter_by_level,  # nothing is rendered for a dropped line
                structlog.contextvars.merge_contextvars,
                structlog.processors.format_exc_info,
                structlog.processors.KeyValueRenderer(key_order=["event"], drop_missing=True),
            ],
            wrapper_class=structlog.stdlib.BoundLogger,
            cache_logger_on_first_use=True,
        )
        self._configured: Any = structlog.get_logger("fusee")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._configured if structlog.is_configured() else self._stdlib, name)


_LOGGER = _Logger()


def get_logger() -> Any:
    """The logger fusee's modules use (see the module's docstring for where it goes)."""
    return _LOGGER


def configure_logging(
    format: LogFormat = "console",  # noqa: A002 - the name users pass
    level: str = "info",
    *,
    stream: TextIO | None = None,
) -> None:
    """Send structlog's output to stderr, as readable lines or as one JSON object a line.

    Each entry has an ISO 8601 UTC ``timestamp``, its ``level``, the ``event`` name and
    the context bound through :mod:`structlog.contextvars` (run, worker, step).

    Raises:
        ValueError: ``format`` or ``level`` is not one of the known ones.

    Example:
        ``configure_logging("json", "debug")``
    """
    if format not in ("console", "json"):
        raise ValueError(f"log format {format!r}: use 'console' or 'json'")
    if level.lower() not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    out = stream if stream is not None else sys.stderr
    renderer: structlog.typing.Processor
    if format == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=_is_tty(out))
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if format == "json":
        # The console renderer prints tracebacks itself; JSON needs them as a string.
        processors.append(structlog.processors.format_exc_info)
    processors.append(renderer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False
