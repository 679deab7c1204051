"""Side-effect logs shared by the worker modules: one O_APPEND write per line, so
processes never interleave. Worker modules import it as ``tests.workers.effects``
(``launch.py`` puts the repository root on ``sys.path``). chain.py keeps its own copy:
the ``fusee worker`` CLI loads it too, without that path."""

from __future__ import annotations

import os

import anyio


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


async def wait_for_file(path: str) -> None:
    """Block until ``path`` exists: a window the test opens and closes itself (a step
    held this way outlasts any CPU contention, and a cancel or a kill still stops it)."""
    while not os.path.exists(path):
        await anyio.sleep(0.01)
