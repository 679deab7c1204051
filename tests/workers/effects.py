"""Side-effect logs shared by the worker modules: one O_APPEND write per line, so
processes never interleave. Worker modules import it as ``tests.workers.effects``
(``launch.py`` puts the repository root on ``sys.path``). chain.py keeps its own copy:
the ``fusee worker`` CLI loads it too, without that path."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

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


def traced(result: Any, arg: Any) -> Callable[[Any], Awaitable[Any]]:
    """A step that returns ``result``. When ``arg`` is a dict naming a ``log``, each
    execution is recorded there (``<tag> <key> <attempt>``, the tag ``work`` if it names
    none), and when it names ``hold``
    (a path) the step blocks until that file exists."""

    async def step(s: Any) -> Any:
        if isinstance(arg, dict) and "log" in arg:
            record(arg["log"], str(arg.get("tag") or "work"), s.key, s.attempt)
            if arg.get("hold"):
                await wait_for_file(arg["hold"])
        return result

    return step
