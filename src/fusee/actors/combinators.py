"""``ctx.all`` and ``ctx.race``: each call a branch of its own task, their ends taken
in journal order (so a replay settles the same way whatever the timings), the losers
cancelled and each cancellation journaled (``call.cancelled``)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from fusee.actors.children import cancel_child
from fusee.actors.host import ActorHost
from fusee.actors.steps import BRANCH_STEPS, StepInfo
from fusee.errors import FuseeError
from fusee.logs import get_logger
from fusee.runtime.history import History, ReplayedCancel, Replayer
from fusee.runtime.records import CallCancelled
from fusee.runtime.settle import BranchState, Ended, Settle, positions
from fusee.runtime.settle import may_park as settle_may_park

__all__ = ("Branch", "combine", "took_position", "may_park", "in_branch")

log = get_logger()

_BRANCH: ContextVar[Branch | None] = ContextVar("fusee_branch", default=None)

_SEALED = (
    "{what}: a branch of ctx.all / ctx.race made a second call (at {location}). Each "
    "branch takes its position(s) in the journal when it starts, so a branch is one call (ctx.step, ctx.sleep, ctx.wait_for, ctx.await_completion, "
    "ctx.child, or a nested ctx.all / ctx.race); run a sequence of calls as a child "
    "workflow."
)


@dataclass(eq=False)
class Branch:
    """One call of a ``ctx.all`` / ``ctx.race``, run as a task of its own; what the
    settling decides on is its ``state`` (pure: ``runtime/settle.py``)."""

    state: BranchState
    ready: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    steps: set[StepInfo] = field(default_factory=set)  # its running step
    sealed: bool = False  # started, and took its position(s)
    done: bool = False
    won: bool = False
    lost: bool = False  # cancelled by the combinator: journaled as call.cancelled
    value: Any = None
    error: Exception | None = None
    escape: BaseException | None = None  # Parked, Evicted, Fenced...
    replayed_cancel: ReplayedCancel | None = None

    @property
    def index(self) -> int:
        return self.state.index

    @property
    def positions(self) -> list[tuple[int, str, str]]:
        return self.state.positions


async def combine(
    host: ActorHost,
    replayer: Replayer,
    aws: Iterable[Awaitable[Any]],
    *,
    race: bool,
    return_exceptions: bool,
    location: str,
) -> list[Branch]:
    """Run ``aws`` as the branches of a ``ctx.race`` (``race``) or ``ctx.all``; the
    branches, settled. Raises what the combinator raises: the deciding branch's error,
    or what makes the whole run leave (parked, evicted, fenced, replayed cancel)."""
    what = "ctx.race" if race else "ctx.all"
    calls = list(aws)
    bad = [a for a in calls if not inspect.isawaitable(a)]
    if bad or (race and not calls) or _sealed(_BRANCH.get()):
        _close(calls)
        if bad:
            raise FuseeError(f"{what}: {bad[0]!r} is not awaitable (at {location})")
        if not calls:
            raise FuseeError(f"{what} needs at least one call (at {location})")
        raise FuseeError(_SEALED.format(what=what, location=location))
    parent = _BRANCH.get()
    states: list[BranchState] = []
    for i in range(len(calls)):
        states.append(BranchState(i, states, parent.state if parent is not None else None))
    branches = [Branch(state) for state in states]
    if parent is not None:
        parent.state.inner = states
    if not calls:
        return branches
    send, receive = anyio.create_memory_object_stream[int](len(calls))
    decided: Branch | None = None
    commits = host.commits
    host.combinators += 1
    try:
        async with anyio.create_task_group() as tg:
            started = 0
            try:
                for b, call in zip(branches, calls, strict=True):
                    tg.start_soon(_run_branch, b, call, send)
                    started += 1
                    await b.ready.wait()  # it took its position(s): the next one may
                    b.sealed = True
            finally:
                _close(calls[started:])
            if parent is not None:
                parent.ready.set()
            settle = Settle(
                replayer.history, states, race=race, return_exceptions=return_exceptions
            )
            while decided is None and not settle.over:
                b = branches[await receive.receive()]
                b.state.ended = _how(b)
                if (found := settle.ended(b.state)) is not None:
                    decided = branches[found.index]
            if decided is not None and race and decided.escape is None:
                decided.won = decided.replayed_cancel is None
            for b in branches:
                if not b.done:
                    b.lost = True
                    for step in list(b.steps):
                        step.stop()  # told first (s.signal), so its cleanup knows why
                    b.scope.cancel()
    finally:
        host.combinators -= 1
        receive.close()
        send.close()
    if decided is not None and decided.escape is not None:
        raise decided.escape  # parked, evicted, fenced: the whole run leaves
    if decided is not None and decided.replayed_cancel is not None:
        raise decided.replayed_cancel  # this combinator lost an enclosing race
    by = "?" if decided is None else _label(decided)
    reason = f"lost {what} to {by}" if race else f"{what} failed fast: {by} failed"
    for b in branches:
        if b.lost:
            await _journal_cancelled(host, replayer.history, b, reason)
    if host.commits != commits:  # always_replay mode waits for the combinator's end
        await host.maybe_evict()
    if decided is not None and decided.error is not None and not race:
        raise decided.error
    if race and decided is not None and decided.error is not None:
        raise decided.error
    return branches


def _how(branch: Branch) -> Ended:
    if branch.escape is not None:
        return Ended.LEFT
    if branch.replayed_cancel is not None:
        return Ended.CANCELLED
    return Ended.ERROR if branch.error is not None else Ended.VALUE


async def _journal_cancelled(
    host: ActorHost, history: History, branch: Branch, reason: str
) -> None:
    for pos, call, name in positions(branch.state):
        if pos not in history.ends:
            await host.commit(CallCancelled(pos=pos, name=name, call=call, reason=reason))
            log.info("call.cancelled", pos=pos, call=call, name=name, reason=reason)
            if call == "child":  # a losing child run is stopped, not left running
                await cancel_child(host.store, host.partitions, host.run_id, name, reason)


def _sealed(branch: Branch | None) -> bool:
    return branch is not None and branch.sealed


def _label(branch: Branch) -> str:
    """The branch as a reason names it: its (first) call, else its place in the list."""
    found = positions(branch.state)
    if not found:
        return f"branch {branch.index + 1}"
    _, call, name = found[0]
    return repr(name) if call == "step" else f"{call} {name!r}"


def took_position(pos: int, call: str, name: str) -> None:
    """Told by the Replayer as each position is handed out."""
    branch = _BRANCH.get()
    if branch is None:
        return
    # One call per branch, or a replay (where nothing suspends) would hand out other
    # positions than the first run; await_completion's ask step comes with its wait.
    asks = bool(branch.positions) and branch.positions[-1] == (pos - 1, "completion", name[4:])
    if branch.sealed or (branch.positions and not (call == "step" and asks)):
        raise FuseeError(_SEALED.format(what=f"{call} {name!r}", location=f"position {pos}"))
    branch.positions.append((pos, call, name))
    branch.ready.set()


def in_branch() -> bool:
    """Whether the task calling is a branch of ``ctx.all`` / ``ctx.race``."""
    return _BRANCH.get() is not None


def may_park(*, idle: bool = True) -> bool:
    """Whether a wait that found nothing may park the run: outside ``ctx.all`` /
    ``ctx.race`` always; inside, only once every other branch waits too (a branch
    running a step keeps the run in memory, so the wait still sees what arrives).
    ``idle=False`` says the current branch is busy again."""
    branch = _BRANCH.get()
    return settle_may_park(branch.state if branch is not None else None, idle=idle)


async def _run_branch(branch: Branch, call: Awaitable[Any], send: Any) -> None:
    _BRANCH.set(branch)
    BRANCH_STEPS.set(branch.steps)
    try:
        with branch.scope:
            try:
                branch.value = await call
            except ReplayedCancel as exc:
                branch.replayed_cancel = exc
            except Exception as exc:  # noqa: BLE001 - handed to the combinator
                branch.error = exc
            except anyio.get_cancelled_exc_class():
                raise
            except BaseException as exc:  # noqa: BLE001 - Parked, Evicted...: re-raised
                branch.escape = exc
    finally:
        branch.done = True
        branch.ready.set()
        send.send_nowait(branch.index)


def _close(calls: list[Awaitable[Any]]) -> None:
    for call in calls:
        if inspect.iscoroutine(call):
            call.close()  # never started: no "never awaited" warning
