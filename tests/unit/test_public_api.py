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
    "PermissionDenied",
    "FailedOver",
    "StorageFull",
    "Completion",
    "InvalidToken",
    "LimitInfo",
    "UnknownLimit",
    "Tokens",
    "TokenInfo",
    "CreatedToken",
    "Unauthorized",
    "UnknownToken",
    "fail_over",
    "FailoverReport",
    "MirrorLag",
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
    assert len(errors) == 28
    assert [e.__name__ for e in errors if not issubclass(e, fusee.FuseeError)] == []


def test_version_is_a_string() -> None:
    assert isinstance(fusee.__version__, str)


AI_PUBLIC = (
    "generate",
    "Generation",
    "model_call",
    "model_step",
    "loop",
    "Turn",
    "LoopResult",
    "LoopState",
    "tool",
    "workflow_tool",
    "Tool",
    "WorkflowTool",
    "ToolInputError",
    "UnknownTool",
    "openai_model",
    "OpenAIModel",
    "anthropic_model",
    "AnthropicModel",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "Message",
    "SystemMessage",
    "UserMessage",
    "AssistantMessage",
    "ToolResultMessage",
    "ToolCall",
    "ToolSpec",
    "OutputSpec",
    "Usage",
    "StreamItem",
    "as_messages",
    "TruncatedStream",
    "OutputError",
    "OutputInvalid",
)
TESTING_PUBLIC = ("ScriptedModel", "Streamed", "ScriptedCall", "Reply", "tool_call")


@pytest.mark.parametrize(
    ("module", "names"), [("fusee.ai", AI_PUBLIC), ("fusee.testing", TESTING_PUBLIC)]
)
def test_the_ai_and_testing_surfaces_are_pinned(module: str, names: tuple[str, ...]) -> None:
    mod = importlib.import_module(module)
    assert mod.__all__ == names
    namespace: dict[str, object] = {}
    exec(f"from {module} import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(names)


def test_importing_fusee_ai_imports_no_provider_sdk() -> None:
    """The SDKs are optional extras: only openai_model()/anthropic_model() import them."""
    import subprocess
    import sys

    code = "import sys, fusee.ai, fusee.testing; print('openai' in sys.modules, 'anthropic' in sys.modules, 'pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]
