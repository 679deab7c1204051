"""Small helpers shared by several test modules (import as ``tests.helpers``).

Worker modules under ``tests/workers`` share their side-effect log writers in
``tests/workers/effects.py`` (``launch.py`` puts the repository root on ``sys.path``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import anyio

from fusee.actors.registry import Registry, Workflow
from fusee.runtime.ids import escape, partition_of
from fusee.runtime.inbox import PermitRequest, decode_message
from fusee.runtime.limits import limit_actor_id
from fusee.runtime.tokens import TokenEvent


def registry_of(fn: Any, name: str) -> Registry:
    """A registry holding one workflow ``name`` run by ``fn`` (input type ``Any``)."""
    registry = Registry()
    registry.add(Workflow(name, fn, Any, True))
    return registry


def cli_env() -> dict[str, str]:
    """The environment for a ``fusee`` subprocess: the tests say where NATS is, so
    nothing from the developer's shell may point elsewhere."""
    return {k: v for k, v in os.environ.items() if k not in ("FUSEE_NATS_URL", "FUSEE_STORE")}


def cli_cmd(*args: str) -> list[str]:
    """The command line of ``fusee ARGS`` with JSON logs."""
    return [sys.executable, "-m", "fusee", *args, "--log-format", "json"]


async def run_cli(*args: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    """Run ``fusee ARGS`` to its end; stdout and stderr as text."""
    with anyio.fail_after(timeout):
        done = await anyio.run_process(cli_cmd(*args), check=False, env=cli_env())
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def split_attempts(events: list[TokenEvent]) -> list[list[TokenEvent]]:
    """The events per attempt: a boundary starts a new list."""
    out: list[list[TokenEvent]] = [[]]
    for e in events:
        if e.kind == "attempt":
            out.append([])
        out[-1].append(e)
    return out


async def permit_requests(engine: Any, limit: str) -> list[PermitRequest]:
    """The permit requests in limit ``limit``'s inbox on NATS, in the order its actor
    reads them (a run that parked and came back asks again: its request is there twice)."""
    actor = limit_actor_id(limit)
    eid, p = escape(actor), partition_of(actor, engine.partitions)
    found = []
    for m in await engine.store.read_inbox(p, eid):
        msg = decode_message(m.data)
        if isinstance(msg, PermitRequest):
            found.append(msg)
    return found
