"""The options every ``fusee`` command takes, and how to repeat them in a hint."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from fusee.adapters.jetstream.credentials import redact
from fusee.logs import LogFormat

__all__ = (
    "GlobalOptions",
    "CREDENTIALS",
    "CURRENT",
    "DEFAULT_NAMESPACE",
    "DEFAULT_STORE",
    "command_hint",
    "program",
)

DEFAULT_NAMESPACE = "fusee"
DEFAULT_STORE = ".fusee"


# The NATS credentials every connecting command takes: (GlobalOptions field, flag,
# environment variable, help). Each is passed to ``fusee.connect`` as the keyword of
# the field's name, and only when given (issue 15's contract).
CREDENTIALS: tuple[tuple[str, str, str, str], ...] = (
    ("user", "--nats-user", "FUSEE_NATS_USER", "NATS user name (with --nats-password)"),
    ("password", "--nats-password", "FUSEE_NATS_PASSWORD", "NATS password"),
    ("token", "--nats-token", "FUSEE_NATS_TOKEN", "NATS authentication token"),
    ("nkey_seed", "--nats-nkey", "FUSEE_NATS_NKEY", "an nkey seed file, or the seed (SU...)"),
    ("creds", "--nats-creds", "FUSEE_NATS_CREDS", "a NATS .creds file (JWT and nkey seed)"),
    ("tls_ca", "--tls-ca", "FUSEE_TLS_CA", "a CA bundle to verify the NATS server with"),
    ("tls_cert", "--tls-cert", "FUSEE_TLS_CERT", "a client certificate for NATS (with --tls-key)"),
    ("tls_key", "--tls-key", "FUSEE_TLS_KEY", "the client certificate's private key"),
)


@dataclass(frozen=True)
class GlobalOptions:
    """Where to find NATS, how to log in, and which namespace to use.

    Attributes:
        nats: the server URL (comma-separated URLs of a cluster allowed), or ``None``
            for the embedded server of ``store``.
        nats_flag: ``--nats`` was given (not taken from ``$FUSEE_NATS_URL``).
        namespace: the fusee namespace (stream ``NAMESPACE``, buckets ``namespace_*``).
        store: the embedded server's directory.
        as_json: ``--json``: machine-readable output (and errors) on this command.
        user, password, token, nkey_seed, creds, tls_ca, tls_cert, tls_key: NATS
            credentials and TLS files, as ``fusee.connect`` takes them.
        region, partner: the region this process is in and the partner region that
            mirrors the namespace's journal, as ``fusee.connect`` takes them.
    """

    nats: str | None = None
    nats_flag: bool = False
    namespace: str = DEFAULT_NAMESPACE
    store: str = DEFAULT_STORE
    log_format: LogFormat = "console"
    log_level: str = "info"
    as_json: bool = False
    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkey_seed: str | None = None
    creds: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # regions (``fusee worker --region``; else $FUSEE_REGION, read by fusee.connect)
    region: str | None = None
    partner: str | None = None

    def credentials(self) -> dict[str, Any]:
        """The credential keywords for ``fusee.connect``: those given, only.

        Example:
            ``GlobalOptions(user="ana", password="pw").credentials()``
            -> ``{'user': 'ana', 'password': 'pw'}``
        """
        given = {field: getattr(self, field) for field, *_ in CREDENTIALS}
        return {k: v for k, v in given.items() if v is not None}


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
        words += ["--nats", redact(opts.nats)]  # (a password in it stays out of hints)
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
