"""Workflows of ``tests/integration/test_agent_loop_calls.py`` (fusee.ai.loop): call IDs
and keys across runs, long names, a tool's ``FatalError`` caught as one."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

import fusee
from fusee.ai import ModelRequest, ToolCall, ToolResultMessage, loop
from fusee.testing import ScriptedModel


def charge(order: str, s: fusee.StepInfo) -> str:
    """Charge an order (a payment service that dedupes on the idempotency key)."""
    store = Path(os.environ["LOOP_DIR"]) / "payments"
    store.mkdir(exist_ok=True)
    try:  # the service: one charge per idempotency key
        fd = os.open(store / s.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return f"charged {order}"  # a duplicate request: acknowledged, not applied
    os.write(fd, order.encode())
    os.close(fd)
    return f"charged {order}"


def _call_then_done(call: ToolCall) -> Callable[[ModelRequest, int], Any]:
    """A script that calls ``call``, then answers "done" once it has the result: the same
    reply for the same history, whatever the model object (each activation makes its own)."""

    def reply(request: ModelRequest, n: int) -> Any:
        return "done" if isinstance(request.messages[-1], ToolResultMessage) else [call]

    return reply


@fusee.workflow("loop-noid")
async def noid(ctx: fusee.Context, arg: dict[str, Any]) -> Any:
    """A model (some OpenAI-compatible server) whose tool call has no ID, or ``arg["id"]``."""
    order = msgspec.json.encode({"order": arg["order"]}).decode()
    model = ScriptedModel(
        _call_then_done(ToolCall(id=arg.get("id", ""), name="charge", arguments=order))
    )
    result = await loop(ctx, "agent", model=model, prompt="charge", tools={"charge": charge})
    return msgspec.to_builtins(result)


@fusee.workflow("loop-longname")
async def longname(ctx: fusee.Context, arg: dict[str, Any]) -> Any:
    """A loop name of ``arg["name"]`` characters and a tool ``arg["tool"]`` (both valid)."""
    model = ScriptedModel(
        [[ToolCall(id="c1", name=arg["call"], arguments="{}")], "done"], log=arg["log"]
    )

    def tool_fn() -> str:
        """A tool."""
        return "ok"

    name = "a" * arg["name"]
    result = await loop(ctx, name, model=model, prompt="go", tools={arg["tool"]: tool_fn})
    return msgspec.to_builtins(result)


@fusee.workflow("loop-fatal")
async def fatal_tool(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    """A tool raises FatalError: ``except fusee.FatalError`` around the loop catches it."""

    def locked() -> str:
        """Fails for good."""
        raise fusee.FatalError("the ledger is locked")

    model = ScriptedModel([[ToolCall(id="c1", name="locked", arguments="{}")], "done"])
    try:
        await loop(ctx, "agent", model=model, prompt="go", tools={"locked": locked})
    except fusee.FatalError as e:
        cause = e.__cause__
        return f"caught FatalError: {e} (from {type(cause).__name__})"
    except Exception as e:  # noqa: BLE001 - what the test reports
        return f"got {type(e).__name__}, not FatalError"
    return "no error"
