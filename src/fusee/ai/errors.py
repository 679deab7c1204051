"""The errors of ``fusee.ai``."""

from __future__ import annotations

from fusee.errors import FuseeError

__all__ = ("TruncatedStream", "OutputError", "OutputInvalid")


class TruncatedStream(FuseeError, ConnectionError):
    """A model's stream ended without its terminal event (no final response): the
    attempt is cut short, and the step's retry policy retries it."""


class OutputError(FuseeError, TypeError):
    """An ``output=`` that cannot be made a JSON Schema (raised at the call, before
    anything is journaled)."""


class OutputInvalid(FuseeError):
    """The model's answer still failed parsing or validation when ``reask`` re-asks
    were used up. ``step`` is the last step's name, ``message`` the last error."""

    def __init__(self, message: str, *, step: str, error: str, attempts: int) -> None:
        super().__init__(message)
        self.step = step
        self.error = error
        self.attempts = attempts
