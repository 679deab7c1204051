"""The public API is ``fusee.__all__``: a change to it is a deliberate change to this test."""

from __future__ import annotations

import importlib

import pytest

import fusee

PUBLIC = (
    "connect",
    "Engine",
    "WorkerConfig",
    "Run",
    "RunInfo",
    "BulkSummary",
    "TokenEvent",
    "CompletionInfo",
    "workflow",
    "Workflow",
    "object",
    "shared",
    "exclusive",
    "ObjectType",
    "ObjectKey",
    "ObjectInfo",
    "HandlerFailed",
    "HandlerCancelled",
    "Context",
    "ObjectContext",
    "SharedContext",
    "StepInfo",
    "Retry",
    "FuseeError",
    "FatalError",
    "StepFailedError",
    "StepError",
    "StepTimeout",
    "DeterminismError",
    "InvalidId",
    "InvalidArgument",
    "ConfigError",
    "NotEncodable",
    "NothingToCancel",
    "RunExists",
    "RunNotFound",
    "RunFailed",
    "RunCancelled",
    "NotPausedError",
    "StreamNotFound",
    "Timeout",
    "ConnectionLost",
    "StorageFull",
    "Completion",
    "InvalidToken",
    "LimitInfo",
    "UnknownLimit",
)


def test_all_is_pinned() -> None:
    assert fusee.__all__ == PUBLIC


def test_all_has_no_duplicates() -> None:
    assert len(set(fusee.__all__)) == len(fusee.__all__)


@pytest.mark.parametrize("name", PUBLIC)
def test_each_name_is_importable(name: str) -> None:
    module = importlib.import_module("fusee")
    assert getattr(module, name) is not None
    namespace: dict[str, object] = {}
    exec(f"from fusee import {name}", namespace)  # the form users write
    assert namespace[name] is getattr(fusee, name)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from fusee import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(PUBLIC)


def test_every_public_error_is_a_fusee_error() -> None:
    errors = [
        obj
        for obj in (getattr(fusee, n) for n in PUBLIC)
        if isinstance(obj, type) and issubclass(obj, BaseException)
    ]
    assert len(errors) == 24
    assert [e.__name__ for e in errors if not issubclass(e, fusee.FuseeError)] == []


def test_version_is_a_string() -> None:
    assert isinstance(fusee.__version__, str)
