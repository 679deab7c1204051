"""Durable waits: ``ctx.sleep``, ``ctx.wait_for`` and ``ctx.await_completion`` as the
journal sees them (``wait.started``, then ``wait.done`` once the actor resolved it)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import anyio

from fusee.actors.host import ActorHost
from fusee.actors.steps import DEFAULT_RETRY, at_compensations, execute
from fusee.errors import StepFailedError
from fusee.logs import get_logger
from fusee.runtime.completions import Completion, completion_token, completion_url
from fusee.runtime.history import Execute, Replayed, ReplayedCancel, ReplayedFailure, Replayer
from fusee.runtime.records import WaitDone, WaitStarted

__all__ = ("wait", "start_wait", "wait_completion", "completion")

log = get_logger()


async def wait(
    host: ActorHost, replayer: Replayer, name: str, kind: str, seconds: float | None, location: str
) -> WaitDone:
    """The end of the code's next wait (``sleep`` or ``signal``), journaled or awaited."""
    if at_compensations(replayer):
        await host.stop_workflow()
    decision = replayer.begin_wait(name, kind, location)
    if isinstance(decision, WaitDone):
        return decision
    pos, started = decision
    if started is None:
        until = host.clock() + seconds if seconds is not None else None
        started = await start_wait(host, pos, name, kind, until)
    return await host.wait_out(started)


async def start_wait(
    host: ActorHost, pos: int, name: str, kind: str, until: float | None
) -> WaitStarted:
    """Journal ``wait.started`` at ``pos``; returns the record as journaled."""
    await host.commit(WaitStarted(pos=pos, name=name, wait=kind, until=until))
    log.info("wait.started", pos=pos, wait=kind, name=name)
    await host.maybe_evict()
    return host.history.waits[pos]


async def wait_completion(
    host: ActorHost,
    replayer: Replayer,
    name: str,
    ask: Callable[[Completion], Any] | None,
    seconds: float | None,
    location: str,
) -> WaitDone:
    """The end of the completion wait ``name``; ``ask(cb)`` runs once, as the step
    ``ask/<name>`` at the position after the wait's."""
    ask_step = f"ask/{name}"
    try:
        decision = replayer.begin_wait(name, "completion", location)
    except ReplayedCancel:  # it lost a ctx.race: its ask step's position goes too
        if ask is not None:
            with suppress(ReplayedCancel):
                replayer.begin_step(ask_step, location)
        raise
    if isinstance(decision, WaitDone):
        if ask is not None:  # the ask step took the next position: replay it too
            replayer.begin_step(ask_step, location)
        return decision
    pos, started = decision
    # The ask step's position is taken with the wait's, before anything awaits:
    # a branch of ctx.all / ctx.race takes all its positions when it starts.
    asking: Replayed | ReplayedFailure | Execute | None = None
    if ask is not None:
        if at_compensations(replayer):
            await host.stop_workflow()
        asking = replayer.begin_step(ask_step, location)
    if started is None:
        until = host.clock() + seconds if seconds is not None else None
        started = await start_wait(host, pos, name, "completion", until)
    if isinstance(asking, ReplayedFailure):
        rec = asking.record
        raise StepFailedError(rec.name, rec.error_type, rec.message, rec.attempt)
    if ask is not None and isinstance(asking, Execute):
        cb = completion(host, replayer, pos, name)
        await execute(host, replayer, ask_step, _asker(ask, cb), asking, DEFAULT_RETRY, None, None)
    return await host.wait_out(started)


def completion(host: ActorHost, replayer: Replayer, pos: int, name: str) -> Completion:
    """The token and URL of the completion wait ``name`` at ``pos`` of this run."""
    store = host.store
    token = completion_token(
        store.completion_secret,
        host.namespace,
        host.run_id,
        replayer.history.started_seq,
        pos,
        name,
    )
    return Completion(token=token, url=completion_url(store.callback_base_url, token), name=name)


def _asker(ask: Callable[[Completion], Any], cb: Completion) -> Callable[[], Any]:
    """``ask(cb)`` as a step function: sync ones run in a thread, an awaitable they
    return is awaited, and the result is dropped (a chat client's reply need not encode)."""

    async def run_ask() -> None:
        if inspect.iscoroutinefunction(ask):
            result = await ask(cb)
        else:
            result = await anyio.to_thread.run_sync(ask, cb, abandon_on_cancel=True)
        if inspect.isawaitable(result):
            await result

    return run_ask
