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

import contextvars
import json
import logging
import sys
import threading
import time
from typing import Any, Literal, TextIO

import msgspec
import structlog
from structlog.typing import EventDict

__all__ = ("configure_logging", "get_logger", "LogFormat", "LEVELS")

LogFormat = Literal["console", "json"]

LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")

# the level a logger method writes (``log.exception`` is an error), as structlog's
# ``add_log_level`` names them
_LEVEL_NAMES = {"warn": "warning", "exception": "error"}

# structlog.contextvars names the context variables it binds with this prefix
_BOUND = structlog.contextvars.STRUCTLOG_KEY_PREFIX
_BOUND_LEN = len(_BOUND)
# ... and keeps them in this dict (prefixed name -> ContextVar). Reading those few is
# about 10x faster than scanning every context variable of the task (anyio's, nats-py's,
# fusee's: 9.8 against 0.8 µs with 34 of them), which is what the public
# get_contextvars() does. A structlog without it gets the scan.
_BOUND_VARS: dict[str, contextvars.ContextVar[Any]] | None = getattr(
    structlog.contextvars, "_CONTEXT_VARS", None
)


class _Logger:
    """fusee's logger: the one :func:`configure_logging` built; else structlog's
    configured one once an application configured structlog; else the standard
    library's ``fusee`` logger (looked up on each call, so configuring logging after
    import works)."""

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
        self._built: Any = None
        # an application's own structlog configuration, and the logger built for it
        self._config: tuple[Any, ...] = (None, None, None, None)
        self._configured: Any = None

    def use(self, logger: Any) -> None:
        self._built = logger

    def __getattr__(self, name: str) -> Any:
        if self._built is not None:
            return getattr(self._built, name)
        if not structlog.is_configured():
            return getattr(self._stdlib, name)
        # Configured by the application (structlog.configure): built once per
        # configuration. structlog's lazy logger builds one on every call (about 10 µs a
        # line here, also for a line its level drops: two a step).
        config = structlog.get_config()
        now = (
            config["processors"],
            config["wrapper_class"],
            config["logger_factory"],
            config["context_class"],
        )
        if any(a is not b for a, b in zip(now, self._config, strict=True)):
            self._config, self._configured = now, structlog.get_logger("fusee").bind()
        return getattr(self._configured, name)


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
    the context bound through :mod:`structlog.contextvars` (run, worker, step). Each
    line is written (and flushed) when it is logged: a worker killed right after a
    line has that line on its stderr. fusee's lines keep this configuration until the
    next call, even if the application calls ``structlog.configure()`` in between.

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
    processors: list[structlog.typing.Processor]
    if format == "json":
        # What a deployed worker writes (stderr is not a terminal): one processor does it
        # all, since a worker logs a line per step (see "Logs" in docs/design.md).
        processors = [_JsonLine()]
    else:
        processors = [
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.dev.ConsoleRenderer(colors=_is_tty(out)),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=_LineWriterFactory(out),
        cache_logger_on_first_use=False,  # a later configure() changes loggers already made
    )
    # fusee's own logger is built once, here (structlog's lazy logger builds one on every
    # call): configuring again builds it again
    _LOGGER.use(structlog.get_logger("fusee").bind())


class _UtcStamp:
    """``2026-05-09T12:00:00.123456Z`` (what ``TimeStamper(fmt="iso", utc=True)``
    writes), with the part up to the second formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self) -> str:
        now = time.time()  # noqa: TID251 - the wall time a log line shows, never replayed
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((now - second) * 1_000_000):06d}Z"


class _JsonLine:
    """The JSON renderer of :func:`configure_logging`: the entry, the bound context, the
    level and the timestamp in one pass, encoded by msgspec (a value JSON has no type
    for is written as its ``repr``, as structlog's ``JSONRenderer`` does)."""

    def __init__(self) -> None:
        self._stamp = _UtcStamp()
        self._encode = msgspec.json.Encoder(enc_hook=repr).encode

    def __call__(self, logger: Any, method_name: str, event_dict: EventDict) -> str:
        if "exc_info" in event_dict or "stack_info" in event_dict:
            event_dict = structlog.processors.StackInfoRenderer()(logger, method_name, event_dict)
            event_dict = structlog.processors.format_exc_info(logger, method_name, event_dict)
        line = {
            "timestamp": self._stamp(),
            "level": _LEVEL_NAMES.get(method_name, method_name),
            "event": event_dict.get("event"),
        }
        # what merge_contextvars does (an unbound variable holds Ellipsis)
        if _BOUND_VARS is not None:
            for name, var in tuple(_BOUND_VARS.items()):  # a thread may bind a new key
                value = var.get(Ellipsis)
                if value is not Ellipsis:
                    line[name[_BOUND_LEN:]] = value
        else:
            for var, value in contextvars.copy_context().items():
                name = var.name
                if name.startswith(_BOUND) and value is not Ellipsis:
                    line[name[_BOUND_LEN:]] = value
        line.update(event_dict)  # a call's own keys win over bound ones
        try:
            return self._encode(line).decode()
        except (TypeError, ValueError, msgspec.EncodeError):  # e.g. a dict keyed by tuples
            return json.dumps(line, default=repr)


class _LineWriter:
    """Writes each line to its stream and flushes it (structlog's ``PrintLogger``
    without ``print``)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()  # lines of several threads do not interleave

    def msg(self, message: str) -> None:
        with self._lock:
            self._stream.write(message + "\n")
            self._stream.flush()

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


class _LineWriterFactory:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def __call__(self, *args: Any) -> _LineWriter:
        return _LineWriter(self._stream)


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False
