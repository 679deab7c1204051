"""The options every ``fusee`` command takes, and how to repeat them in a hint."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypedDict, cast

from fusee.logs import LogFormat

__all__ = (
    "GlobalOptions",
    "AUTH_FLAGS",
    "NatsAuth",
    "CURRENT",
    "DEFAULT_NAMESPACE",
    "DEFAULT_STORE",
    "command_hint",
    "program",
)

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
        nats_auth: the NATS credential options given as flags, as ``fusee.connect``'s
            keyword arguments (``user``, ``password``, ``token``, ``nkey_seed``, ``creds``,
            ``tls_ca``, ``tls_cert``, ``tls_key``); their environment variables are read
            by ``fusee.connect`` itself.
    """

    nats: str | None = None
    nats_flag: bool = False
    namespace: str = DEFAULT_NAMESPACE
    store: str = DEFAULT_STORE
    log_format: LogFormat = "console"
    log_level: str = "info"
    nats_auth: tuple[tuple[str, str], ...] = ()

    def auth(self) -> NatsAuth:
        """The credential flags as ``fusee.connect``'s keyword arguments."""
        return cast(NatsAuth, dict(self.nats_auth))


class NatsAuth(TypedDict, total=False):
    """``fusee.connect``'s credential arguments (see ``AUTH_FLAGS``)."""

    user: str
    password: str
    token: str
    nkey_seed: str
    creds: str
    tls_ca: str
    tls_cert: str
    tls_key: str


# The credential flags of every command that connects: (flag, fusee.connect argument,
# environment variable fusee.connect reads when the flag is not given)
AUTH_FLAGS = (
    ("--nats-user", "user", "FUSEE_NATS_USER"),
    ("--nats-password", "password", "FUSEE_NATS_PASSWORD"),
    ("--nats-token", "token", "FUSEE_NATS_TOKEN"),
    ("--nats-nkey", "nkey_seed", "FUSEE_NATS_NKEY"),
    ("--nats-creds", "creds", "FUSEE_NATS_CREDS"),
    ("--tls-ca", "tls_ca", "FUSEE_TLS_CA"),
    ("--tls-cert", "tls_cert", "FUSEE_TLS_CERT"),
    ("--tls-key", "tls_key", "FUSEE_TLS_KEY"),
)


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
        (``'.venv/bin/fusee runs show support-42'`` when ``fusee`` is not on ``PATH``)
    """
    opts = CURRENT.get()
    words = [*program(), *args]
    if opts.nats_flag and opts.nats:
        words += ["--nats", opts.nats]
    elif opts.nats is None and opts.store != DEFAULT_STORE:
        words += ["--store", opts.store]
    if opts.namespace != DEFAULT_NAMESPACE:
        words += ["--namespace", opts.namespace]
    return shlex.join(words)


def program() -> list[str]:
    """How to run ``fusee`` again as this process was run: ``fusee`` when that is the one
    on ``PATH``, else the script's path as typed (``.venv/bin/fusee``), else
    ``python -m fusee`` with this interpreter."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "fusee":
        found = shutil.which("fusee")
        if found is not None and os.path.realpath(found) == os.path.realpath(argv0):
            return ["fusee"]
        return [argv0]
    python = sys.executable or "python3"
    try:
        rel = os.path.relpath(python)
    except ValueError:  # another drive (Windows)
        rel = python
    return [rel if not rel.startswith("..") and len(rel) < len(python) else python, "-m", "fusee"]
