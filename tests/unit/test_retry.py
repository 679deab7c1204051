"""The retry decision, pure: after a failed attempt, wait how long, or fail the step."""

from __future__ import annotations

import pytest

import fusee
from fusee.errors import NotEncodable
from fusee.runtime.retry import Retry


class Throttled(Exception):
    pass


def test_a_failed_attempt_is_retried_after_its_delay_until_the_last() -> None:
    policy = Retry(attempts=3, initial="1s", max="10s", multiplier=2.0, jitter=0.0)
    assert policy.after_failure(1, Throttled(), "k") == pytest.approx(1.0)
    assert policy.after_failure(2, Throttled(), "k") == pytest.approx(2.0)
    assert policy.after_failure(3, Throttled(), "k") is None  # the last attempt failed


def test_some_failures_end_the_step_at_once() -> None:
    policy = Retry(attempts=5, non_retryable=(Throttled,))
    assert policy.after_failure(1, Throttled(), "k") is None
    assert policy.after_failure(1, fusee.FatalError("no"), "k") is None
    assert policy.after_failure(1, NotEncodable("too big"), "k") is None
    assert policy.after_failure(1, ValueError("once more"), "k") is not None


def test_the_delay_is_the_same_on_replay() -> None:
    policy = Retry(attempts=5, jitter=0.5)
    first = [policy.after_failure(a, ValueError(), "step-key") for a in (1, 2, 3)]
    assert first == [policy.after_failure(a, ValueError(), "step-key") for a in (1, 2, 3)]
    assert first != [policy.after_failure(a, ValueError(), "other-key") for a in (1, 2, 3)]
