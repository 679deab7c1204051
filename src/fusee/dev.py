"""Helpers for scripts that ``fusee dev`` runs (a dev file's ``async def main(engine)``).

Example:
    ``print(fusee.dev.hint("runs", "show", run_id))`` prints the command that shows the run,
    with the same server, namespace and way of invoking ``fusee`` as the running command.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fusee.adapters.cli.options import command_hint
from fusee.adapters.cli.render import format_journal as _format_journal

__all__ = ("hint", "format_journal")


def hint(*args: str) -> str:
    """The ``fusee`` command line for ``args``, with the options of the running command
    (``--store``, ``--nats``, ``--namespace``), as it can be typed in this shell."""
    return command_hint(*args)


def format_journal(journal: Sequence[tuple[int, Any]], indent: str = "  ") -> list[str]:
    """``Run.journal()`` as ``fusee runs show`` prints it, one line per record."""
    return _format_journal(journal, indent)
