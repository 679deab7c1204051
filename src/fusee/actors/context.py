"""``ctx``: what a workflow's code calls. Every call is matched against the journal."""

from __future__ import annotations

import hashlib
import inspect
import secrets
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, overload
from uuid import UUID

import anyio
import msgspec
import structlog

from fusee.actors.children import cancel_child, start_child
from fusee.errors import (
    Evicted,
    FatalError,
    FuseeError,
    NotEncodable,
    RunCancelled,
    RunFailed,
    StepError,
    StepTimeout,
    Timeout,
)
from fusee.logs import get_logger
from fusee.runtime.codec import (
    MAX_LARGE_VALUE,
    canonical,
    check_size,
    decode_value,
    encode_value,
)
from fusee.runtime.completions import Completion, completion_token, completion_url
from fusee.runtime.durations import format_duration, parse_duration
from fusee.runtime.history import (
    Execute,
    History,
    Replayed,
    ReplayedCancel,
    ReplayedFailure,
    Replayer,
)
from fusee.runtime.ids import validate_id, validate_name
from fusee.runtime.objects import ReadOnlyState, check_run_id
from fusee.runtime.records import (
    CallCancelled,
    ObjectStarted,
    StepCompleted,
    StepFailed,
    StepRetrying,
    WaitDone,
    WaitStarted,
)
from fusee.runtime.retry import Retry

if TYPE_CHECKING:
    from fusee.actors.registry import Workflow
    from fusee.actors.run_actor import RunActor

__all__ = (
    "Context",
    "ContinueAsNew",
    "StepInfo",
    "StepFailedError",
    "DEFAULT_RETRY",
    "error_type_name",
    "error_message",
)

T = TypeVar("T")
log = get_logger()

DEFAULT_RETRY = Retry()
COMPENSATE = "compensate:"  # the step name of a compensation is this prefix + its name


class ContinueAsNew(BaseException):
    """Raised by ``ctx.continue_as_new``: the run actor ends the generation with
    ``run.continued`` carrying ``data`` (the next generation's input, canonical JSON)."""

    def __init__(self, data: bytes) -> None:
        super().__init__("continue as new")
        self.data = data


@dataclass(frozen=True)
class _Compensation:
    step: str  # COMPENSATE + the name given to ctx.compensate
    fn: Callable[..., Any]
    retry: Retry | None
    timeout: float | None


@dataclass(eq=False)
class StepInfo:
    """``s``, the argument a step function may take.

    Attributes:
        key: stable across attempts and crashes: pass it as the idempotency key of
            calls that change the world.
        attempt: 1 for the first attempt, counting the failed attempts journaled before.
        signal: set when the step should stop (its timeout passed, the run was
            cancelled, its worker is giving it up).
        name: the step's name.
    """

    key: str
    attempt: int
    name: str
    signal: anyio.Event = field(default_factory=anyio.Event)


class StepFailedError(FuseeError):
    """A step failed for good; raised in the workflow where it awaited the step.

    ``error_type`` and ``message`` are those of the error the step's last attempt
    raised; ``__cause__`` is a :class:`fusee.errors.StepError` holding them, the same
    when the failure is replayed from the journal as when it happened. Uncaught, it
    fails the run with that error.
    """

    def __init__(self, step: str, error_type: str, message: str, attempts: int) -> None:
        super().__init__(
            f"step {step!r} failed after {attempts} attempt(s): {error_type}: {message}"
        )
        self.step = step
        self.error_type = error_type
        self.message = message
        self.attempts = attempts
        # rebuilt from what the journal keeps, live too: user code sees one shape
        self.__cause__ = StepError(error_type, message)


def error_type_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ in ("builtins", "__main__"):
        return cls.__qualname__
    if cls.__module__.startswith("fusee."):
        return f"fusee.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


MAX_MESSAGE = 8 * 1024  # bytes of an error's message kept in the journal


def error_message(exc: BaseException) -> str:
    """The error's message as journaled: ``str(exc)`` (its repr when empty), cut to
    ``MAX_MESSAGE`` bytes, so an error that quotes a whole response still fits a record."""
    message = str(exc) or repr(exc)
    raw = message.encode("utf-8", "replace")
    if len(raw) <= MAX_MESSAGE:
        return message
    kept = raw[:MAX_MESSAGE].decode("utf-8", "ignore")
    return f"{kept}... (cut: {len(raw):,} bytes in all)"


def _caller_location(depth: int = 2) -> str:
    frame = sys._getframe(depth)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


_TAKES_INFO: dict[object, bool] = {}


def _takes_step_info(fn: Callable[..., Any]) -> bool:
    # Lambdas made in a loop share one code object: inspect each shape once.
    code = getattr(fn, "__code__", None)
    if code is not None and getattr(fn, "__defaults__", None) is None:
        known = _TAKES_INFO.get(code)
        if known is None:
            known = _TAKES_INFO[code] = _inspect_takes_step_info(fn)
        return known
    return _inspect_takes_step_info(fn)


def _inspect_takes_step_info(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(positional) >= 1 or any(p.kind is p.VAR_POSITIONAL for p in params)


class Context:
    """The workflow's handle on its run: steps, waits (sleeps, signals, completions),
    children, combinators, compensations and journaled time and randomness.

    Attributes:
        run_id: the run's ID, as given to ``start``.
        workflow: the workflow's name.
    """

    def __init__(self, actor: RunActor, replayer: Replayer) -> None:
        self._actor = actor
        self._replayer = replayer
        replayer.on_position = _took_position  # ctx.all / ctx.race track their branches
        self.run_id = actor.run_id
        started = replayer.history.started
        assert started is not None
        self.workflow = started.workflow
        self._compensations: list[_Compensation] = []  # ctx.compensate, oldest first
        # object handlers: the object's type and key, and the state view (ObjectActor)
        self.object_type: str | None = None
        self.key: str | None = None
        self._state: ReadOnlyState | None = None

    @property
    def state(self) -> ReadOnlyState:
        """An object handler's state: ``get(name)``, ``set(name, value)``, ``delete``,
        ``clear``, ``keys``. Changes apply when the exclusive handler returns, all at
        once, and not at all when it fails.

        Raises:
            FuseeError: this is a run, not an object handler.
        """
        if self._state is None:
            raise FuseeError(
                f"ctx.state in run {self.run_id!r}: state belongs to keyed objects "
                f"(fusee.object); a run keeps its data in its steps' results"
            )
        return self._state

    async def sleep(self, duration: str | float | timedelta, *, name: str = "sleep") -> None:
        """Wait ``duration``, durably: the run leaves memory while it sleeps and a timer
        (a JetStream message schedule) wakes it on any worker, also after restarts.

        Example:
            ``await ctx.sleep("1h")``
        """
        location = _caller_location()
        seconds = parse_duration(duration, "the duration of ctx.sleep")
        await self._wait(validate_name(name, "sleep name"), "sleep", seconds, location)

    async def wait_for(
        self,
        name: str,
        *,
        timeout: str | float | timedelta | None = None,
        type: Any = None,  # noqa: A002 - reads well at the call site
    ) -> Any:
        """Wait for the signal ``name`` (``engine.run(id).signal(name, payload)``) and
        return its payload. Signals sent before the wait are kept, in order: each wait
        takes the oldest one of its name not taken yet.

        Raises:
            Timeout: ``timeout`` passed first.

        Example:
            ``approval = await ctx.wait_for("approval", timeout="1d")``
        """
        location = _caller_location()
        name = validate_name(name, "signal name")
        seconds = (
            parse_duration(timeout, "timeout of ctx.wait_for") if timeout is not None else None
        )
        done = await self._wait(name, "signal", seconds, location)
        if done.timed_out:
            assert seconds is not None
            raise Timeout(f"no signal {name!r} within {format_duration(seconds)}")
        return decode_value(bytes(done.value), type)

    async def await_completion(
        self,
        name: str,
        *,
        ask: Callable[[Completion], Any] | None = None,
        timeout: str | float | timedelta | None = None,
        type: Any = None,  # noqa: A002 - reads well at the call site
    ) -> Any:
        """Wait for a completion (human approval by callback URL) and return its value.

        The wait gets an unguessable token and URL (``cb.token``, ``cb.url``); ``ask(cb)``
        runs once as a durable step (sync or async, its result is ignored) to put the URL
        in front of someone. ``engine.complete(cb.token, value)`` (later the HTTP API at
        ``cb.url``) completes it; the first completion wins, ``{"approved": False, ...}``
        is a value like any other.

        Raises:
            Timeout: ``timeout`` passed first.

        Example:
            ``ok = await ctx.await_completion("refund-ok", ask=lambda cb: slack.post(cb.url))``
        """
        location = _caller_location()
        name = validate_name(name, "completion name")
        if ask is not None and not callable(ask):
            raise FuseeError(f"completion {name!r}: ask={ask!r} is not callable (at {location})")
        seconds = (
            parse_duration(timeout, "timeout of ctx.await_completion")
            if timeout is not None
            else None
        )
        ask_step = f"ask/{name}"
        try:
            decision = self._replayer.begin_wait(name, "completion", location)
        except ReplayedCancel:  # it lost a ctx.race: its ask step's position goes too
            if ask is not None:
                with suppress(ReplayedCancel):
                    self._replayer.begin_step(ask_step, location)
            raise
        if isinstance(decision, WaitDone):
            done = decision
            if ask is not None:  # the ask step took the next position: replay it too
                self._replayer.begin_step(ask_step, location)
        else:
            pos, started = decision
            actor = self._actor
            # The ask step's position is taken with the wait's, before anything awaits:
            # a branch of ctx.all / ctx.race takes all its positions when it starts.
            asking: Replayed | ReplayedFailure | Execute | None = None
            if ask is not None:
                if self._at_compensations():
                    await self._actor.stop_workflow()
                asking = self._replayer.begin_step(ask_step, location)
            if started is None:
                until = actor.clock() + seconds if seconds is not None else None
                started = await self._start_wait(pos, name, "completion", until)
            if isinstance(asking, ReplayedFailure):
                rec = asking.record
                raise StepFailedError(rec.name, rec.error_type, rec.message, rec.attempt)
            if ask is not None and isinstance(asking, Execute):
                cb = self._completion(pos, name)
                await self._execute(ask_step, _asker(ask, cb), asking, DEFAULT_RETRY, None, None)
            done = await actor.wait_out(started)
        if done.timed_out:
            assert seconds is not None
            raise Timeout(f"no completion {name!r} within {format_duration(seconds)}")
        return decode_value(bytes(done.value), type)

    def _completion(self, pos: int, name: str) -> Completion:
        """The token and URL of the completion wait ``name`` at ``pos`` of this run."""
        store = self._actor.store
        token = completion_token(
            store.completion_secret,
            self._actor.namespace,
            self.run_id,
            self._replayer.history.started_seq,
            pos,
            name,
        )
        return Completion(
            token=token, url=completion_url(store.callback_base_url, token), name=name
        )

    async def child(
        self,
        workflow: Workflow[Any] | str,
        child_id: str,
        arg: Any = None,
        *,
        timeout: str | float | timedelta | None = None,
        type: Any = None,  # noqa: A002 - reads well at the call site
    ) -> Any:
        """Run ``workflow`` as the child run ``child_id`` with input ``arg``, and return
        its result. The child starts once (its ID is the key: a replay, or the parent
        resumed on another worker, attaches to it) and runs like any run, on any worker;
        the parent holds no process while it waits. Cancelling the parent, or its
        timeout, cancels the child; the child's timeout is ``timeout`` or what is left
        of the parent's, whichever is shorter.

        Raises:
            RunFailed: the child failed (``error_type`` and ``message`` are its own).
            RunCancelled: the child was cancelled or timed out.
            RunExists: a run with this ID exists with another workflow or input, or not
                as a child of this run.

        Example:
            ``part = await ctx.child(writer, f"{ctx.run_id}/part-{i}", p)``
        """
        location = _caller_location()
        if self._at_compensations():
            await self._actor.stop_workflow()
        name = workflow if isinstance(workflow, str) else getattr(workflow, "name", None)
        if not isinstance(name, str):
            raise FuseeError(f"ctx.child: {workflow!r} is not a workflow (at {location})")
        name = validate_name(name, "workflow name")
        child_id = check_run_id(validate_id(child_id, "child run ID"), "child run ID")
        if child_id == self.run_id:
            raise FuseeError(f"ctx.child: a run cannot be its own child (at {location})")
        seconds = parse_duration(timeout, "timeout of ctx.child") if timeout is not None else None
        data = canonical(
            arg, f"the input of child run {child_id!r}", limit=self._actor.store.max_value
        )
        decision = self._replayer.begin_wait(child_id, "child", location)
        if isinstance(decision, WaitDone):
            done = decision
        else:
            pos, started = decision
            actor = self._actor
            if started is None:
                # A parent with a timeout sets a timer just past it: parked, it must wake
                # to end (cancelled by its timeout, which cancels the child too).
                top = actor.history.started
                assert top is not None
                until = top.started_at + top.timeout + 0.05 if top.timeout is not None else None
                started = await self._start_wait(pos, child_id, "child", until)
            if actor.partitions is None:
                raise FuseeError("ctx.child needs a worker that knows the namespace's partitions")
            # After wait.started: a parent that dies in between starts it again, which
            # attaches (create-if-absent), as does every later activation of this wait.
            now = actor.clock()
            parent = actor.history.started
            assert parent is not None
            if parent.timeout is not None:
                left = max(0.05, parent.started_at + parent.timeout - now)
                seconds = left if seconds is None else min(seconds, left)
            # not begun in a cancelled scope (a cancelled run replayed to its
            # compensations), and not cut short once begun: start and marker go together
            await anyio.lowlevel.checkpoint_if_cancelled()
            with anyio.CancelScope(shield=True):
                await start_child(
                    actor.store,
                    actor.partitions,
                    parent=self.run_id,
                    workflow=name,
                    child_id=child_id,
                    data=data,
                    timeout=seconds,
                    now=now,
                )
            done = await actor.wait_out(started)
        if done.timed_out:  # the parent's timeout passed (its scope is cancelled too)
            raise RunCancelled(child_id, "timeout: the parent's timeout passed")
        end = msgspec.json.decode(bytes(done.value))
        status = end.get("status")
        if status == "completed":
            return decode_value(msgspec.json.encode(end.get("result")), type)
        if status == "cancelled":
            raise RunCancelled(child_id, str(end.get("reason") or "cancelled"))
        raise RunFailed(child_id, str(end.get("error_type")), str(end.get("message")))

    async def _wait(self, name: str, wait: str, seconds: float | None, location: str) -> WaitDone:
        if self._at_compensations():
            await self._actor.stop_workflow()
        decision = self._replayer.begin_wait(name, wait, location)
        if isinstance(decision, WaitDone):
            return decision
        pos, started = decision
        actor = self._actor
        if started is None:
            until = actor.clock() + seconds if seconds is not None else None
            started = await self._start_wait(pos, name, wait, until)
        return await actor.wait_out(started)

    async def _start_wait(self, pos: int, name: str, wait: str, until: float | None) -> WaitStarted:
        """Journal ``wait.started`` at ``pos``; returns the record as journaled."""
        actor = self._actor
        await actor.commit(WaitStarted(pos=pos, name=name, wait=wait, until=until))
        log.info("wait.started", pos=pos, wait=wait, name=name)
        await actor.maybe_evict()
        return actor.history.waits[pos]

    def compensate(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        retry: Retry | None = None,
        timeout: str | float | timedelta | None = None,
    ) -> None:
        """Register an undo: if the run fails or is cancelled (also by its timeout), the
        registered compensations run newest first, each as a durable step named
        ``compensate:<name>`` with its own ``retry`` and per-attempt ``timeout``, before
        the run ends. A completed run runs none. Registering journals nothing: the code
        registers the same compensations again when it is replayed.

        ``fn`` is a step function (sync or async, taking no argument or a
        :class:`StepInfo`); it must not call ``ctx``.

        Example:
            ``ctx.compensate("tool:cancel-booking", lambda: hotels.cancel(booking.id))``
        """
        location = _caller_location()
        name = validate_name(name, "compensation name")
        if not callable(fn):
            raise FuseeError(f"compensation {name!r}: {fn!r} is not callable (at {location})")
        limit = (
            parse_duration(timeout, f"timeout of compensation {name!r}")
            if timeout is not None
            else None
        )
        step = validate_name(COMPENSATE + name, "compensation step name")
        self._compensations.append(_Compensation(step, fn, retry, limit))

    async def _compensate(self) -> list[StepFailedError]:
        """Run the registered compensations, newest first, each as a step at the next
        position (a journaled one is replayed, not run again). One that fails for good
        does not stop the others; the failures are returned.

        Raises:
            DeterminismError: the journal holds another step at a compensation's position.
        """
        failed: list[StepFailedError] = []
        history, pos = self._replayer.history, self._replayer.next_pos
        if self._compensations and pos not in history.outcomes and pos not in history.retries:
            log.info("run.compensating", compensations=len(self._compensations))
        while self._compensations:
            comp = self._compensations.pop()
            location = f"ctx.compensate({comp.step[len(COMPENSATE) :]!r})"
            decision = self._replayer.begin_step(comp.step, location)
            if isinstance(decision, Replayed):
                continue
            if isinstance(decision, ReplayedFailure):
                rec = decision.record
                failed.append(StepFailedError(rec.name, rec.error_type, rec.message, rec.attempt))
                continue
            policy = comp.retry if comp.retry is not None else DEFAULT_RETRY
            try:
                await self._execute(comp.step, comp.fn, decision, policy, comp.timeout, None)
            except StepFailedError as exc:
                failed.append(exc)
        return failed

    def _at_compensations(self) -> bool:
        """Whether the journal holds a compensation at the code's next position: the
        workflow was stopped there (cancelled), so a replay must stop there too."""
        history = self._replayer.history
        pos = self._replayer.next_pos
        outcome = history.outcomes.get(pos)
        retries = history.retries.get(pos)
        name = outcome.name if outcome is not None else (retries[0].name if retries else None)
        return name is not None and name.startswith(COMPENSATE)

    def journal_size(self) -> int:
        """How many records the run's current generation holds (from its ``run.started``
        or ``run.continued`` on, itself included): what a replay reads and folds. Use it
        to decide when to ``continue_as_new``. A replay returns what the run had journaled
        when its code was at the same place, so the decision replays the same."""
        history, reached = self._replayer.history, self._replayer.next_pos
        if any(pos >= reached for pos in history.size_at):  # replaying: the journal is ahead
            return max((n for pos, n in history.size_at.items() if pos < reached), default=1)
        return history.generation_size

    def continue_as_new(self, arg: Any = None) -> NoReturn:
        """End this generation of the run and start its next one, under the same run ID,
        with input ``arg``: the journal gets one ``run.continued`` record and the workflow
        starts again from the top with a fresh, short history (steps get new ``s.key``s).
        ``engine.run(id).result()`` waits for the last generation's end. Compensations
        registered so far are dropped, as on success; signals not taken yet stay in the
        run's inbox for the next generation.

        Raises ``ContinueAsNew`` (a ``BaseException``, so ``except Exception`` does not
        catch it): write ``return ctx.continue_as_new(...)`` in the workflow itself.

        Example:
            ``if ctx.journal_size() > 1000: return ctx.continue_as_new({"summary": summary})``
        """
        location = _caller_location()
        step = _IN_STEP.get()
        if step is not None:
            raise FatalError(
                f"ctx.continue_as_new() was called inside step {step!r} (at {location}): "
                f"call it in the workflow"
            )
        raise ContinueAsNew(
            canonical(
                arg,
                f"the input of the next generation of {self.run_id!r}",
                limit=self._actor.store.max_value,
            )
        )

    def now(self) -> datetime:
        """The current time as a timezone-aware UTC datetime, journaled: a replay of the
        run returns the same time (the worker's clock when the run first got here).

        Example:
            ``deadline = ctx.now() + timedelta(days=1)``
        """
        clock = self._actor.clock
        seconds = self._take("now", lambda: round(clock(), 6))  # what a datetime holds
        return datetime.fromtimestamp(float(seconds), UTC)

    def random(self) -> float:
        """A random float in [0, 1) (53 random bits from ``secrets``), journaled: a
        replay returns the same number."""
        return float(self._take("random", _fresh_random))

    def uuid(self) -> UUID:
        """A random UUID (version 4, from ``secrets``), journaled: a replay returns the
        same one."""
        return UUID(str(self._take("uuid", _fresh_uuid)))

    def _take(self, kind: str, make: Callable[[], float | str]) -> float | str:
        # Plain calls, no await: a fresh value waits in History.pending and rides on the
        # actor's next commit. Anything durable the workflow does with it goes through
        # that commit or a later one, so a value lost in a crash was never acted upon.
        location = _caller_location(3)
        step = _IN_STEP.get()
        if step is not None:
            raise FatalError(
                f"ctx.{kind}() was called inside step {step!r} (at {location}). A step's "
                f"function is not replayed, so it cannot take journaled values: call "
                f"ctx.{kind}() in the workflow and pass the value to the step."
            )
        return self._replayer.take_value(kind, make, location)

    @overload
    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        retry: Retry | None = ...,
        timeout: str | float | timedelta | None = ...,
        type: None = ...,
    ) -> Any: ...

    @overload
    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        retry: Retry | None = ...,
        timeout: str | float | timedelta | None = ...,
        type: type[T],
    ) -> T: ...

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        retry: Retry | None = None,
        timeout: str | float | timedelta | None = None,
        type: Any = None,  # noqa: A002 - reads well at the call site
    ) -> Any:
        """Run ``fn`` once, durably: its result is journaled and replayed, never re-run.

        ``fn`` may be sync or async and take no argument or one (:class:`StepInfo`).
        Its result must be JSON-encodable; the step returns it as a replay would
        (decoded from JSON, into ``type`` when given).

        Raises:
            StepFailedError: the step failed for good (a ``FatalError``, a
                ``non_retryable`` error, or its last attempt).
            DeterminismError: the journal holds another step at this position.
            FuseeError: ``fn`` is not callable, or ``name`` starts with ``compensate:``
                (kept for :meth:`compensate`).

        Example:
            ``plan = await ctx.step("plan", lambda: planner.complete(question))``
        """
        name = validate_name(name, "step name")
        location = _caller_location()
        if not callable(fn):
            raise FuseeError(f"step {name!r}: {fn!r} is not callable (at {location})")
        if name.startswith(COMPENSATE):
            raise FuseeError(
                f"step {name!r}: the prefix {COMPENSATE!r} is kept for compensations "
                f"(ctx.compensate) (at {location})"
            )
        policy = retry if retry is not None else DEFAULT_RETRY
        limit = (
            parse_duration(timeout, f"timeout of step {name!r}") if timeout is not None else None
        )
        if self._at_compensations():
            await self._actor.stop_workflow()
        decision = self._replayer.begin_step(name, location)
        if isinstance(decision, Replayed):
            if decision.ref is not None:  # stored out of line: read it back
                return decode_value(await self._actor.read_value(decision.ref), type)
            return decode_value(decision.result, type)
        if isinstance(decision, ReplayedFailure):
            rec = decision.record
            raise StepFailedError(rec.name, rec.error_type, rec.message, rec.attempt)
        return await self._execute(name, fn, decision, policy, limit, type)

    async def _execute(
        self,
        name: str,
        fn: Callable[..., Any],
        decision: Execute,
        policy: Retry,
        limit: float | None,
        type_: Any,
    ) -> Any:
        # A run that is being cancelled (its scope was cancelled before the workflow got
        # here, or it is replayed to find its compensations) runs nothing new.
        await anyio.lowlevel.checkpoint_if_cancelled()
        actor = self._actor
        if actor.history.pending_invocation is not None:
            # an object's invocation is journaled before its first step runs, so it
            # shows as running (and its start time survives a crash)
            await actor.commit(ObjectStarted())
        key = self._step_key(decision.pos)
        attempt = decision.attempt
        if decision.last_retry is not None:
            # resumed between attempts: wait out what is left of the journaled delay
            due = decision.last_retry.failed_at + decision.last_retry.retry_in
            await anyio.sleep(max(0.0, due - actor.clock()))
        takes_info = _takes_step_info(fn)
        with structlog.contextvars.bound_contextvars(step=name, pos=decision.pos):
            while True:
                info = StepInfo(key=key, attempt=attempt, name=name)
                log.debug("step.started", attempt=attempt)
                began = anyio.current_time()
                actor.running_steps.add(info)  # a cancel of the run sets its signal
                branch = _BRANCH.get()
                if branch is not None:
                    branch.steps.add(info)  # a race it loses sets its signal
                try:
                    try:
                        with _inside_step(name):
                            value = await self._call(fn, info, takes_info, limit)
                        data = check_size(
                            encode_value(value, f"the result of step {name!r}"),
                            f"the result of step {name!r}",
                            MAX_LARGE_VALUE,
                            of="a step's result (one over "
                            f"{actor.store.max_value:,} bytes is stored out of line)",
                        )
                    finally:
                        actor.running_steps.discard(info)
                        if branch is not None:
                            branch.steps.discard(info)
                except (Evicted, anyio.get_cancelled_exc_class()):
                    info.signal.set()
                    raise
                except Exception as exc:  # noqa: BLE001 - journaled, raised as StepFailedError
                    elapsed = anyio.current_time() - began
                    final = (
                        isinstance(exc, FatalError | NotEncodable)
                        or policy.gives_up_on(exc)
                        or attempt >= policy.attempts
                    )
                    etype, message = error_type_name(exc), error_message(exc)
                    if final:
                        failure = await self._fail_step(
                            decision.pos, name, attempt, etype, message, elapsed
                        )
                        break  # raised outside the handler: no live-only __context__
                    wait = policy.delay(attempt, key)
                    await actor.commit(
                        StepRetrying(
                            pos=decision.pos,
                            name=name,
                            attempt=attempt,
                            error_type=etype,
                            message=message,
                            retry_in=wait,
                            failed_at=actor.clock(),
                        )
                    )
                    log.info(
                        "step.retrying",
                        attempt=attempt,
                        error=f"{etype}: {message}",
                        retry_in=format_duration(wait),
                    )
                    await actor.maybe_evict()
                    await anyio.sleep(wait)
                    attempt += 1
                    continue
                elapsed_ms = round((anyio.current_time() - began) * 1000, 3)
                inline, ref = data, None
                if len(data) > actor.store.max_value:
                    # too large for a record: stored first, then the record naming it
                    inline, ref = b"null", await actor.store_value(data)
                try:
                    await actor.commit(
                        StepCompleted(
                            pos=decision.pos,
                            name=name,
                            result=_raw(inline),
                            attempt=attempt,
                            duration_ms=elapsed_ms,
                            result_ref=msgspec.UNSET if ref is None else ref,
                        )
                    )
                except NotEncodable as exc:  # the record as a whole is over the limit
                    failure = await self._fail_step(
                        decision.pos,
                        name,
                        attempt,
                        "fusee.NotEncodable",
                        f"the result of step {name!r} cannot be stored: {exc}",
                        elapsed_ms / 1000,
                    )
                    break
                log.info("step.completed", attempt=attempt, duration_ms=elapsed_ms)
                await actor.maybe_evict()
                return decode_value(data, type_)
        raise failure

    async def _fail_step(
        self, pos: int, name: str, attempt: int, etype: str, message: str, elapsed: float
    ) -> StepFailedError:
        """Journal the step's final failure; the error to raise in the workflow."""
        await self._actor.commit(
            StepFailed(pos=pos, name=name, attempt=attempt, error_type=etype, message=message)
        )
        log.warning(
            "step.failed",
            attempt=attempt,
            error=f"{etype}: {message}",
            duration_ms=round(elapsed * 1000, 2),
        )
        return StepFailedError(name, etype, message, attempt)

    async def _call(
        self, fn: Callable[..., Any], info: StepInfo, takes_info: bool, limit: float | None
    ) -> Any:
        if limit is None:  # no deadline: no cancel scope to pay for on every step
            return await self._invoke(fn, info, takes_info)
        with anyio.CancelScope(deadline=anyio.current_time() + limit):
            return await self._invoke(fn, info, takes_info)
        info.signal.set()
        raise StepTimeout(
            f"step {info.name!r} attempt {info.attempt} ran past its timeout of "
            f"{format_duration(limit)}"
        )

    async def _invoke(self, fn: Callable[..., Any], info: StepInfo, takes_info: bool) -> Any:
        if inspect.iscoroutinefunction(fn):
            result = fn(info) if takes_info else fn()
        else:
            # A plain function may block (a sync HTTP client): it runs in a thread,
            # and a coroutine it returns (a lambda around an async call) is awaited here.
            def call() -> Any:
                return fn(info) if takes_info else fn()

            result = await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def all(
        self, aws: Iterable[Awaitable[Any]], *, return_exceptions: bool = False
    ) -> list[Any]:
        """Run ``aws`` (calls of ``ctx.step``, ``ctx.sleep``, ``ctx.wait_for``,
        ``ctx.await_completion``, ``ctx.child``, or a nested ``ctx.all`` / ``ctx.race``)
        concurrently and return their results, in the order given.

        Fails fast: the first to fail (first in the journal) cancels the others (a
        running step's ``s.signal`` is set and its task cancelled; each cancellation is
        journaled, ``call.cancelled``) and its error is raised. With
        ``return_exceptions=True`` every call runs to its end and an error is returned
        in its place. A replay returns the same results and raises the same error.

        Pass the calls uncalled-for: each is started in list order, so each takes its
        position in the journal before the next starts. A branch makes one call (a
        sequence of calls belongs in a child workflow).

        Example:
            ``weather, flights = await ctx.all([ctx.step("tool:weather", w), ctx.step("tool:flights", f)])``
        """
        branches = await self._combine(aws, race=False, return_exceptions=return_exceptions)
        return [b.error if b.error is not None else b.value for b in branches]

    async def race(self, aws: Iterable[Awaitable[Any]]) -> Any:
        """Run ``aws`` concurrently (like :meth:`all`); the first to end wins: its
        result is returned, or its error raised. The others are cancelled: a running
        step's ``s.signal`` is set, then its task cancelled, and each cancellation is
        journaled (``call.cancelled``), so a replay picks the same winner, whatever the
        timings. "First" is first in the journal: a loser that ended too, just after
        the winner, keeps its (unused) end.

        Example:
            ``answer = await ctx.race([ctx.step("model:fast", fast), ctx.step("model:large", large)])``
            ``reply = await ctx.race([ctx.step("llm", ask), ctx.sleep("30s")])  # a timeout``
        """
        branches = await self._combine(aws, race=True, return_exceptions=False)
        winner = next(b for b in branches if b.won)
        return winner.value

    async def _combine(
        self, aws: Iterable[Awaitable[Any]], *, race: bool, return_exceptions: bool
    ) -> list[_Branch]:
        what = "ctx.race" if race else "ctx.all"
        location = _caller_location(3)
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
        branches: list[_Branch] = []
        for i in range(len(calls)):
            branches.append(_Branch(i, branches, parent))
        if parent is not None:
            parent.inner = branches
        if not calls:
            return branches
        actor = self._actor
        send, receive = anyio.create_memory_object_stream[int](len(calls))
        decided: _Branch | None = None
        commits = actor.commits
        actor.combinators += 1
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
                decided = await self._settle(branches, receive, race, return_exceptions)
                for b in branches:
                    if not b.done:
                        b.lost = True
                        for info in list(b.steps):
                            info.signal.set()  # told first, so its cleanup knows why
                        b.scope.cancel()
        finally:
            actor.combinators -= 1
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
                await self._journal_cancelled(b, reason)
        if actor.commits != commits:  # always_replay mode waits for the combinator's end
            await actor.maybe_evict()
        if decided is not None and decided.error is not None and not race:
            raise decided.error
        if race and decided is not None and decided.error is not None:
            raise decided.error
        return branches

    async def _settle(
        self,
        branches: list[_Branch],
        receive: anyio.abc.ObjectReceiveStream[int],
        race: bool,
        return_exceptions: bool,
    ) -> _Branch | None:
        """Take the branches' ends in journal order (not in the order they come: on
        replay every journaled branch ends at once): the branch that decides, or None
        when all ended without one deciding."""
        history = self._replayer.history
        finished: list[_Branch] = []
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

    async def _journal_cancelled(self, branch: _Branch, reason: str) -> None:
        history = self._replayer.history
        for pos, call, name in _positions(branch):
            if pos not in history.ends:
                await self._actor.commit(
                    CallCancelled(pos=pos, name=name, call=call, reason=reason)
                )
                log.info("call.cancelled", pos=pos, call=call, name=name, reason=reason)
                if call == "child":  # a losing child run is stopped, not left running
                    await cancel_child(
                        self._actor.store, self._actor.partitions, self.run_id, name, reason
                    )

    def _step_key(self, pos: int) -> str:
        history = self._replayer.history
        seed = f"{self._actor.namespace}\0{self.run_id}\0{history.started_seq}\0{pos}"
        return hashlib.blake2b(seed.encode(), digest_size=16).hexdigest()


# -- ctx.all / ctx.race ------------------------------------------------------------

_BRANCH: ContextVar[_Branch | None] = ContextVar("fusee_branch", default=None)

_SEALED = (
    "{what}: a branch of ctx.all / ctx.race made a second call (at {location}). Each "
    "branch takes its position(s) in the journal when it starts, so a branch is one call (ctx.step, ctx.sleep, ctx.wait_for, ctx.await_completion, "
    "ctx.child, or a nested ctx.all / ctx.race); run a sequence of calls as a child "
    "workflow."
)


@dataclass(eq=False)
class _Branch:
    """One call of a ``ctx.all`` / ``ctx.race``, run as a task of its own."""

    index: int
    siblings: list[_Branch]
    parent: _Branch | None  # the branch the combinator itself runs in, if nested
    ready: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    positions: list[tuple[int, str, str]] = field(default_factory=list)  # pos, call, name
    steps: set[StepInfo] = field(default_factory=set)  # its running step, for s.signal
    inner: list[_Branch] | None = None  # the branches of a combinator nested in it
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


def _sealed(branch: _Branch | None) -> bool:
    return branch is not None and branch.sealed


def _label(branch: _Branch) -> str:
    """The branch as a reason names it: its (first) call, else its place in the list."""
    found = _positions(branch)
    if not found:
        return f"branch {branch.index + 1}"
    _, call, name = found[0]
    return repr(name) if call == "step" else f"{call} {name!r}"


def _took_position(pos: int, call: str, name: str) -> None:
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
    b: _Branch | None = branch
    while idle and b is not None:
        if not all(s.is_idle() for s in b.siblings if s is not b):
            return False
        b = b.parent
    return idle


def _positions(branch: _Branch) -> list[tuple[int, str, str]]:
    found = list(branch.positions)
    for b in branch.inner or ():
        found.extend(_positions(b))
    return found


def _journaled_end(history: History, branch: _Branch) -> int | None:
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


def _end_seq(history: History, branch: _Branch) -> int:
    # A branch that ended with nothing journaled ended before it awaited anything (a
    # wrong argument): first, on replay too.
    seq = _journaled_end(history, branch)
    return 0 if seq is None else seq


async def _run_branch(branch: _Branch, call: Awaitable[Any], send: Any) -> None:
    _BRANCH.set(branch)
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


_IN_STEP: ContextVar[str | None] = ContextVar("fusee_in_step", default=None)


@contextmanager
def _inside_step(name: str) -> Iterator[None]:
    # Seen by the step's function, also in its worker thread (anyio copies the context).
    token = _IN_STEP.set(name)
    try:
        yield
    finally:
        _IN_STEP.reset(token)


def _fresh_random() -> float:
    return secrets.randbits(53) / (1 << 53)


def _fresh_uuid() -> str:
    return str(UUID(bytes=secrets.token_bytes(16), version=4))


def _raw(data: bytes) -> Any:
    import msgspec

    return msgspec.Raw(data)
