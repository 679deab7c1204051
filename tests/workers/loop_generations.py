"""Workflows of tests/integration/test_agent_loop_generations.py: loops across generations, repeated call IDs, a failing approval ask."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

import fusee
from fusee.ai import ModelRequest, ToolCall, ToolResultMessage, loop, workflow_tool
from fusee.testing import ScriptedModel


class Note(msgspec.Struct):
    text: str


@fusee.workflow("rfix-notify")
async def notify(ctx: fusee.Context, n: Note) -> str:
    """Send a notification (one file per send)."""

    def send(s: fusee.StepInfo) -> str:
        store = Path(os.environ["LOOP_DIR"]) / "sent"
        store.mkdir(exist_ok=True)
        (store / s.key).write_text(n.text)
        return f"sent {n.text}"

    out: str = await ctx.step("send", send)
    return out


def _script(text: str, cid: str) -> Any:
    call = ToolCall(id=cid, name="notify", arguments=msgspec.json.encode({"text": text}).decode())

    def reply(request: ModelRequest, n: int) -> Any:
        return "done" if isinstance(request.messages[-1], ToolResultMessage) else [call]

    return reply


@fusee.workflow("rfix-two-loops")
async def two_loops(ctx: fusee.Context, arg: dict[str, Any]) -> Any:
    """Two loops in one run; the server numbers its calls call_0 (llama.cpp-style)."""
    tools = {"notify": workflow_tool(notify)}
    out = []
    for name, text in (("first", arg["t1"]), ("second", arg["t2"])):
        model = ScriptedModel(_script(text, "call_0"))
        r = await loop(ctx, name, model=model, prompt="notify", tools=tools)
        out.append(msgspec.to_builtins(r)["messages"][2]["content"])
    return out


@fusee.workflow("rfix-generations")
async def generations(ctx: fusee.Context, arg: dict[str, Any]) -> Any:
    """One loop per generation (continue_as_new), call IDs numbered call_0."""
    tools = {"notify": workflow_tool(notify)}
    g = arg.get("g", 0)
    model = ScriptedModel(_script(f"{arg['text']}-{g}", "call_0"))
    r = await loop(ctx, "agent", model=model, prompt="notify", tools=tools)
    if g < 1:
        return ctx.continue_as_new({**arg, "g": g + 1})
    return msgspec.to_builtins(r)["messages"][2]["content"]


@fusee.workflow("rfix-stream-generations")
async def stream_generations(ctx: fusee.Context, arg: dict[str, Any]) -> Any:
    """One streamed loop per generation (continue_as_new); the model echoes the prompt."""

    def reply(request: ModelRequest, n: int) -> Any:
        return f"answer to {request.messages[-1].content}"

    g = arg.get("g", 0)
    model = ScriptedModel(reply)
    r = await loop(ctx, "agent", model=model, prompt=f"question {g}", stream=True)
    if g < 1:
        return ctx.continue_as_new({**arg, "g": g + 1})
    return r.text


@fusee.workflow("rfix-ask-fails")
async def ask_fails(ctx: fusee.Context, arg: dict[str, Any]) -> Any:
    """The approval's ask (posting to a chat) fails for good."""
    from fusee.ai import tool

    def refund(order: str) -> str:
        """Refund an order."""
        return f"refunded {order}"

    def ask(cb: Any) -> None:
        raise RuntimeError("chat is down")

    call = ToolCall(id="c1", name="refund", arguments='{"order": "o-1"}')

    def reply(request: ModelRequest, n: int) -> Any:
        return "done" if isinstance(request.messages[-1], ToolResultMessage) else [call]

    r = await loop(
        ctx,
        "agent",
        model=ScriptedModel(reply),
        prompt="refund",
        tools={"refund": tool(refund, approve=ask)},
    )
    return msgspec.to_builtins(r)["messages"][2]["content"]


@fusee.workflow("rfix-taken-child")
async def taken_child(ctx: fusee.Context, arg: dict[str, Any]) -> Any:
    """The child ID the loop's workflow tool call will take is taken first, by a child
    of another input: the call's result is the error, the run goes on."""
    from fusee.actors.context import generation_key

    taken = f"{ctx.run_id}/call_0-{generation_key(ctx, 'agent/tool-0-notify')}"
    await ctx.child(notify, taken, Note(text="someone else"))
    model = ScriptedModel(_script("mine", "call_0"))
    r = await loop(
        ctx, "agent", model=model, prompt="notify", tools={"notify": workflow_tool(notify)}
    )
    return msgspec.to_builtins(r)["messages"][2]


@fusee.workflow("rfix-two-streamed-loops")
async def two_streamed_loops(ctx: fusee.Context, arg: dict[str, Any]) -> Any:
    """Two streamed loops of one name in a run: the second's streams are the first's."""
    model = ScriptedModel(lambda request, n: "hi")
    await loop(ctx, "agent", model=model, prompt="one", stream=True)
    await loop(ctx, "agent", model=model, prompt="two", stream=True)
    return "both"
