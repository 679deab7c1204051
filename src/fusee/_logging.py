"""Log output for programs built on fusee: the CLI calls this, the library never does.

fusee's modules log through ``structlog.get_logger("fusee")`` with dotted event names
(``step.completed``) and bind ``run_id``, ``worker`` and ``step`` through contextvars.
Until something calls :func:`configure_logging`, structlog's defaults apply.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

__all__ = ("configure_logging", "LogFormat", "LEVELS")

LogFormat = Literal["console", "json"]

LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")


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
