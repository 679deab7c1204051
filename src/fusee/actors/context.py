"""``ctx``: what a workflow's code calls. Every call is matched against the journal."""

from __future__ import annotations

import hashlib
import inspect
import secrets
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload
from uuid import UUID

import anyio
import structlog

from fusee.errors import Evicted, FatalError, FuseeError, NotEncodable, StepTimeout, Timeout
from fusee.runtime.codec import decode_value, encode_value
from fusee.runtime.completions import Completion, completion_token, completion_url
from fusee.runtime.durations import format_duration, parse_duration
from fusee.runtime.history import Execute, Replayed, ReplayedFailure, Replayer
from fusee.runtime.ids import validate_name
from fusee.runtime.records import StepCompleted, StepFailed, StepRetrying, WaitDone, WaitStarted
from fusee.runtime.retry import Retry

if TYPE_CHECKING:
    from fusee.actors.run_actor import RunActor

__all__ = ("Context", "StepInfo", "StepFailedError", "DEFAULT_RETRY", "error_type_name")

T = TypeVar("T")
log = structlog.get_logger("fusee")

DEFAULT_RETRY = Retry()
COMPENSATE = "compensate:"  # the step name of a compensation is this prefix + its name


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
    raised. Uncaught, it fails the run with that error.
    """

    def __init__(self, step: str, error_type: str, message: str, attempts: int) -> None:
        super().__init__(
            f"step {step!r} failed after {attempts} attempt(s): {error_type}: {message}"
        )
        self.step = step
        self.error_type = error_type
        self.message = message
        self.attempts = attempts


def error_type_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ in ("builtins", "__main__"):
        return cls.__qualname__
    if cls.__module__.startswith("fusee."):
        return f"fusee.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


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
    """The workflow's handle on its run: steps, and (soon) waits, children and time.

    Attributes:
        run_id: the run's ID, as given to ``start``.
        workflow: the workflow's name.
    """

    def __init__(self, actor: RunActor, replayer: Replayer) -> None:
        self._actor = actor
        self._replayer = replayer
        self.run_id = actor.run_id
        started = replayer.history.started
        assert started is not None
        self.workflow = started.workflow
        self._compensations: list[_Compensation] = []  # ctx.compensate, oldest first

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
        decision = self._replayer.begin_wait(name, "completion", location)
        if isinstance(decision, WaitDone):
            done = decision
            if ask is not None:  # the ask step took the next position: replay it too
                self._replayer.begin_step(ask_step, location)
        else:
            pos, started = decision
            actor = self._actor
            if started is None:
                until = actor.clock() + seconds if seconds is not None else None
                await actor.commit(WaitStarted(pos=pos, name=name, wait="completion", until=until))
                log.info("wait.started", pos=pos, wait="completion", name=name)
                await actor.maybe_evict()
                started = actor.history.waits[pos]
            if ask is not None:
                cb = self._completion(pos, name)
                await self.step(ask_step, _asker(ask, cb))
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
            await actor.commit(WaitStarted(pos=pos, name=name, wait=wait, until=until))
            log.info("wait.started", pos=pos, wait=wait, name=name)
            await actor.maybe_evict()
            started = actor.history.waits[pos]
        return await actor.wait_out(started)

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
        """How many records the run's journal holds."""
        return self._replayer.history.size

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
                try:
                    try:
                        with _inside_step(name):
                            value = await self._call(fn, info, takes_info, limit)
                        data = encode_value(value, f"the result of step {name!r}")
                    finally:
                        actor.running_steps.discard(info)
                except (Evicted, anyio.get_cancelled_exc_class()):
                    info.signal.set()
                    raise
                except Exception as exc:
                    elapsed = anyio.current_time() - began
                    final = (
                        isinstance(exc, FatalError | NotEncodable)
                        or policy.gives_up_on(exc)
                        or attempt >= policy.attempts
                    )
                    etype, message = error_type_name(exc), str(exc) or repr(exc)
                    if final:
                        await actor.commit(
                            StepFailed(
                                pos=decision.pos,
                                name=name,
                                attempt=attempt,
                                error_type=etype,
                                message=message,
                            )
                        )
                        log.warning(
                            "step.failed",
                            attempt=attempt,
                            error=f"{etype}: {message}",
                            duration_ms=round(elapsed * 1000, 2),
                        )
                        raise StepFailedError(name, etype, message, attempt) from exc
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
                await actor.commit(
                    StepCompleted(
                        pos=decision.pos,
                        name=name,
                        result=_raw(data),
                        attempt=attempt,
                        duration_ms=elapsed_ms,
                    )
                )
                log.info("step.completed", attempt=attempt, duration_ms=elapsed_ms)
                await actor.maybe_evict()
                return decode_value(data, type_)

    async def _call(
        self, fn: Callable[..., Any], info: StepInfo, takes_info: bool, limit: float | None
    ) -> Any:
        with anyio.CancelScope() as scope:
            if limit is not None:
                scope.deadline = anyio.current_time() + limit
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
        info.signal.set()
        assert limit is not None
        raise StepTimeout(
            f"step {info.name!r} attempt {info.attempt} ran past its timeout of "
            f"{format_duration(limit)}"
        )

    def _step_key(self, pos: int) -> str:
        history = self._replayer.history
        seed = f"{self._actor.namespace}\0{self.run_id}\0{history.started_seq}\0{pos}"
        return hashlib.blake2b(seed.encode(), digest_size=16).hexdigest()


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
