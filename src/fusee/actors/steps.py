"""``ctx.step``: the attempt loop. Run a step's function, journal its end (or its
retry), and tell the workflow how it ended; also what a step's function may take
(:class:`StepInfo`) and where compensations begin."""

from __future__ import annotations

import hashlib
import inspect
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import structlog

from fusee.actors.host import ActorHost
from fusee.errors import (
    Evicted,
    NotEncodable,
    StepFailedError,
    StepPaused,
    StepTimeout,
    UnknownLimit,
    error_message,
    error_type_name,
)
from fusee.logs import get_logger
from fusee.runtime.codec import MAX_LARGE_VALUE, check_size, decode_value, encode_value
from fusee.runtime.durations import format_duration
from fusee.runtime.history import Execute, Replayer
from fusee.runtime.records import RunPaused, StepCompleted, StepFailed, StepRetrying
from fusee.runtime.retry import Retry

__all__ = (
    "StepInfo",
    "DEFAULT_RETRY",
    "COMPENSATE",
    "BRANCH_STEPS",
    "execute",
    "fail_step",
    "step_key",
    "at_compensations",
    "in_step",
)

log = get_logger()

DEFAULT_RETRY = Retry()
COMPENSATE = "compensate:"  # the step name of a compensation is this prefix + its name


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
    # made when first read (made for a step function that takes ``s``, before it runs;
    # most take none: an Event costs about 2 µs), set at once if the step was stopped
    _signal: anyio.Event | None = field(default=None, init=False, repr=False)
    _stopped: bool = field(default=False, init=False, repr=False)
    # set when the thread of a sync function under a timeout returns (a timeout
    # abandons it, still running: its permit is kept until then)
    _returned: threading.Event | None = field(default=None, init=False, repr=False)

    @property
    def signal(self) -> anyio.Event:
        if self._signal is None:
            self._signal = anyio.Event()
            if self._stopped:
                self._signal.set()
        return self._signal

    def stop(self) -> None:
        """Set :attr:`signal` (now, or as it is made)."""
        self._stopped = True
        if self._signal is not None:
            self._signal.set()

    def with_key(self, key: str) -> StepInfo:
        """This step's info under the idempotency key ``key`` (``fusee.ai`` gives a tool
        call's step ``<its key>-<the model's tool-call ID>``); its :attr:`signal` is this
        step's."""
        info = StepInfo(key=key, attempt=self.attempt, name=self.name)
        info._signal = self.signal
        return info


# The running steps of the ctx.all / ctx.race branch this task runs in (set by the
# combinator): a race the branch loses stops them.
BRANCH_STEPS: ContextVar[set[StepInfo] | None] = ContextVar("fusee_branch_steps", default=None)

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


def step_key(host: ActorHost, replayer: Replayer, pos: int) -> str:
    history = replayer.history
    seed = f"{host.namespace}\0{host.run_id}\0{history.started_seq}\0{pos}"
    return hashlib.blake2b(seed.encode(), digest_size=16).hexdigest()


def at_compensations(replayer: Replayer) -> bool:
    """Whether the journal holds a compensation at the code's next position: the
    workflow was stopped there (cancelled), so a replay must stop there too."""
    history = replayer.history
    pos = replayer.next_pos
    outcome = history.outcomes.get(pos)
    retries = history.retries.get(pos)
    name = outcome.name if outcome is not None else (retries[0].name if retries else None)
    return name is not None and name.startswith(COMPENSATE)


async def execute(
    host: ActorHost,
    replayer: Replayer,
    name: str,
    fn: Callable[..., Any],
    decision: Execute,
    policy: Retry,
    limit: float | None,
    type_: Any,
    permits: tuple[str, str] | None = None,
    *,
    pause: bool = True,
) -> Any:
    """Run the step's attempts from ``decision`` under ``policy`` (``limit``: each
    attempt's timeout); its result decoded into ``type_``. ``pause``: attempts that
    run out under ``on_exhausted="pause"`` pause the run (else they fail the step).

    Raises:
        StepFailedError: the step failed for good.
        StepPaused: its attempts ran out and the run pauses (journaled by the driver).
    """
    # A run that is being cancelled (its scope was cancelled before the workflow got
    # here, or it is replayed to find its compensations) runs nothing new.
    await anyio.lowlevel.checkpoint_if_cancelled()
    await host.before_step()
    key = step_key(host, replayer, decision.pos)
    attempt, base = decision.attempt, decision.base  # base: earlier budgets' failures
    paused: RunPaused | None = None
    if decision.last_retry is not None:
        # resumed between attempts: wait out what is left of the journaled delay
        due = decision.last_retry.failed_at + decision.last_retry.retry_in
        await anyio.sleep(max(0.0, due - host.clock()))
    takes_info = _takes_step_info(fn)
    what = f"the result of step {name!r}"
    # bound by token, not ``bound_contextvars``: that one copies and scans the task's
    # context variables to save what it rebinds (7.5 µs to enter in a worker's step,
    # against 2.5 µs for this bind and its reset)
    bound = structlog.contextvars.bind_contextvars(step=name, pos=decision.pos)
    host.steps_in_flight += 1  # (the copy leaves memory only when one step alone runs)
    try:
        while True:
            info = StepInfo(key=key, attempt=attempt, name=name)
            if takes_info:
                # made here, in the event loop: the function may read it in a thread
                _ = info.signal
            held = None
            if permits is not None:
                # a permit of the limit before each attempt (waits its turn, may park)
                try:
                    held = await host.acquire_permit(
                        permits[0], permits[1], f"{key}.{attempt}", pos=decision.pos
                    )
                except UnknownLimit as exc:
                    failure = await fail_step(
                        host, decision.pos, name, attempt, "fusee.UnknownLimit", str(exc), 0.0
                    )
                    break
            log.debug("step.started", attempt=attempt)
            finishing = False  # its body returned: its result is to be journaled
            began = time.monotonic()  # (anyio.current_time(): the same clock, dearer)
            host.running_steps.add(info)  # a cancel of the run stops it
            branch = BRANCH_STEPS.get()
            if branch is not None:
                branch.add(info)  # a race it loses stops it
            try:
                try:
                    # seen by the step's function, also in its worker thread (anyio
                    # copies the context); set by hand: a context manager costs µs a step
                    inside = _IN_STEP.set(name)
                    try:
                        value = await _call(fn, info, takes_info, limit)
                    finally:
                        _IN_STEP.reset(inside)
                    # a drain past its timeout leaves this actor to journal the result
                    # (cancelled, the finished step would run again elsewhere)
                    host.results_in_flight += 1
                    finishing = True
                    data = encode_value(value, what)
                    if len(data) > MAX_LARGE_VALUE:  # (its message is made only then)
                        check_size(
                            data,
                            what,
                            MAX_LARGE_VALUE,
                            of="a step's result (one over "
                            f"{host.store.max_value:,} bytes is stored out of line)",
                        )
                finally:
                    host.running_steps.discard(info)
                    if branch is not None:
                        branch.discard(info)
                    if held is not None:
                        returned = info._returned
                        if returned is not None and not returned.is_set():
                            # timed out, its thread still running (it ignored the signal):
                            # the permit is kept, and renewed, until the thread returns
                            # (a cancel meanwhile: the lease takes it back)
                            await anyio.to_thread.run_sync(returned.wait, abandon_on_cancel=True)
                        await host.release_permit(held)
            except (Evicted, anyio.get_cancelled_exc_class()):
                info.stop()
                if finishing:
                    host.results_in_flight -= 1
                raise
            except Exception as exc:  # noqa: BLE001 - journaled, raised as StepFailedError
                if finishing:  # (its result could not be encoded: a failure)
                    host.results_in_flight -= 1
                elapsed = time.monotonic() - began
                wait = policy.after_failure(attempt - base, exc, key)
                etype, message = error_type_name(exc), error_message(exc)
                if wait is None and pause and policy.pauses_on(attempt - base, exc):
                    paused = _pause_record(decision.pos, name, attempt - base, etype, message)
                    log.warning("step.paused", attempt=attempt, error=f"{etype}: {message}")
                    break  # raised outside the handler
                if wait is None:
                    failure = await fail_step(
                        host, decision.pos, name, attempt, etype, message, elapsed
                    )
                    break  # raised outside the handler: no live-only __context__
                await host.commit(
                    StepRetrying(
                        pos=decision.pos,
                        name=name,
                        attempt=attempt,
                        error_type=etype,
                        message=message,
                        retry_in=wait,
                        failed_at=host.clock(),
                    )
                )
                log.info(
                    "step.retrying",
                    attempt=attempt,
                    error=f"{etype}: {message}",
                    retry_in=format_duration(wait),
                )
                await host.maybe_evict(in_step=True)
                await anyio.sleep(wait)
                attempt += 1
                continue
            elapsed_ms = round((time.monotonic() - began) * 1000, 3)
            try:
                inline, ref = data, None
                if len(data) > host.store.max_value:
                    # too large for a record: stored first, then the record naming it
                    inline, ref = b"null", await host.store_value(data)
                await host.commit(
                    StepCompleted(
                        pos=decision.pos,
                        name=name,
                        result=msgspec.Raw(inline),
                        attempt=attempt,
                        duration_ms=elapsed_ms,
                        result_ref=msgspec.UNSET if ref is None else ref,
                    )
                )
            except NotEncodable as exc:  # the record as a whole is over the limit
                failure = await fail_step(
                    host,
                    decision.pos,
                    name,
                    attempt,
                    "fusee.NotEncodable",
                    f"the result of step {name!r} cannot be stored: {exc}",
                    elapsed_ms / 1000,
                )
                break
            finally:
                host.results_in_flight -= 1
            log.info("step.completed", attempt=attempt, duration_ms=elapsed_ms)
            await host.maybe_evict(in_step=True)
            return decode_value(data, type_)
    finally:
        host.steps_in_flight -= 1
        structlog.contextvars.reset_contextvars(**bound)
    if paused is not None:
        raise StepPaused(paused)  # the run leaves; its driver journals the pause
    raise failure


def _pause_record(pos: int, name: str, attempts: int, etype: str, message: str) -> RunPaused:
    return RunPaused(
        reason=(
            f"step {name!r} failed {attempts} attempt(s), the last with {etype}, under "
            f"Retry(on_exhausted='pause'); resume the run (fusee runs resume, or "
            f"engine.run(id).resume()) once the cause is fixed: the step runs again "
            f"with a fresh retry budget"
        ),
        cause="retries",
        pos=pos,
        step=name,
        error_type=etype,
        message=message,
        attempts=attempts,
    )


async def fail_step(
    host: ActorHost, pos: int, name: str, attempt: int, etype: str, message: str, elapsed: float
) -> StepFailedError:
    """Journal the step's final failure; the error to raise in the workflow."""
    await host.commit(
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
    fn: Callable[..., Any], info: StepInfo, takes_info: bool, limit: float | None
) -> Any:
    if limit is None:  # no deadline: no cancel scope to pay for on every step
        return await _invoke(fn, info, takes_info)
    if not inspect.iscoroutinefunction(fn):
        info._returned = threading.Event()
    with anyio.CancelScope(deadline=anyio.current_time() + limit):
        return await _invoke(fn, info, takes_info)
    info.stop()
    raise StepTimeout(
        f"step {info.name!r} attempt {info.attempt} ran past its timeout of "
        f"{format_duration(limit)}"
    )


async def _invoke(fn: Callable[..., Any], info: StepInfo, takes_info: bool) -> Any:
    if inspect.iscoroutinefunction(fn):
        result = fn(info) if takes_info else fn()
    else:
        # A plain function may block (a sync HTTP client): it runs in a thread,
        # and a coroutine it returns (a lambda around an async call) is awaited here.
        def call() -> Any:
            try:
                return fn(info) if takes_info else fn()
            finally:
                if info._returned is not None:
                    info._returned.set()

        result = await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
    if inspect.isawaitable(result):
        result = await result
    return result


_IN_STEP: ContextVar[str | None] = ContextVar("fusee_in_step", default=None)


def in_step() -> str | None:
    """The name of the step whose function is running here, if any."""
    return _IN_STEP.get()
