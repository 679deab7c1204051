"""Workflows for worker-process tests: chains of slow steps that record their side effects.

A run's input is a dict: ``log`` (a file path), ``steps`` (how many), ``delay``
(seconds each step sleeps), ``tag`` (a label put in the result), and optionally
``hold``: ``{"step": "s3", "until": <path>}``, which makes every execution of that step
block until the file ``until`` exists (the test creates it), so a test that kills the
worker "during" the step holds it open as long as it needs. Every execution of a step
appends ``<step-name> <s.key> <attempt>`` to ``log`` before it blocks or sleeps, so a
test counts executions across processes, including the ones a kill cut short.
``returned``: ``{"step": "s1", "file": <path>}`` makes that step create ``file`` as its
body returns (no await after it: the step's result is about to be committed).
"""

from __future__ import annotations

import os
from typing import Any

import anyio

import fusee


def record(log: str, name: str, key: str, attempt: int) -> None:
    """One line per execution, in one O_APPEND write, so processes never interleave.

    Kept here, not imported from ``tests.workers.effects``: ``fusee worker`` (the CLI,
    see test_logs.py) also loads this file, without the repository root on sys.path."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{name} {key} {attempt}\n".encode())
    finally:
        os.close(fd)


async def wait_for_file(path: str) -> None:
    """Block until ``path`` exists: a window the test opens and closes itself."""
    while not os.path.exists(path):
        await anyio.sleep(0.01)


def _step(arg: dict[str, Any], name: str, value: int) -> Any:
    hold = arg.get("hold") or {}
    returned = arg.get("returned") or {}

    async def fn(s: fusee.StepInfo) -> dict[str, Any]:
        record(arg["log"], name, s.key, s.attempt)
        if hold.get("step") == name:
            await wait_for_file(hold["until"])
        await anyio.sleep(arg["delay"])
        if returned.get("step") == name:
            open(returned["file"], "a").close()  # (no await after it)
        return {"key": s.key, "value": value}

    return fn


@fusee.workflow("chain")
async def chain(ctx: fusee.Context, arg: dict[str, Any]) -> dict[str, Any]:
    values = []
    for i in range(1, arg["steps"] + 1):
        done = await ctx.step(f"s{i}", _step(arg, f"s{i}", i * i))
        values.append(done["value"])
    return {"tag": arg.get("tag"), "values": values}


def expected(arg: dict[str, Any]) -> dict[str, Any]:
    """What ``chain`` returns for ``arg``."""
    return {"tag": arg.get("tag"), "values": [i * i for i in range(1, arg["steps"] + 1)]}
