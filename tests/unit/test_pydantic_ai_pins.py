"""Pins of what fusee.ai.pydantic takes from Pydantic AI beyond its public API, and of
what it tells Pydantic AI about fusee (issue 14): an upgrade that moves one fails here,
by name, rather than as a run that quietly stops being durable."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai.durable_exec import BaseDurabilityCapability, DurableOperationId

import fusee
from fusee.ai.pydantic import FuseeDurability
from fusee.errors import ControlFlow


def test_the_operation_ids_fusee_knows() -> None:
    # _Backend.execute keys tool steps by ToolsetCallToolId and streams by
    # ModelRequestId(streaming=True); the rest are plain steps. A new variant (the union
    # grows in minor releases) must be looked at before the pin is moved.
    names = {t.__name__ for t in typing.get_args(DurableOperationId)}
    assert names == {
        "CapabilityOperationId",
        "ModelRequestId",
        "ModelCancelSuspendedResponseId",
        "ModelCompactMessagesId",
        "EventStreamHandlerId",
        "ToolsetGetToolsId",
        "ToolsetGetInstructionsId",
        "ToolsetValidateToolArgumentsId",
        "ToolsetCallToolId",
    }, names


def test_the_one_private_seam_the_streamed_model_step_uses() -> None:
    # FuseeDurability overrides it to write the live text deltas to a token stream from
    # inside the model step (as TemporalDurability does); the base must still consume
    # the model stream through it. tests/integration/test_pydantic_ai.py's streaming
    # test is the behaviour; this says which seam moved.
    assert callable(BaseDurabilityCapability._model_stream_event_handler)
    source = inspect.getsource(BaseDurabilityCapability._model_request_stream_operation)
    assert "self._model_stream_event_handler()" in source
    assert "_model_stream_event_handler" in FuseeDurability.__dict__


def _base_exceptions() -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for info in pkgutil.walk_packages(fusee.__path__, "fusee."):
        if info.name.startswith("fusee.adapters.http."):
            # the API server's own (a body over the limit, raised in its ASGI receive):
            # never raised through a workflow's code
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra's module
            continue
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and not issubclass(value, Exception)
                and value.__module__.startswith("fusee")
            ):
                found.add(value)
    return found


def test_every_fusee_base_exception_passes_through_pydantic_ai() -> None:
    # A fusee suspension (park, pause, eviction, fence, budget, continue-as-new) raised
    # in a step must leave agent.run as it came: fusee's BaseExceptions are all
    # ControlFlow, which FuseeDurability lists as its cancellation error type.
    found = _base_exceptions()
    assert ControlFlow in found
    assert {e for e in found if not issubclass(e, ControlFlow)} == set()
    assert FuseeDurability.engine_spec.cancellation_error_types == (ControlFlow,)
    names = {e.__name__ for e in found}
    assert {"StepPaused", "Parked", "Evicted", "Fenced", "ContinueAsNew"} <= names, names
