"""Workflows of the worker-process tests of ``fusee.ai.openai`` (the OpenAI Agents SDK
made durable): an agent with two tools whose model is the real ``openai`` client
(through the SDK's ``OpenAIChatCompletionsModel`` or ``OpenAIResponsesModel``) against
the fake server the input names (``tests/fakes/agents_server.py``).

A run's input is a dict: ``base_url``, ``api`` (``"chat"`` or ``"responses"``),
``question``, and the test's files: ``effects`` (a line per tool execution: ``what key
1``), ``store`` (a file per idempotency key: the side effect, applied once),
``killed``/``kill_at`` (a hook point, ``refund:before``..., where the worker SIGKILLs
itself once, ``tests/workers/agents.py``'s ``hook``; the model's points are
``model:<turn>:start`` before its step, ``model:<turn>:answered`` inside it (the
server's answer read, the step not committed) and ``model:<turn>:end`` after its
commit, before the turn's tools), ``pause`` (the model steps pause when their attempts
run out).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from agents import (
    Agent,
    AgentHooks,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunContextWrapper,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

import fusee
from fusee.ai.openai import idempotency_key, run, run_streamed
from tests.workers.agents import apply_once, hook
from tests.workers.effects import record

set_tracing_disabled(True)

FAST = fusee.Retry(attempts=2, initial=0.01, max=0.02)
PAUSE = fusee.Retry(attempts=2, initial=0.01, max=0.02, on_exhausted="pause")


@function_tool
def lookup_order(ctx: RunContextWrapper[dict[str, Any]], order: str) -> str:
    """Look an order up."""
    arg = ctx.context
    hook(arg, f"lookup:{order}:before")
    key = idempotency_key()
    record(arg["effects"], f"lookup:{order}", key, 1)
    apply_once(arg, key, f"looked up {order}")
    hook(arg, f"lookup:{order}:after")
    return f"{order}: shipped"


@function_tool
async def refund(ctx: RunContextWrapper[dict[str, Any]], order: str, amount: int) -> str:
    """Refund part of an order."""
    arg = ctx.context
    hook(arg, "refund:before")
    key = idempotency_key()
    record(arg["effects"], "refund", key, 1)
    apply_once(arg, key, f"refunded {amount} on {order}")
    hook(arg, "refund:after")
    return f"refunded {amount} on {order}"


def _turn(answered: int) -> int:
    """The turn (1, 2, 3) of a request or hook that has seen ``answered`` tool results."""
    return {0: 1, 1: 2}.get(answered, 3)


def _answered(items: Any) -> int:
    return sum(
        1
        for i in items or ()
        if isinstance(i, dict)
        and (i.get("type") == "function_call_output" or i.get("role") == "tool")
    )


class ModelPoints(AgentHooks[dict[str, Any]]):
    """The kill points around a model step (hooks run again on replay: ``hook`` kills once)."""

    async def on_llm_start(self, context: Any, agent: Any, system: Any, items: Any) -> None:
        hook(context.context, f"model:{_turn(_answered(items))}:start")

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        calls = [getattr(i, "call_id", None) for i in response.output]
        turn = 1 if "c1" in calls else 2 if "c2" in calls else 3
        hook(context.context, f"model:{turn}:end")


def _http(arg: dict[str, Any]) -> Any:
    """The client's HTTP client: it kills the worker at ``model:<turn>:answered``, inside
    the model's step, once the server's answer has been read (the default one unless
    that is the test's point)."""
    if not str(arg.get("kill_at", "")).endswith(":answered"):
        return None

    async def answered(response: httpx.Response) -> None:
        await response.aread()
        body = json.loads(response.request.content or b"{}")
        items = body.get("input") if isinstance(body.get("input"), list) else body.get("messages")
        hook(arg, f"model:{_turn(_answered(items))}:answered")

    return DefaultAsyncHttpxClient(event_hooks={"response": [answered]})


def support_agent(arg: dict[str, Any]) -> Agent[dict[str, Any]]:
    # the client's own retries off (as docs/openai-agents.md says): the step retries
    client = AsyncOpenAI(
        base_url=arg["base_url"], api_key="test", max_retries=0, http_client=_http(arg)
    )
    model: Any
    if arg.get("api") == "responses":
        model = OpenAIResponsesModel(model="fake-gpt", openai_client=client)
    else:
        model = OpenAIChatCompletionsModel(model="fake-gpt", openai_client=client)
    return Agent(
        name="support",
        instructions="Help with orders.",
        tools=[lookup_order, refund],
        model=model,
        hooks=ModelPoints(),
    )


@fusee.workflow("oa-support")
async def support(ctx: fusee.Context, arg: dict[str, Any]) -> Any:
    options = {"retry": PAUSE if arg.get("pause") else FAST}
    result = await run(ctx, support_agent(arg), arg["question"], model_options=options, context=arg)
    return result.final_output


@fusee.workflow("oa-streamed")
async def streamed(ctx: fusee.Context, arg: dict[str, Any]) -> Any:
    result = run_streamed(
        ctx, support_agent(arg), arg["question"], model_options={"retry": FAST}, context=arg
    )
    deltas = [e async for e in result.stream_events() if e.type == "raw_response_event"]
    return [result.final_output, len(deltas) > 0]
