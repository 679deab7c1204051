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

import asyncio  # noqa: TID251 - a callback on the loop's next turn (anyio has none); elsewhere: at once
import atexit
import contextvars
import json
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
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

# the methods fusee's modules call on their logger
_METHODS = ("debug", "info", "warning", "error", "exception")


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
        # Its level methods become attributes of this one (they shadow the methods
        # below): no lookup on each call.
        for name in _METHODS:
            if logger is None:
                self.__dict__.pop(name, None)
            else:
                setattr(self, name, getattr(logger, name))

    def _current(self) -> Any:
        if self._built is not None:
            return self._built
        if not structlog.is_configured():
            return self._stdlib
        # Configured by the application (structlog.configure): built once per
        # configuration. structlog's lazy logger builds one on every call (about 10 µs a
        # line here, also for a line its level drops: two a step).
        config = structlog.get_config()
        processors, wrapper = config["processors"], config["wrapper_class"]
        factory, context = config["logger_factory"], config["context_class"]
        was = self._config
        if (
            processors is not was[0]
            or wrapper is not was[1]
            or factory is not was[2]
            or context is not was[3]
        ):
            self._config = (processors, wrapper, factory, context)
            self._configured = structlog.get_logger("fusee").bind()
        return self._configured

    # The methods fusee's modules call, defined: a name found only by ``__getattr__``
    # costs a failed lookup first (an AttributeError made and dropped), 5-7 µs a call
    # with the check above, also for a line the level drops (two or three a step).
    def debug(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._current().debug(event, *args, **kw)

    def info(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._current().info(event, *args, **kw)

    def warning(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._current().warning(event, *args, **kw)

    def error(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._current().error(event, *args, **kw)

    def exception(self, event: str, *args: Any, **kw: Any) -> Any:
        return self._current().exception(event, *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._current(), name)


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
    the context bound through :mod:`structlog.contextvars` (run, worker, step). A
    console line is written (and flushed) when it is logged.

    The JSON format applies to every structlog line of the process, fusee's and the
    application's own (``structlog.get_logger().info(...)`` in a workflow, say). A JSON
    line at info or debug logged in an event loop is written two turns of the loop
    later, with the lines logged meanwhile (off the path of the step that logged it); a
    line at warning or above, a line logged outside an event loop, configuring again
    and the interpreter's normal exit (``atexit``) write every line taken before at
    once, in order. A line shows its call's values as they were when it was logged: a
    line whose values are all ``str``, ``int``, ``float``, ``bool`` or ``None`` is
    rendered when it is written, any other (a dict, a list, an object) at once. The
    bound context's values are read when the line is rendered: a mutable value bound
    with ``bind_contextvars`` and changed within those two turns shows the change. A
    value that cannot be rendered (a circular list, a ``__repr__`` that raises) makes
    its line ``{"timestamp", "level", "event", "log_error": "RecursionError: ..."}``;
    no call raises for it and the other lines are written. A line logged by a value's
    ``__repr__`` while a JSON line is rendered is written right after that line, with
    that line's bound context less its values other than those plain types (in the
    console format, a ``__repr__``'s line is written before the line being rendered). A
    forked child does not write its parent's waiting lines (the parent does). What a
    process that does not exit normally may lack: the info and debug lines of its last
    two loop turns, when it is killed (``SIGKILL``, the OOM killer), or dies on a signal
    it does not handle (``SIGTERM`` in an application that sets no handler; ``fusee
    worker`` handles SIGTERM and SIGINT and exits normally), or ends with ``os._exit``.
    fusee's lines keep this configuration until the next call, even if the application
    calls ``structlog.configure()`` in between.

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
        # What a deployed worker writes (stderr is not a terminal): a line per step, so
        # the step's path only takes the entry down; it is rendered and written off it
        # (see "Logs" in docs/design.md).
        writer = _LineWriter(out, _JsonLine())
        processors = [_take_entry]
    else:
        writer = _LineWriter(out)
        processors = [
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.dev.ConsoleRenderer(
                colors=_is_tty(out),
                # Never a frame's locals: a request's token, a secret, a user's input
                # held in a local variable would be written into the log (structlog's
                # default rich traceback shows them).
                exception_formatter=structlog.dev.RichTracebackFormatter(show_locals=False),
            ),
        ]
    _use_writer(writer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=_LineWriterFactory(writer),
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

    def __call__(self, now: float) -> str:
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((now - second) * 1_000_000):06d}Z"


_Entry = tuple[float, str, EventDict, contextvars.Context]
"""A JSON line as it was logged: its time, the logger method's name, the event dict,
and the logging task's context (``copy_context()`` costs a reference: the bound
variables are read out of it when the line is rendered)."""

# structlog.contextvars binds each key in a context variable named with this prefix
_BOUND = structlog.contextvars.STRUCTLOG_KEY_PREFIX
_BOUND_LEN = len(_BOUND)

# Lines logged by a value's __repr__ while a line is rendered, nested this deep at most:
# the next is written as its time, level, event and a ``log_error`` saying so.
_NESTED = 4
_TOO_DEEP = f"logged while rendering a line {_NESTED} lines deep (a __repr__ that logs)"

_SOON = {"debug", "info"}  # the levels a line may wait at; the rest are written at once

# The types of a call's values that may wait unrendered: nothing can change them before
# the line is rendered (a container or another object is rendered when it is logged).
_PLAIN = frozenset({str, int, float, bool, type(None)})


def _take_entry(logger: Any, method_name: str, event_dict: EventDict) -> Any:
    """The last processor of ``configure_logging("json")``: the entry, for the writer
    to render (a traceback is made now, while the exception is the one being handled)."""
    if "exc_info" in event_dict or "stack_info" in event_dict:
        event_dict = structlog.processors.StackInfoRenderer()(logger, method_name, event_dict)
        event_dict = structlog.processors.format_exc_info(logger, method_name, event_dict)
    now = time.time()  # noqa: TID251 - the wall time a log line shows, never replayed
    # (args, kwargs) for the logger's method: structlog passes a tuple through as is
    return ((now, method_name, event_dict, contextvars.copy_context()),), {}


class _JsonLine:
    """Renders an entry: the timestamp, the level, the event, the bound context and the
    event's own keys, encoded by msgspec (a value JSON has no type for is written as its
    ``repr``, as structlog's ``JSONRenderer`` does)."""

    def __init__(self) -> None:
        self._stamp = _UtcStamp()
        self._encode = msgspec.json.Encoder(enc_hook=_repr_for_msgspec).encode
        # Each context variable seen, and the key it binds (None: not structlog's). The
        # scan of structlog's get_contextvars() over a worker's 34 variables costs 7.5
        # µs; a lookup each, 3 µs.
        self._keys: dict[contextvars.ContextVar[Any], str | None] = {}

    def __call__(self, entry: _Entry, nested: bool = False) -> str:
        """The line. ``nested``: a line logged while another is rendered (by a value's
        ``__repr__``), which leaves out the bound values that are not plain (a bound
        value whose ``__repr__`` logs would log on each such line again, 4 deep)."""
        when, method_name, event_dict, context = entry
        line = {
            "timestamp": self._stamp(when),
            "level": _LEVEL_NAMES.get(method_name, method_name),
            "event": event_dict.get("event"),
        }
        # what merge_contextvars does, in the context the line was logged in
        keys = self._keys
        for var, value in context.items():
            key = keys.get(var, False)  # (False: not seen yet)
            if key is False:
                if len(keys) > 4096:  # (context variables made and dropped by the thousand)
                    keys.clear()
                name = var.name
                key = keys[var] = name[_BOUND_LEN:] if name.startswith(_BOUND) else None
            if isinstance(key, str) and value is not Ellipsis:  # (unbound: Ellipsis)
                if nested and type(value) not in _PLAIN:
                    continue
                line[key] = value
        line.update(event_dict)  # a call's own keys win over bound ones
        try:
            return self._encode(line).decode()
        except _ReprFailed as failed:  # (not tried again: a second call logs its lines again)
            raise failed.error from None
        except (TypeError, ValueError, msgspec.EncodeError):  # e.g. a dict keyed by tuples
            return json.dumps(line, default=repr)

    def failed(self, entry: _Entry, error: Exception) -> str:
        """The line written for an entry that could not be rendered (a circular list, a
        ``__repr__`` that raises): its time, level and event, and the error."""
        when, method_name, event_dict, _ = entry
        event = event_dict.get("event")
        return json.dumps(
            {
                "timestamp": self._stamp(when),
                "level": _LEVEL_NAMES.get(method_name, method_name),
                "event": event if isinstance(event, str) else _described(event),
                "log_error": f"{type(error).__name__}: {_described(error, str)}",
            }
        )


class _LineWriter:
    """Writes lines to its stream, each with its newline, and flushes it: a rendered
    line (a string) at once; a JSON entry of ``_SOON`` level logged in an event loop
    two turns of that loop later, with every entry taken meanwhile, in one write.

    Two turns: what the logging task made ready in its turn (the next commit's socket
    write, for a step's line) runs in the next one, before the lines. Every write
    writes what waits first, so lines keep the order they were logged in.

    An entry with a value of its call that is not a plain ``str``, ``int``, ``float``,
    ``bool`` or ``None`` is rendered when it is logged (a list or a dict changed after
    the call must not change the line) and waits rendered. Each entry is rendered on
    its own: one that fails is written as a line saying so (``_JsonLine.failed``), and
    the others as they are."""

    def __init__(self, stream: TextIO, render: _JsonLine | None = None) -> None:
        self._stream = stream
        self._render = render
        # lines of several threads do not interleave; re-entrant, for a line logged by a
        # value's __repr__ while this thread renders one (``_depth`` lines deep)
        self._lock = threading.RLock()
        self._depth = 0
        self._nested: list[str | _Entry] = []  # lines so logged, written after it
        self._urgent = False  # one of them is a warning or above: write when the call returns
        self._waiting: list[str | _Entry] = []  # (a string: an entry rendered when logged)
        self._loop: asyncio.AbstractEventLoop | None = None  # where the write is scheduled
        _WRITERS.add(self)

    def msg(self, message: str | _Entry) -> None:
        if isinstance(message, str):
            with self._lock:
                if self._depth:  # logged by a value's __repr__ while this thread renders
                    self._nested.append(message)
                    self._urgent = True
                    return
                self._write(message + "\n")
            return
        loop = _running_loop()
        plain = True
        for value in message[2].values():
            if type(value) not in _PLAIN:
                plain = False
                break
        with self._lock:
            if self._depth:
                # A value's __repr__ logs while this thread renders a line (the lock is
                # re-entrant: a plain lock waited for itself here for ever). The line
                # comes right after the one being rendered, rendered then; a warning
                # is written when the outer call returns.
                self._nested.append(message)
                if message[1] not in _SOON:
                    self._urgent = True
                return
            if plain:
                self._waiting.append(message)
            else:
                lines: list[str] = []
                self._render_into(message, lines)
                self._waiting.extend(lines)
            if loop is not None and message[1] in _SOON and not self._urgent:
                if self._loop is loop:
                    return  # its write is scheduled
                if self._loop is None or not self._loop.is_running():
                    # (a loop that stopped before its write ran: this one takes over)
                    self._loop = loop
                    loop.call_soon(self._next_turn, loop)
                    return
            self._write_waiting()

    log = debug = info = warn = warning = error = critical = exception = fatal = msg

    def flush(self, timeout: float = -1) -> None:
        """Write every line taken (unless another thread holds the writer past
        ``timeout`` seconds; -1: wait as long as it takes)."""
        if not self._lock.acquire(timeout=timeout):
            return
        try:
            self._write_waiting()
        finally:
            self._lock.release()

    def _next_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        try:
            self.flush()
        except (OSError, ValueError):  # the stream is closed or gone: nowhere to write
            pass

    def _write_waiting(self) -> None:
        self._loop, self._urgent = None, False
        if not self._waiting:
            return
        entries, self._waiting = self._waiting, []
        lines: list[str] = []
        for entry in entries:
            self._render_into(entry, lines)
        self._write("".join([line + "\n" for line in lines]))
        self._urgent = False

    def _render_into(self, entry: str | _Entry, lines: list[str]) -> None:
        """Append ``entry`` rendered to ``lines``, then the lines its values' ``__repr__``
        logged meanwhile (rendered the same way), so a nested line follows its outer one.
        Called with the lock held: ``_depth`` and ``_nested`` are the holding thread's."""
        if isinstance(entry, str):
            lines.append(entry)
            return
        render = self._render
        assert render is not None  # (entries come from the JSON format only)
        outer, self._nested = self._nested, []
        if self._depth >= _NESTED:  # a repr that logs a line holding itself, say
            try:
                lines.append(render.failed(entry, RecursionError(_TOO_DEEP)))
            finally:  # what failed() logs (the event's repr: this again) is dropped
                self._nested = outer
            return
        self._depth += 1
        try:
            # In the context the line was logged in: a line its values' __repr__ logs
            # takes that context (not the one of the task that scheduled the write).
            context = entry[3]
            try:
                lines.append(context.run(render, entry, self._depth > 1))
            except Exception as error:  # noqa: BLE001 - any value's failure: a line saying so
                lines.append(context.run(render.failed, entry, error))
            for nested in self._nested:
                self._render_into(nested, lines)
        finally:
            self._depth -= 1
            self._nested = outer

    def forget_waiting(self) -> None:
        """In a forked child: drop the parent's lines (the parent writes them) and its
        lock (a thread of the parent may have held it at the fork)."""
        self._lock = threading.RLock()
        self._depth = 0
        self._nested = []
        self._urgent = False
        self._waiting = []
        self._loop = None

    def _write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()


class _LineWriterFactory:
    def __init__(self, writer: _LineWriter) -> None:
        self._writer = writer

    def __call__(self, *args: Any) -> _LineWriter:
        return self._writer  # one writer: one order of lines, one lock


_WRITER: list[_LineWriter] = []  # the writer of the last configure_logging
# every writer alive (a logger an application bound earlier keeps its configuration's)
_WRITERS: weakref.WeakSet[_LineWriter] = weakref.WeakSet()


def _forget_waiting_in_child() -> None:
    for writer in list(_WRITERS):
        writer.forget_waiting()


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_forget_waiting_in_child)


def _use_writer(writer: _LineWriter) -> None:
    if not _WRITER:
        atexit.register(_flush_at_exit)
    else:
        _WRITER[0].flush()  # the lines of the earlier configuration go to its stream
        _WRITER.clear()
    _WRITER.append(writer)


def _flush_at_exit() -> None:
    try:
        # (a daemon thread stuck in a write, a full pipe say, must not hang the exit)
        _WRITER[0].flush(timeout=5.0)
    except (OSError, ValueError):  # a stream closed or gone before the interpreter
        pass


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # not in an event loop's thread: written at once
        return None


class _ReprFailed(Exception):
    """A value's ``__repr__`` raised while msgspec encoded a line (``error``): the line
    fails, and is not encoded again with ``json`` (which would call it again)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _repr_for_msgspec(value: object) -> str:
    try:
        return repr(value)
    except Exception as error:  # (raised again as itself by _JsonLine)
        raise _ReprFailed(error) from error


def _described(value: object, describe: Callable[[object], str] = repr) -> str:
    try:
        return describe(value)
    except Exception:  # noqa: BLE001 - its own __repr__ or __str__ fails
        return f"<{type(value).__qualname__} object>"


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False
