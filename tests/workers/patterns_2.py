"""The agent patterns of ``examples/patterns/`` that ``tests/integration/test_patterns_2.py``
runs, imported as ``fusee dev`` imports a file, so one worker serves them all. The test
module imports ``FILES`` from here without loading them (it serves nothing).

With ``PATTERNS_GATE`` set (a directory), two models wait for the test, not for a pace
of their own: the model of ``interrupt_regenerate.py`` holds its third word until the
file ``interrupt`` is there (the test stops the run while the model is held), and the
model of ``rate_limits.py`` holds a request whose question starts with ``hold:`` until
the file ``limits`` is there, with its permit (the test queues runs behind it), and
writes each question it is asked to ``limits-asked``, in the order of the permits.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

from fusee.adapters.cli.loader import load_file
from fusee.ai import ModelRequest, ModelResponse
from fusee.testing import ScriptedModel
from tests.workers.patterns_1 import PATTERNS

FILES = (
    "interrupt_regenerate",
    "parallel_tools",
    "racing_models",
    "workflow_tool",
    "notify_when_ready",
    "undo_on_failure",
    "long_conversations",
    "rate_limits",
    "provider_down",
)
HELD_AFTER = 2  # words the gated model writes before it waits for the gate


def gate_open(gate: Path, name: str) -> None:
    """Let the gated model of ``name`` go on (the test's side of the gate)."""
    (gate / name).touch()


def asked(gate: Path) -> list[str]:
    """The questions the gated model of ``rate_limits.py`` was asked, in order."""
    found = gate / "limits-asked"
    return found.read_text().splitlines() if found.exists() else []


async def opened(gate: Path) -> None:
    while not gate.exists():
        await anyio.sleep(0.02)  # a condition polled, not a time to wait


def hold_at_gates(gate: Path, interrupt: Any, limits: Any) -> None:
    """Give the two example modules the held models (what their workflows call)."""

    class HeldWords(interrupt.SlowModel):  # type: ignore[misc]
        async def pace(self, words: int) -> None:
            if words >= HELD_AFTER:
                await opened(gate / "interrupt")

    class HeldRequests(ScriptedModel):
        async def complete(self, request: ModelRequest) -> ModelResponse:
            question = getattr(request.messages[0], "content", "")
            with (gate / "limits-asked").open("a") as out:
                out.write(f"{question}\n")
            if question.startswith("hold:"):
                await opened(gate / "limits")
            return await super().complete(request)

    interrupt.model = HeldWords(interrupt.reply, per_word=0)
    limits.model = HeldRequests(limits.answer)


if __name__ != "tests.workers.patterns_2":  # a worker's module (launch.py), not the tests' import
    loaded = {stem: load_file(str(PATTERNS / f"{stem}.py")) for stem in FILES}
    if gate := os.environ.get("PATTERNS_GATE"):
        hold_at_gates(Path(gate), loaded["interrupt_regenerate"], loaded["rate_limits"])
