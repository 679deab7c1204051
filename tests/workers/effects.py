"""Side-effect logs shared by the worker modules: one O_APPEND write per line, so
processes never interleave. Worker modules import it as ``tests.workers.effects``
(``launch.py`` puts the repository root on ``sys.path``). chain.py keeps its own copy:
the ``fusee worker`` CLI loads it too, without that path."""

from __future__ import annotations

import os


def record_line(log: str, line: str) -> None:
    """Append ``line`` to ``log`` in one O_APPEND write."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def record(log: str, name: str, key: str, attempt: int) -> None:
    """One line per execution: ``name key attempt``."""
    record_line(log, f"{name} {key} {attempt}")
