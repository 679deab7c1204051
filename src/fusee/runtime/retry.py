"""Retry policy: how many attempts a step gets and how long it waits between them."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from fusee.errors import ConfigError, FatalError, NotEncodable
from fusee.runtime.durations import parse_duration

__all__ = ("Retry",)

DurationLike = str | float | int | timedelta


@dataclass(frozen=True)
class Retry:
    """How a step is retried when an attempt raises.

    Args:
        attempts: attempts in all, the first included (``1`` means never retry).
        initial: wait before the second attempt.
        max: the longest wait between attempts.
        multiplier: each wait is the previous one times this.
        jitter: a fraction (0 to 1) of each wait that is spread, the same way on replay.
        non_retryable: exception types that fail the step at once.
        on_exhausted: what the run does when the last attempt fails: ``"fail"`` (the
            step raises :class:`~fusee.StepFailedError`) or ``"pause"`` (the run is
            journaled paused with the step, its last error and the attempt count, leaves
            memory, and ``resume()`` runs the step again with a fresh budget). A
            ``FatalError``, a ``non_retryable`` error or a result that cannot be stored
            fails the step either way.

    Example:
        ``ctx.step("answer", call, retry=fusee.Retry(attempts=5, initial="200ms", max="30s"))``
    """

    attempts: int = 3
    initial: DurationLike = "1s"
    max: DurationLike = "60s"
    multiplier: float = 2.0
    jitter: float = 0.2
    non_retryable: Sequence[type[BaseException]] = field(default_factory=tuple)
    on_exhausted: Literal["fail", "pause"] = "fail"

    def __post_init__(self) -> None:
        if self.on_exhausted not in ("fail", "pause"):
            raise ConfigError(
                f"Retry(on_exhausted={self.on_exhausted!r}): must be 'fail' or 'pause'"
            )
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigError(f"Retry(attempts={self.attempts!r}): attempts must be an int >= 1")
        if not (isinstance(self.multiplier, int | float) and self.multiplier >= 1.0):
            raise ConfigError(f"Retry(multiplier={self.multiplier!r}): must be a number >= 1")
        if not (isinstance(self.jitter, int | float) and 0.0 <= self.jitter <= 1.0):
            raise ConfigError(f"Retry(jitter={self.jitter!r}): must be between 0 and 1")
        initial = parse_duration(self.initial, "Retry(initial=...)")
        longest = parse_duration(self.max, "Retry(max=...)")
        if longest < initial:
            raise ConfigError(f"Retry(max={self.max!r}) is shorter than initial={self.initial!r}")
        for exc_type in self.non_retryable:
            if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
                raise ConfigError(
                    f"Retry(non_retryable=...): {exc_type!r} is not an exception type"
                )

    def delay(self, attempt: int, key: str) -> float:
        """Seconds to wait after failed ``attempt`` (1-based) of the step with ``key``.

        The jitter comes from a hash of the key and attempt, not from a random source,
        so a replayed run computes the same wait.
        """
        initial = parse_duration(self.initial, "Retry(initial=...)")
        longest = parse_duration(self.max, "Retry(max=...)")
        base = min(longest, initial * math.pow(self.multiplier, attempt - 1))
        digest = hashlib.blake2b(f"{key}:{attempt}".encode(), digest_size=4).digest()
        spread = int.from_bytes(digest, "big") / 0xFFFFFFFF  # 0..1
        return max(0.0, base * (1.0 - self.jitter * spread))

    def gives_up_on(self, exc: BaseException) -> bool:
        """Whether ``exc`` must fail the step without another attempt."""
        return isinstance(exc, tuple(self.non_retryable))

    def after_failure(self, attempt: int, exc: BaseException, key: str) -> float | None:
        """After failed ``attempt`` (1-based) of the step with ``key`` raised ``exc``:
        the seconds until the next attempt, or ``None`` when the step fails now (a
        :class:`~fusee.FatalError`, a result that cannot be stored, a non-retryable
        type, or its last attempt)."""
        if (
            isinstance(exc, FatalError | NotEncodable)
            or self.gives_up_on(exc)
            or attempt >= self.attempts
        ):
            return None
        return self.delay(attempt, key)

    def pauses_on(self, attempt: int, exc: BaseException) -> bool:
        """Whether failed ``attempt`` (1-based, of this budget) raising ``exc`` pauses
        the run: its attempts ran out (not a fatal or non-retryable error) and the
        policy says ``"pause"``."""
        return (
            self.on_exhausted == "pause"
            and attempt >= self.attempts
            and not (isinstance(exc, FatalError | NotEncodable) or self.gives_up_on(exc))
        )
