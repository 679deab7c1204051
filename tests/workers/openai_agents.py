"""Workflows of the worker-process tests of ``fusee.ai.openai`` (the OpenAI Agents SDK
made durable): an agent with two tools whose model is the real ``openai`` client
(through the SDK's ``OpenAIChatCompletionsModel`` or ``OpenAIResponsesModel``) against
the fake server the input names (``tests/fakes/agents_server.py``).

A run's input is a dict: ``base_url``, ``api`` (``"chat"`` or ``"responses"``),
``question``, and the test's files: ``effects`` (a line per tool execution: ``what key
1``), ``store`` (a file per idempotency key: the side effect, applied once),
``killed``/``kill_at`` (a hook point, ``refund:before``..., where the worker SIGKILLs
itself once, ``tests/workers/agents.py``'s ``hook``), ``pause`` (the model steps
pause when their attempts run out).
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunContextWrapper,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

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


def support_agent(arg: dict[str, Any]) -> Agent[dict[str, Any]]:
    # the client's own retries off (as docs/openai-agents.md says): the step retries
    client = AsyncOpenAI(base_url=arg["base_url"], api_key="test", max_retries=0)
    model: Any
    if arg.get("api") == "responses":
        model = OpenAIResponsesModel(model="fake-gpt", openai_client=client)
    else:
        model = OpenAIChatCompletionsModel(model="fake-gpt", openai_client=client)
    return Agent(
        name="support", instructions="Help with orders.", tools=[lookup_order, refund], model=model
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
