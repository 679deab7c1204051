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
from fusee.actors.steps import BRANCH_STEPS
from fusee.errors import FuseeError
from fusee.logs import get_logger
from fusee.runtime.history import History, ReplayedCancel, Replayer
from fusee.runtime.records import CallCancelled

__all__ = ("Branch", "combine", "took_position", "may_park")

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
    """One call of a ``ctx.all`` / ``ctx.race``, run as a task of its own."""

    index: int
    siblings: list[Branch]
    parent: Branch | None  # the branch the combinator itself runs in, if nested
    ready: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    positions: list[tuple[int, str, str]] = field(default_factory=list)  # pos, call, name
    steps: set[anyio.Event] = field(default_factory=set)  # its running step's s.signal
    inner: list[Branch] | None = None  # the branches of a combinator nested in it
    sealed: bool = False  # started, and took its position(s)
    idle: bool = False  # waiting, and would park the run
    done: bool = False
    taken: bool = False  # its end was taken, in journal order
    won: bool = False
    lost: bool = False  # cancelled by the combinator: journaled as call.cancelled
    value: Any = None
    error: Exception | None = None
    escape: BaseException | None = None  # Parked, Evicted, Fenced...
    replayed_cancel: ReplayedCancel | None = None

    def is_idle(self) -> bool:
        if self.done or self.idle:
            return True
        return self.inner is not None and all(b.is_idle() for b in self.inner)


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
    branches: list[Branch] = []
    for i in range(len(calls)):
        branches.append(Branch(i, branches, parent))
    if parent is not None:
        parent.inner = branches
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
            decided = await _settle(replayer.history, branches, receive, race, return_exceptions)
            for b in branches:
                if not b.done:
                    b.lost = True
                    for signal in list(b.steps):
                        signal.set()  # told first, so its cleanup knows why
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


async def _settle(
    history: History,
    branches: list[Branch],
    receive: anyio.abc.ObjectReceiveStream[int],
    race: bool,
    return_exceptions: bool,
) -> Branch | None:
    """Take the branches' ends in journal order (not in the order they come: on
    replay every journaled branch ends at once): the branch that decides, or None
    when all ended without one deciding."""
    finished: list[Branch] = []
    left = len(branches)
    while left:
        finished.append(branches[await receive.receive()])
        while True:
            for b in finished:
                if b.escape is not None:
                    return b
            todo = [b for b in finished if not b.taken]
            if not todo:
                break
            first = min(todo, key=lambda b: _end_seq(history, b))
            seq = _end_seq(history, first)
            if any(
                b not in finished and (j := _journaled_end(history, b)) is not None and j < seq
                for b in branches
            ):
                break  # a branch that ended earlier in the journal is still replaying
            first.taken = True
            left -= 1
            if first.replayed_cancel is not None:
                return first  # the journal says this whole combinator was cancelled
            if race:
                first.won = True
                return first
            if first.error is not None and not return_exceptions:
                return first
    return None


async def _journal_cancelled(
    host: ActorHost, history: History, branch: Branch, reason: str
) -> None:
    for pos, call, name in _positions(branch):
        if pos not in history.ends:
            await host.commit(CallCancelled(pos=pos, name=name, call=call, reason=reason))
            log.info("call.cancelled", pos=pos, call=call, name=name, reason=reason)
            if call == "child":  # a losing child run is stopped, not left running
                await cancel_child(host.store, host.partitions, host.run_id, name, reason)


def _sealed(branch: Branch | None) -> bool:
    return branch is not None and branch.sealed


def _label(branch: Branch) -> str:
    """The branch as a reason names it: its (first) call, else its place in the list."""
    found = _positions(branch)
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


def may_park(*, idle: bool = True) -> bool:
    """Whether a wait that found nothing may park the run: outside ``ctx.all`` /
    ``ctx.race`` always; inside, only once every other branch waits too (a branch
    running a step keeps the run in memory, so the wait still sees what arrives).
    ``idle=False`` says the current branch is busy again."""
    branch = _BRANCH.get()
    if branch is None:
        return True
    branch.idle = idle
    b: Branch | None = branch
    while idle and b is not None:
        if not all(s.is_idle() for s in b.siblings if s is not b):
            return False
        b = b.parent
    return idle


def _positions(branch: Branch) -> list[tuple[int, str, str]]:
    found = list(branch.positions)
    for b in branch.inner or ():
        found.extend(_positions(b))
    return found


def _journaled_end(history: History, branch: Branch) -> int | None:
    """The journal sequence of the record that ended the branch (its last end, not
    counting cancellations), if the journal holds one."""
    ends = [
        history.ends[p]
        for p, _, _ in _positions(branch)
        if p in history.ends and p not in history.cancelled
    ]
    if branch.positions and all(p in history.cancelled for p, _, _ in branch.positions):
        return min(history.ends[p] for p, _, _ in branch.positions)
    return max(ends) if ends else None


def _end_seq(history: History, branch: Branch) -> int:
    # A branch that ended with nothing journaled ended before it awaited anything (a
    # wrong argument): first, on replay too.
    seq = _journaled_end(history, branch)
    return 0 if seq is None else seq


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
