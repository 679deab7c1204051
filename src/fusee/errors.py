"""Every error fusee raises.

User-facing errors derive from :class:`FuseeError`. Control-flow signals that must
travel through user code untouched (a fenced-out actor stopping, a run parking, an
eviction, continue-as-new) derive from :class:`ControlFlow`, a :class:`BaseException`,
so a workflow's ``except Exception`` cannot swallow them; :func:`is_control_flow` tells
them apart in an ``except BaseException``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fusee.runtime.records import RunPaused

__all__ = (
    "FuseeError",
    "InvalidId",
    "InvalidArgument",
    "ConfigError",
    "ServerNotFound",
    "ConnectionLost",
    "PermissionDenied",
    "FailedOver",
    "NotEncodable",
    "DeterminismError",
    "FatalError",
    "StepError",
    "StepFailedError",
    "UnknownLimit",
    "RunExists",
    "RunNotFound",
    "RunFailed",
    "RunCancelled",
    "NotPausedError",
    "StreamNotFound",
    "StepTimeout",
    "Timeout",
    "InvalidToken",
    "Unauthorized",
    "UnknownToken",
    "NothingToCancel",
    "StorageFull",
    "ControlFlow",
    "is_control_flow",
    "Fenced",
    "JournalGap",
    "StepBudgetExceeded",
    "StepPaused",
    "Evicted",
    "Parked",
    "CommitFailed",
    "Unreplayable",
    "ContinueAsNew",
    "error_type_name",
    "error_message",
)


class FuseeError(Exception):
    """The root of every error fusee raises to users."""


class InvalidId(FuseeError, ValueError):
    """A run ID, key or name that cannot be stored (empty, too long, not a string)."""


class InvalidArgument(FuseeError, ValueError):
    """An argument with a wrong value, named in the message."""


class ConfigError(FuseeError, ValueError):
    """A setting (a duration, a retry policy, a server option) that makes no sense."""


class ServerNotFound(FuseeError):
    """No ``nats-server`` binary could be found to start an embedded server."""


class NotEncodable(FuseeError, TypeError):
    """A value that msgspec cannot encode as JSON (a step result, a run input)."""


class DeterminismError(FuseeError):
    """The workflow's code no longer matches its journal.

    Raised on replay when the call at a position differs from the journaled one;
    the message names both calls and where the code made its call.
    """


class FatalError(FuseeError):
    """Raise it in a step or a workflow to fail the run at once, without retries."""


class StepError(FuseeError):
    """The error a step's last attempt raised, as the journal keeps it: the
    ``__cause__`` of a :class:`StepFailedError`, the same live and on replay (the
    original exception object is not kept: a replay has only its type's name and its
    message, so code that branched on it would replay differently).

    Attributes:
        error_type: the raised exception's type, ``module.QualName`` (``ValueError``
            for builtins, ``fusee.StepTimeout`` for fusee's own).
        message: its message.
    """

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message


class UnknownLimit(FuseeError):
    """A step names a limit (``limit=``) that was never set with ``engine.limit()``:
    the step fails at its first attempt with this error (not retried). Also raised by
    ``engine.get_limit()`` for a limit never set (``404`` over HTTP)."""


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


class RunExists(FuseeError):
    """A run with this ID exists with another workflow or another input."""


class RunNotFound(FuseeError, LookupError):
    """No run with this ID was ever started."""


class RunFailed(FuseeError):
    """The run ended with an error; ``error_type`` and ``message`` are the remote ones."""

    def __init__(self, run_id: str, error_type: str, message: str) -> None:
        super().__init__(f"run {run_id!r} failed: {error_type}: {message}")
        self.run_id = run_id
        self.error_type = error_type
        self.message = message


class RunCancelled(RunFailed):
    """The run was cancelled (by a call to ``cancel`` or by its workflow timeout)."""

    def __init__(self, run_id: str, reason: str) -> None:
        FuseeError.__init__(self, f"run {run_id!r} was cancelled: {reason}")
        self.run_id = run_id
        self.error_type = "fusee.Cancelled"
        self.message = reason
        self.reason = reason


class NotPausedError(FuseeError):
    """``resume()`` of a run that is not paused (running, waiting, ended), or of a
    journal-gap pause without ``force=True``: nothing was stored. ``status`` is the
    run's status as read (``"running"``, ``"completed"``..., ``"paused"`` for a gap
    pause that needs ``force``)."""

    def __init__(self, run_id: str, status: str, message: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.status = status


class HandlerFailed(FuseeError):
    """An object handler's invocation ended with an error (``error_type`` and
    ``message`` are the handler's own; ``fusee.Timeout`` when it ran out of time)."""

    def __init__(self, where: str, handler: str, error_type: str, message: str) -> None:
        super().__init__(f"{where}: handler {handler!r} failed: {error_type}: {message}")
        self.handler = handler
        self.error_type = error_type
        self.message = message


class HandlerCancelled(HandlerFailed):
    """An object handler's invocation was cancelled (``fusee objects cancel``)."""

    def __init__(self, where: str, handler: str, reason: str) -> None:
        FuseeError.__init__(self, f"{where}: handler {handler!r} was cancelled: {reason}")
        self.handler = handler
        self.error_type = "fusee.Cancelled"
        self.message = reason
        self.reason = reason


class StreamNotFound(FuseeError, LookupError):
    """The run is over and never had a token stream of this name (or it expired)."""


class StepTimeout(FuseeError, TimeoutError):
    """One attempt of a step ran past its ``timeout``; retried like any other error."""


class Timeout(FuseeError, TimeoutError):
    """Waiting for something (a result, a signal) took longer than allowed."""


class NothingToCancel(FuseeError, LookupError):
    """``ObjectKey.cancel(seq)`` of an invocation that is neither running nor queued (it
    ended, or there never was one with that number)."""


class InvalidToken(FuseeError, ValueError):
    """A completion token that cannot be accepted: malformed, forged, for a run or wait
    that does not exist, expired (its wait timed out or its run ended), or already used
    with another value. The message says which; ``spent`` is True for the last two (the
    token was good, its wait is over)."""

    def __init__(self, message: str, *, spent: bool = False) -> None:
        super().__init__(message)
        self.spent = spent


class Unauthorized(FuseeError):
    """An API token or stream token that lets nobody in: malformed, unknown, revoked,
    expired, or forged (not signed with this namespace's secret). The message says which,
    and never holds the token. Over HTTP: ``401 unauthorized``."""


class UnknownToken(FuseeError, LookupError):
    """``engine.tokens.revoke(id)`` of an ID the namespace has no token of."""


class ConnectionLost(FuseeError):
    """NATS did not answer in time (unreachable, restarting, or too slow): the operation
    may or may not have happened. A client call retries for a while (30 s by default)
    before it raises this; a worker's actors wait as long as it takes, and the worker
    rides it out and tries again."""


class PermissionDenied(FuseeError):
    """The NATS server refused these credentials a write (a permission violation of
    its configuration, e.g. the roles of ``nats/accounts.conf``): nothing was stored.
    The message names the subject and the role that may write it."""


class FailedOver(FuseeError):
    """A write of this process's epoch was refused: the namespace failed over to another
    region after the process connected, and it does not follow (it runs a worker, or
    made the failover). Nothing was stored. Restart it against the new home (``fusee
    region status`` names it)."""


class StorageFull(FuseeError):
    """The NATS server refused to store a write because JetStream has no storage left
    (``err_code`` 10023 "insufficient resources", or its storage limit is reached).
    Nothing was stored; the call can be retried once space is freed."""


class ControlFlow(BaseException):
    """How fusee stops, parks or restarts a workflow's code: not an error.

    Raised through the workflow's (or handler's) code by fusee itself; the actor running
    it catches it. Do not catch it: an ``except BaseException:`` or a bare ``except:``
    around ``ctx`` calls must re-raise it (``if is_control_flow(exc): raise``). Every
    one carries that hint as a note, so a traceback that shows one says why.
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.add_note(
            f"{type(self).__name__} is fusee's control flow, not an error: fusee raises it "
            f"through workflow code to stop, park or restart it, and catches it itself. "
            f"Let it propagate (an `except BaseException:` or bare `except:` around ctx "
            f"calls must re-raise it; fusee.errors.is_control_flow(exc) tells)."
        )


def is_control_flow(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from: its ``__cause__`` chain) is
    fusee's control flow, which the code must let propagate.

    Example:
        ``except BaseException as exc: if is_control_flow(exc): raise``
    """
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        if isinstance(at, ControlFlow):
            return True
        seen.add(id(at))
        at = at.__cause__
    return False


class Fenced(ControlFlow):
    """Another worker appended to this actor's journal: this copy must stop at once."""


class JournalGap(FuseeError):
    """A journal record does not chain to its predecessor: the run is paused. ``seq``:
    the stream sequence of the record that breaks the chain (0: not known)."""

    def __init__(self, *args: object, seq: int = 0) -> None:
        super().__init__(*args)
        self.seq = seq


class StepBudgetExceeded(ControlFlow):
    """A step would start beyond the workflow's ``max_steps``: the run fails with this
    error (``fusee.StepBudgetExceeded``, naming the budget and the ``step``), whatever
    the code catches: a budget the code could catch would bound nothing."""

    def __init__(self, message: str, step: str) -> None:
        super().__init__(message)
        self.step = step


class StepPaused(ControlFlow):
    """A step's attempts ran out under ``Retry(on_exhausted="pause")``: the run leaves
    and is journaled paused with ``record`` (a ``run.paused`` naming the step)."""

    def __init__(self, record: RunPaused) -> None:
        super().__init__(f"paused: {record.reason}")
        self.record = record


class Parked(ControlFlow):
    """The run waits for something that has not come: its actor leaves memory, and the
    next message in its inbox (a signal, a fired timer) brings it back by replay."""


class Evicted(ControlFlow):
    """The actor's in-memory copy is being dropped; it resumes by replay."""


class Unreplayable(ControlFlow):
    """Part of the run's history that its journal names cannot be read back (a value
    stored out of line is missing or not the one named): not the workflow's doing, so
    its code cannot catch it; the run pauses with the reason (an object's invocation
    fails)."""


class CommitFailed(ControlFlow):
    """The journal refused or did not take a record (NATS gone for too long, out of
    storage): not the workflow's doing, so its code cannot catch it. The actor stops
    where it is, and its worker activates it again from its journal."""


class ContinueAsNew(ControlFlow):
    """Raised by ``ctx.continue_as_new``: the run actor ends the generation with
    ``run.continued`` carrying ``data`` (the next generation's input, canonical JSON)."""

    def __init__(self, data: bytes) -> None:
        super().__init__("continue as new")
        self.data = data


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
