"""How code ends, for runs and objects alike: the exception a workflow or an exclusive
handler raised, mapped once to what is journaled; and how an actor left (``Outcome``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

import msgspec

from fusee.errors import (
    DeterminismError,
    FatalError,
    NotEncodable,
    StepFailedError,
    Unreplayable,
    error_message,
    error_type_name,
)
from fusee.runtime.history import Replayer

__all__ = ("Outcome", "Failure", "failure_of")

Outcome: TypeAlias = Literal["ended", "paused", "unrunnable", "parked", "idle", "continued"]
"""How an actor's activation left: its run ``ended`` (or its generation ``continued``,
inside the actor only), it ``paused`` (its code no longer matches its journal), it is
``unrunnable`` here (no such workflow or object type), it ``parked`` (it waits, out of
memory) or it went ``idle`` (an object with nothing queued)."""


@dataclass(frozen=True)
class Failure:
    """What the code's exception ends it with.

    Attributes:
        error_type: the journaled error type (``fusee.InvalidInput``, ``ValueError``...).
        message: its message.
        step: the step that failed for good, when that is what ended it.
        broken: the code no longer matches its journal, or the journal cannot be read
            back: not the code's own failure (a run pauses; an object's invocation fails
            and the key moves on).
    """

    error_type: str
    message: str
    step: str | None = None
    broken: bool = False


def failure_of(exc: Exception | Unreplayable, replayer: Replayer, bad_input: str) -> Failure:
    """The failure the code's uncaught ``exc`` ends it with; ``bad_input`` says whose
    input did not fit its type (``"the input of run 'r' does not fit agent"``)."""
    if isinstance(exc, Unreplayable):  # a value its journal names cannot be read back
        return Failure("fusee.JournalGap", str(exc), broken=True)
    if isinstance(exc, DeterminismError):
        return Failure("fusee.DeterminismError", str(exc), broken=True)
    if isinstance(exc, FatalError | NotEncodable):
        return Failure(error_type_name(exc), str(exc))
    if isinstance(exc, msgspec.ValidationError):
        return Failure("fusee.InvalidInput", f"{bad_input}: {exc}")
    if replayer.broken is not None:  # raised at a step, and the code caught it
        return Failure("fusee.DeterminismError", str(replayer.broken), broken=True)
    if isinstance(exc, StepFailedError):
        return Failure(exc.error_type, exc.message, step=exc.step)
    return Failure(error_type_name(exc), error_message(exc))
