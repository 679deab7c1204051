"""Control-flow signals: one BaseException base that says, in a traceback, why it is there."""

from __future__ import annotations

import traceback

import pytest

from fusee.errors import (
    CommitFailed,
    ContinueAsNew,
    ControlFlow,
    Evicted,
    Fenced,
    Parked,
    Unreplayable,
    is_control_flow,
)
from fusee.runtime.history import ReplayedCancel
from fusee.runtime.records import CallCancelled


@pytest.mark.parametrize(
    "exc",
    [
        Fenced("moved"),
        Parked(),
        Evicted(),
        CommitFailed("lost"),
        Unreplayable("gone"),
        ContinueAsNew(b"null"),
        ReplayedCancel(CallCancelled(pos=1, name="a", call="step", reason="lost")),
    ],
)
def test_every_signal_is_control_flow_and_says_why(exc: BaseException) -> None:
    assert isinstance(exc, ControlFlow)
    assert not isinstance(exc, Exception)  # an `except Exception` cannot swallow it
    assert is_control_flow(exc)
    shown = "".join(traceback.format_exception(exc))
    assert "fusee's control flow, not an error" in shown
    assert "is_control_flow" in shown


def test_the_message_stays_the_message() -> None:
    # the note is for tracebacks: a message journaled or logged is unchanged
    assert str(Unreplayable("a value is missing")) == "a value is missing"
    assert str(Parked()) == ""


def test_a_wrapped_signal_is_found_through_its_cause() -> None:
    outer = RuntimeError("a framework wrapped it")
    outer.__cause__ = Parked()
    assert is_control_flow(outer)
    assert not is_control_flow(ValueError("mine"))
