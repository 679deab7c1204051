"""The ``fusee`` command line's exit codes, and how an error is told on stderr.

A small documented set (docs/reference/cli.md, "Exit codes"), so a script can tell
"it failed" from "you typed it wrong" from "no such thing" from "not yet":

    0  done
    1  an error: a run failed or was cancelled, a handler failed, an action refused
       (the run already ended, it is not paused), a bulk action with failures, NATS
       unreachable, a file that does not import
    2  a usage error or bad input (an invalid ID, JSON, duration, filter): nothing sent
    3  not found: no such run, stream or limit
    4  not yet: a wait ran out (``runs result --timeout``, ``objects call --timeout``)
       or the run has no result yet (it is paused); the work goes on
    130, 143  stopped by SIGINT, SIGTERM
"""

from __future__ import annotations

import sys
from enum import IntEnum

import msgspec

from fusee.errors import (
    ConfigError,
    InvalidArgument,
    InvalidId,
    NotEncodable,
    RunCancelled,
    RunFailed,
    RunNotFound,
    StreamNotFound,
    Timeout,
    UnknownLimit,
)

__all__ = ("Exit", "CliError", "exit_of", "code_name", "tell")


class Exit(IntEnum):
    """The exit codes of ``fusee`` (besides 128 + a signal's number)."""

    OK = 0
    ERROR = 1
    USAGE = 2
    NOT_FOUND = 3
    NOT_YET = 4


# the stable ``code`` of ``--json``'s error object, per exit code (RunFailed and
# RunCancelled are told apart: a script may retry one and not the other)
_NAMES: dict[int, str] = {
    Exit.ERROR: "error",
    Exit.USAGE: "bad_input",
    Exit.NOT_FOUND: "not_found",
    Exit.NOT_YET: "not_yet",
}


class CliError(Exception):
    """An error to print as one line on stderr, exiting with ``code``."""

    def __init__(self, message: str, code: int = Exit.ERROR, *, name: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.name = name


def exit_of(exc: BaseException) -> int:
    """The exit code for an error a command raised."""
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, RunNotFound | StreamNotFound | UnknownLimit):
        return Exit.NOT_FOUND
    if isinstance(exc, InvalidId | InvalidArgument | ConfigError | NotEncodable):
        return Exit.USAGE
    if isinstance(exc, Timeout):
        return Exit.NOT_YET
    return Exit.ERROR


def code_name(exc: BaseException) -> str:
    """The ``code`` of ``--json``'s error object for ``exc``: ``run_failed``,
    ``run_cancelled``, ``not_found``, ``bad_input``, ``not_yet`` or ``error``."""
    if isinstance(exc, CliError) and exc.name is not None:
        return exc.name
    if isinstance(exc, RunCancelled):
        return "run_cancelled"
    if isinstance(exc, RunFailed):
        return "run_failed"
    return _NAMES.get(exit_of(exc), "error")


def tell(exc: BaseException, *, as_json: bool) -> int:
    """Write ``exc`` on stderr (``error: ...``, or with ``as_json`` the HTTP API's error
    shape ``{"error": {"code", "message"}}``) and return its exit code."""
    message = str(exc) or repr(exc)
    if as_json:
        body = {"error": {"code": code_name(exc), "message": message}}
        sys.stderr.write(msgspec.json.encode(body).decode() + "\n")
    else:
        sys.stderr.write(f"error: {message}\n")
    return exit_of(exc)
