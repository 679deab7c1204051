"""The options every ``fusee`` command takes, and how to repeat them in a hint."""

from __future__ import annotations

import shlex
from contextvars import ContextVar
from dataclasses import dataclass

from fusee._logging import LogFormat

__all__ = ("GlobalOptions", "CURRENT", "DEFAULT_NAMESPACE", "DEFAULT_STORE", "command_hint")

DEFAULT_NAMESPACE = "fusee"
DEFAULT_STORE = ".fusee"


@dataclass(frozen=True)
class GlobalOptions:
    """Where to find NATS and which namespace to use.

    Attributes:
        nats: the server URL, or ``None`` for the embedded server of ``store``.
        nats_flag: ``--nats`` was given (not taken from ``$FUSEE_NATS_URL``).
        namespace: the fusee namespace (stream ``NAMESPACE``, buckets ``namespace_*``).
        store: the embedded server's directory.
    """

    nats: str | None = None
    nats_flag: bool = False
    namespace: str = DEFAULT_NAMESPACE
    store: str = DEFAULT_STORE
    log_format: LogFormat = "console"
    log_level: str = "info"


# Set by the CLI for the command it runs, so code it calls (a dev file's ``main``) can
# print commands that reach the same server and namespace.
CURRENT: ContextVar[GlobalOptions] = ContextVar(
    "fusee_cli_options",
    default=GlobalOptions(),  # noqa: B039 - a frozen dataclass, never mutated
)


def command_hint(*args: str) -> str:
    """The ``fusee`` command line for ``args`` with the options of the running command.

    Example:
        ``command_hint("runs", "show", "support-42")`` -> ``'fusee runs show support-42'``
    """
    opts = CURRENT.get()
    words = ["fusee", *args]
    if opts.nats_flag and opts.nats:
        words += ["--nats", opts.nats]
    elif opts.nats is None and opts.store != DEFAULT_STORE:
        words += ["--store", opts.store]
    if opts.namespace != DEFAULT_NAMESPACE:
        words += ["--namespace", opts.namespace]
    return shlex.join(words)
