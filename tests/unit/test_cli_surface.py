"""Every ``fusee`` command takes the shared options (``--json``, the connection and the
NATS credential flags), and only the credentials given go to ``fusee.connect``. (How
they resolve, flag over environment, is ``tests/e2e/test_cli_complete.py``'s.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer.main

from fusee.adapters.cli.main import app
from fusee.adapters.cli.options import CREDENTIALS, GlobalOptions

SHARED = {"--json", "--nats", "--namespace", "--store", "--log-format", "--log-level"} | {
    flag for _, flag, _, _ in CREDENTIALS
}
COMMANDS = {
    "dev", "worker", "api",
    "runs start", "runs list", "runs show", "runs journal", "runs result", "runs signal",
    "runs cancel", "runs resume", "runs bulk resume", "runs bulk cancel",
    "streams follow",
    "objects ls", "objects get", "objects show", "objects edit", "objects clear",
    "objects cancel", "objects call", "objects send",
    "limits ls", "limits set",
    "tokens create", "tokens ls", "tokens revoke",
    "region failover", "region status",
}  # fmt: skip


def _leaves(command: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    subs = getattr(command, "commands", None)
    if not subs:
        yield path.strip(), command
        return
    for name, sub in subs.items():
        yield from _leaves(sub, f"{path} {name}")


def test_every_command_takes_the_shared_options() -> None:
    leaves = dict(_leaves(typer.main.get_command(app)))
    assert set(leaves) == COMMANDS
    for name, command in leaves.items():
        flags = {opt for p in command.params for opt in p.opts}
        assert flags >= SHARED, (name, SHARED - flags)


def test_credentials_are_only_those_given() -> None:
    assert GlobalOptions().credentials() == {}
    given = GlobalOptions(user="ana", password="pw", tls_ca="ca.pem")
    assert given.credentials() == {"user": "ana", "password": "pw", "tls_ca": "ca.pem"}
