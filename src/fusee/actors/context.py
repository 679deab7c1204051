"""``ctx``: what a workflow's code calls. Every call is matched against the journal.

This is the facade: it checks the arguments and hands each call to the module of its
job: steps (:mod:`fusee.actors.steps`), waits (:mod:`fusee.actors.waits`), children
(:mod:`fusee.actors.children`), ``ctx.all`` / ``ctx.race``
(:mod:`fusee.actors.combinators`). Compensations, continue-as-new and the journaled
values (``now``, ``random``, ``uuid``) are small enough to live here.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar, cast, overload
from uuid import UUID

from fusee.actors.children import run_child
from fusee.actors.combinators import combine, took_position
from fusee.actors.concurrency import enter_root, lane_of
from fusee.actors.host import ActorHost
from fusee.actors.ports import TokenSink, TokenWriterPort
from fusee.actors.steps import (
    COMPENSATE,
    DEFAULT_RETRY,
    StepInfo,
    at_compensations,
    execute,
    in_step,
)
from fusee.actors.waits import wait, wait_completion
from fusee.errors import (
    ConfigError,
    ContinueAsNew,
    FatalError,
    FuseeError,
    InvalidArgument,
    StepBudgetExceeded,
    StepFailedError,
    Timeout,
    error_message,
    error_type_name,
)
from fusee.logs import get_logger
from fusee.runtime.codec import canonical, decode_value
from fusee.runtime.completions import Completion
from fusee.runtime.durations import format_duration, parse_duration
from fusee.runtime.history import Replayed, ReplayedFailure, Replayer
from fusee.runtime.ids import validate_id, validate_name
from fusee.runtime.lanes import ROOT
from fusee.runtime.objects import ReadOnlyState, StateView, check_run_id
from fusee.runtime.records import RunContinued
from fusee.runtime.retry import Retry
from fusee.runtime.tokens import generation_stream, invocation_stream

__all__ = (
    "Context",
    "ObjectContext",
    "TokenStream",
    "token_stream",
    "run_compensations",
    "ContinueAsNew",
    "StepInfo",
    "StepFailedError",
    "DEFAULT_RETRY",
    "COMPENSATE",
    "error_type_name",
    "error_message",
)

T = TypeVar("T")
log = get_logger()


@dataclass(frozen=True)
class _Compensation:
    step: str  # COMPENSATE + the name given to ctx.compensate
    fn: Callable[..., Any]
    retry: Retry | None
    timeout: float | None


class Named(Protocol):
    """A workflow as ``ctx.child`` takes it (a :class:`fusee.Workflow`): by its name.
    (Not ``Workflow`` itself: the registry imports this module for its types.)"""

    @property
    def name(self) -> str: ...


def _caller_location(depth: int = 2) -> str:
    frame = sys._getframe(depth)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class Context:
    """The workflow's handle on its run: steps, waits (sleeps, signals, completions),
    children, combinators, compensations and journaled time and randomness.

    Attributes:
        run_id: the run's ID, as given to ``start``.
        workflow: the workflow's name.
    """

    # a step's attempts that run out under on_exhausted="pause" pause the run (an
    # object's invocation cannot pause: see ObjectContext)
    _pauses = True

    def __init__(
        self,
        host: ActorHost,
        replayer: Replayer,
        *,
        retry: Retry | None = None,
        max_steps: int | None = None,
    ) -> None:
        self._host = host
        self._replayer = replayer
        self._retry = retry if retry is not None else DEFAULT_RETRY  # the workflow's
        self._max_steps = max_steps
        self._new_steps: set[int] = set()  # positions first run in this activation
        replayer.on_position = took_position  # ctx.all / ctx.race track their branches
        # calls from tasks the code starts itself are told apart (made in the task
        # that runs the code: its root lane)
        replayer.lane = lane_of
        enter_root(replayer.lanes)
        self.run_id = host.run_id
        started = replayer.history.started
        assert started is not None
        self.workflow = started.workflow
        self._compensations: list[_Compensation] = []  # ctx.compensate, oldest first

    if not TYPE_CHECKING:
        # Not in the type (a run has no state): code that ignores the types is told so.
        object_type = None
        key = None

        @property
        def state(self) -> NoReturn:
            raise FuseeError(
                f"ctx.state in run {self.run_id!r}: state belongs to keyed objects "
                f"(fusee.object); a run keeps its data in its steps' results"
            )

    def _token_stream(self, name: str) -> TokenStream:
        """Where ``model_call`` step ``name`` streams its tokens (for ``fusee.ai``).

        Raises:
            InvalidArgument: an earlier step of this run has the name ``name`` (a
                stream name is unique in a run).
            FuseeError: the store has no token streams.
        """
        replayer = self._replayer
        history = replayer.history
        if any(o.name == name for pos, o in history.outcomes.items() if pos < replayer.next_pos):
            raise InvalidArgument(
                f"model_call {name!r}: an earlier step of run {self.run_id!r} has this name, "
                f"and a token stream name is unique in a run (put the turn in it: 'model-3')"
            )
        sink = self._host.tokens
        if sink is None:
            raise FuseeError("model_call: this engine's store has no token streams")
        return TokenStream(sink, self._host.eid, self._stream_name(name))

    def _generation_key(self, name: str) -> str:
        history = self._replayer.history
        seed = f"{self._host.namespace}\0{self.run_id}\0{history.started_seq}\0{name}"
        return hashlib.blake2b(seed.encode(), digest_size=8).hexdigest()

    def _stream_name(self, name: str) -> str:
        history = self._replayer.history
        first = not isinstance(history.started, RunContinued)
        return generation_stream(history.started_seq, first, name)

    async def sleep(self, duration: str | float | timedelta, *, name: str = "sleep") -> None:
        """Wait ``duration``, durably: the run leaves memory while it sleeps and a timer
        (a JetStream message schedule) wakes it on any worker, also after restarts.

        Example:
            ``await ctx.sleep("1h")``
        """
        location = _caller_location()
        seconds = parse_duration(duration, "the duration of ctx.sleep")
        name = validate_name(name, "sleep name")
        await self._in_lane(
            f"sleep {name!r}",
            wait(self._host, self._replayer, name, "sleep", seconds, location),
        )

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
        done = await self._in_lane(
            f"signal {name!r}",
            wait(self._host, self._replayer, name, "signal", seconds, location),
        )
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
        done = await self._in_lane(
            f"completion {name!r}",
            wait_completion(self._host, self._replayer, name, ask, seconds, location),
        )
        if done.timed_out:
            assert seconds is not None
            raise Timeout(f"no completion {name!r} within {format_duration(seconds)}")
        return decode_value(bytes(done.value), type)

    async def child(
        self,
        workflow: Named | str,
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
        if at_compensations(self._replayer):
            await self._host.stop_workflow()
        name = workflow if isinstance(workflow, str) else getattr(workflow, "name", None)
        if not isinstance(name, str):
            raise FuseeError(f"ctx.child: {workflow!r} is not a workflow (at {location})")
        name = validate_name(name, "workflow name")
        child_id = check_run_id(validate_id(child_id, "child run ID"), "child run ID")
        if child_id == self.run_id:
            raise FuseeError(f"ctx.child: a run cannot be its own child (at {location})")
        seconds = parse_duration(timeout, "timeout of ctx.child") if timeout is not None else None
        data = canonical(
            arg, f"the input of child run {child_id!r}", limit=self._host.store.max_value
        )
        return await self._in_lane(
            f"child {child_id!r}",
            run_child(self._host, self._replayer, name, child_id, data, seconds, location, type),
        )

    async def _in_lane(self, what: str, call: Awaitable[T]) -> T:
        """Await ``call``, a wait or a child of the calling task: in a task the code
        started itself, stopped if the code's execution ends first."""
        if lane_of(self._replayer.lanes) == ROOT:
            return await call
        with self._host.stragglers.running(what):
            return await call
        raise AssertionError("unreachable")  # (running() raises when it stopped the call)

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
            policy = comp.retry if comp.retry is not None else self._retry
            try:
                await execute(
                    self._host,
                    self._replayer,
                    comp.step,
                    comp.fn,
                    decision,
                    policy,
                    comp.timeout,
                    None,
                    pause=False,  # (a compensation runs out as under "fail")
                )
            except StepFailedError as exc:
                failed.append(exc)
        return failed

    def journal_size(self) -> int:
        """How many records the run's current generation holds (from its ``run.started``
        or ``run.continued`` on, itself included): what a replay reads and folds. Use it
        to decide when to ``continue_as_new``. A replay returns what the run had journaled
        when its code was at the same place, so the decision replays the same."""
        history, reached = self._replayer.history, self._replayer.next_pos
        if any(pos >= reached for pos in history.size_at):  # replaying: the journal is ahead
            # before any position: what the generation begins with (a run's start record;
            # an object's invocation begins with none)
            start = 0 if history.invocation is not None else 1
            return max((n for pos, n in history.size_at.items() if pos < reached), default=start)
        # a wait's end not journaled yet (it rides on the next record) counts as one, as
        # it does once journaled, alone or riding
        return history.generation_size + len(history.resolved)

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
        step = in_step()
        if step is not None:
            raise FatalError(
                f"ctx.continue_as_new() was called inside step {step!r} (at {location}): "
                f"call it in the workflow"
            )
        raise ContinueAsNew(
            canonical(
                arg,
                f"the input of the next generation of {self.run_id!r}",
                limit=self._host.store.max_value,
            )
        )

    def now(self) -> datetime:
        """The current time as a timezone-aware UTC datetime, journaled: a replay of the
        run returns the same time (the worker's clock when the run first got here).

        Example:
            ``deadline = ctx.now() + timedelta(days=1)``
        """
        clock = self._host.clock
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
        step = in_step()
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
        limit: str | None = ...,
        fairness_key: str | None = ...,
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
        limit: str | None = ...,
        fairness_key: str | None = ...,
    ) -> T: ...

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        retry: Retry | None = None,
        timeout: str | float | timedelta | None = None,
        type: Any = None,  # noqa: A002 - reads well at the call site
        limit: str | None = None,
        fairness_key: str | None = None,
    ) -> Any:
        """Run ``fn`` once, durably: its result is journaled and replayed, never re-run.

        With ``limit=`` (a name set by ``engine.limit()``), each attempt first waits
        for a permit of that limit, its turn among the waiters of its ``fairness_key``
        (keys are served round-robin); the permit is returned when the attempt ends.
        A limit that does not exist fails the step at its first attempt
        (``StepFailedError`` with ``error_type`` ``fusee.UnknownLimit``).

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
        permits = None
        if limit is not None:
            limit = validate_name(limit, "limit name")
            fairness = "" if fairness_key is None else validate_name(fairness_key, "fairness key")
            permits = (limit, fairness)
        elif fairness_key is not None:
            raise FuseeError(f"step {name!r}: fairness_key= needs limit= (at {location})")
        policy = retry if retry is not None else self._retry
        if policy.on_exhausted == "pause" and not self._pauses:
            raise ConfigError(
                f"step {name!r}: Retry(on_exhausted='pause') is for workflow runs; an "
                f"object's invocation cannot pause (it would hold its key's queue): use "
                f"on_exhausted='fail' and handle the StepFailedError (at {location})"
            )
        deadline = (
            parse_duration(timeout, f"timeout of step {name!r}") if timeout is not None else None
        )
        if at_compensations(self._replayer):
            await self._host.stop_workflow()
        decision = self._replayer.begin_step(name, location)
        if isinstance(decision, Replayed):
            if decision.ref is not None:  # stored out of line: read it back
                return decode_value(await self._host.read_value(decision.ref), type)
            return decode_value(decision.result, type)
        if isinstance(decision, ReplayedFailure):
            rec = decision.record
            raise StepFailedError(rec.name, rec.error_type, rec.message, rec.attempt)
        if self._max_steps is not None and decision.attempt == 1:
            self._check_budget(name, decision.pos, self._max_steps)
        host = self._host
        if self._replayer.last_lane == ROOT:
            return await execute(
                host, self._replayer, name, fn, decision, policy, deadline, type, permits
            )
        # a task the code started itself: stopped if the code's execution ends first
        with host.stragglers.running(f"step {name!r}"):
            return await execute(
                host, self._replayer, name, fn, decision, policy, deadline, type, permits
            )
        raise AssertionError("unreachable")  # (running() raises when it stopped the step)

    def _check_budget(self, name: str, pos: int, budget: int) -> None:
        """A new step at ``pos`` is about to start: within the workflow's ``max_steps``?

        Raises:
            StepBudgetExceeded: it would be a step beyond the budget.
        """
        history = self._replayer.history
        journaled = history.outcomes.keys() | history.retries.keys() | history.pauses.keys()
        self._new_steps -= journaled
        count = history.steps_before + len(journaled) + len(self._new_steps - {pos})
        if count >= budget:
            raise StepBudgetExceeded(
                f"run {self.run_id!r}: step {name!r} would be step {count + 1} of the run, "
                f"beyond its workflow's budget max_steps={budget} "
                f"(@fusee.workflow({self.workflow!r}, max_steps={budget}))",
                name,
            )
        self._new_steps.add(pos)

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
        branches = await self._in_lane(
            "ctx.all",
            combine(
                self._host,
                self._replayer,
                aws,
                race=False,
                return_exceptions=return_exceptions,
                location=_caller_location(),
            ),
        )
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
        branches = await self._in_lane(
            "ctx.race",
            combine(
                self._host,
                self._replayer,
                aws,
                race=True,
                return_exceptions=False,
                location=_caller_location(),
            ),
        )
        winner = next(b for b in branches if b.won)
        return winner.value


class ObjectContext(Context):
    """``ctx`` in an exclusive handler of a keyed object: a :class:`Context` (steps,
    waits, children... journaled like a run's) and the object's state.

    Attributes:
        object_type: the object type's name.
        key: the object's key.
    """

    _pauses = False  # (its key's queue would wait behind a paused invocation)

    def __init__(
        self,
        host: ActorHost,
        replayer: Replayer,
        *,
        object_type: str,
        key: str,
        state: ReadOnlyState,
    ) -> None:
        super().__init__(host, replayer)
        self.object_type = object_type
        self.key = key
        self._state = state

    @property
    def state(self) -> StateView:
        """The object's state: ``get(name)``, ``set(name, value)``, ``delete``,
        ``clear``, ``keys``. Changes apply when the handler returns, all at once, and
        not at all when it fails."""
        # A handler queued as exclusive and shared by now gets a view that refuses changes.
        return cast("StateView", self._state)

    def _stream_name(self, name: str) -> str:
        # one stream per invocation: the invocation's inbox sequence names it
        return invocation_stream(self._replayer.history.started_seq, name)


@dataclass(frozen=True)
class TokenStream:
    """One ``model_call``'s token stream: ``open()`` gives its writer."""

    sink: TokenSink
    eid: str
    name: str

    async def open(self) -> TokenWriterPort:
        return await self.sink.open(self.eid, self.name)


def _fresh_random() -> float:
    return secrets.randbits(53) / (1 << 53)


def _fresh_uuid() -> str:
    return str(UUID(bytes=secrets.token_bytes(16), version=4))


# -- for the drivers and fusee.ai: what they need of a context, named ---------------------


def token_stream(ctx: Context, name: str) -> TokenStream:
    """Where ``model_call`` step ``name`` of ``ctx``'s code streams its tokens.

    Raises:
        InvalidArgument: an earlier step of this run has the name ``name``.
        FuseeError: the store has no token streams.
    """
    return ctx._token_stream(name)


def generation_key(ctx: Context, name: str) -> str:
    """16 hex characters of a hash of ``ctx``'s run, its generation and ``name``: the
    same in every replay of the generation, another in the next one (for fusee.ai: a
    workflow tool's child run ID)."""
    return ctx._generation_key(name)


@contextlib.contextmanager
def concurrent_calls(ctx: Context) -> Iterator[None]:
    """For code whose ``ctx`` calls run in tasks it did not start with ``ctx.all``
    (``fusee.ai.openai``: the Agents SDK runs a turn's tool calls as its own tasks):
    while the block runs, commits take turns as a combinator's branches do (two steps
    appending at once under one fence would fence the actor), and the copy is not
    evicted at a step boundary in it (``FUSEE_ALWAYS_REPLAY``)."""
    host = ctx._host
    host.combinators += 1
    try:
        yield
    finally:
        host.combinators -= 1


async def run_compensations(ctx: Context) -> list[StepFailedError] | None:
    """Run the compensations ``ctx``'s code registered, newest first, as durable steps
    (the driver's, outside the code's scope); the ones that failed for good. ``None``:
    none was registered (nothing ran, nothing journaled).

    Raises:
        DeterminismError: the journal holds other compensations than the code now
            registers (the run pauses).
    """
    if not ctx._compensations:
        return None
    return await ctx._compensate()
