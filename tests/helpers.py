"""Small helpers shared by several test modules (import as ``tests.helpers``).

Worker modules under ``tests/workers`` share their side-effect log writers in
``tests/workers/effects.py`` (``launch.py`` puts the repository root on ``sys.path``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

import fusee
from fusee.actors.registry import Registry, Workflow
from fusee.runtime.ids import escape, partition_of
from fusee.runtime.inbox import PermitRequest, decode_message
from fusee.runtime.index import decode_info
from fusee.runtime.limits import limit_actor_id
from fusee.runtime.records import encode_record, kind_of
from fusee.runtime.tokens import TokenEvent


def registry_of(fn: Any, name: str) -> Registry:
    """A registry holding one workflow ``name`` run by ``fn`` (input type ``Any``)."""
    registry = Registry()
    registry.add(Workflow(name, fn, Any, True))
    return registry


def cli_env() -> dict[str, str]:
    """The environment for a ``fusee`` subprocess: the tests say where NATS is, so
    nothing from the developer's shell may point elsewhere."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("FUSEE_NATS_URL", "FUSEE_STORE")
        and not k.startswith(("FUSEE_NATS_", "FUSEE_TLS_"))  # credentials fusee.connect reads
    }


def cli_cmd(*args: str) -> list[str]:
    """The command line of ``fusee ARGS`` with JSON logs."""
    return [sys.executable, "-m", "fusee", *args, "--log-format", "json"]


async def run_cli(
    *args: str, timeout: float = 20.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``fusee ARGS`` to its end (in ``env``, default :func:`cli_env`); stdout and
    stderr as text."""
    with anyio.fail_after(timeout):
        done = await anyio.run_process(
            cli_cmd(*args), check=False, env=cli_env() if env is None else env
        )
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


def hold_store_call(
    engine: fusee.Engine, name: str, when: Callable[..., bool], *, after: bool = False
) -> tuple[anyio.Event, anyio.Event]:
    """Hold the store's ``name`` call when ``when(*args, **kwargs)``, once, before it
    goes out (or ``after`` it was answered): returns (entered, release)."""
    real: Callable[..., Awaitable[Any]] = getattr(engine.store, name)
    entered, release = anyio.Event(), anyio.Event()

    async def held(*args: Any, **kwargs: Any) -> Any:
        if entered.is_set() or not when(*args, **kwargs):
            return await real(*args, **kwargs)
        result = await real(*args, **kwargs) if after else None
        entered.set()
        await release.wait()
        return result if after else await real(*args, **kwargs)

    setattr(engine.store, name, held)
    return entered, release


def poked_at(worker: Any, eid: str, *, hints: int = 0) -> anyio.Event:
    """Set once the worker handed an inbox message of ``eid`` to wherever it goes, and
    ``hints`` wake hints (no message) for it too."""
    real = worker._ensure_actor
    seen = anyio.Event()
    got_msg, got_hints = False, 0

    def ensure(p: int, got: str, **kwargs: Any) -> None:
        nonlocal got_msg, got_hints
        real(p, got, **kwargs)
        if got == eid and kwargs.get("poke"):
            if kwargs.get("msg") is not None:
                got_msg = True
            else:
                got_hints += 1
            if got_msg and got_hints >= hints:
                seen.set()

    worker._ensure_actor = ensure
    return seen


def hold_index_write(
    engine: fusee.Engine, eid: str, status: str
) -> tuple[anyio.Event, anyio.Event]:
    """Hold run ``eid``'s index entry saying ``status`` on its way (the last write of
    an activation leaving memory to park or pause): returns (entered, release)."""
    return hold_store_call(
        engine,
        "put_index",
        lambda e, value, **_: e == eid and decode_info(value).status == status,
    )


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


async def forge_last(engine: fusee.Engine, run: fusee.Run, kind: type, msg_id: str) -> None:
    """Append a copy of the run's last record of ``kind`` whose link names a
    predecessor the journal does not hold (a record replaced): the chain breaks there."""
    record: Any = [r for _, r in await run.journal() if isinstance(r, kind)][-1]
    forged = msgspec.structs.replace(record, prev=1, prev_hash="0123456789abcdef")
    last = await engine.store.last_in_journal(run.eid)
    assert last is not None
    await engine.store.append(
        run.eid, kind_of(forged), encode_record(forged), fence=last.seq, msg_id=msg_id
    )


def assert_http_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """The HTTP API's one error shape (``{"error": {"code", "message", "request_id"}}``,
    ``X-Request-ID`` the same as the body's); returns the ``error`` object."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert (
        {"code", "message", "request_id"}
        <= set(error)
        <= {
            "code",
            "message",
            "request_id",
            "handler",
            "error_type",
        }
    ), body
    assert error["code"] == code, body
    assert error["message"]
    assert error["request_id"] == response.headers["x-request-id"], (body, response.headers)
    assert "Traceback" not in response.text
    return error
