"""Workflows of the Pydantic AI adapter's worker tests (``tests/e2e/test_pydantic_ai_worker.py``,
``tests/chaos/test_pydantic_ai_chaos.py``): the ``support`` agent, two tools, Pydantic AI's
OpenAI Chat model over the real ``openai`` client against the test's fake server
(``FUSEE_TEST_OPENAI_URL``).

The tools are a payment service that dedupes on the idempotency key (``tool_key()``):
one file per key in ``deps["store"]``, and one line per execution in ``deps["effects"]``.
``deps["kill_at"]`` (``<tool>:before`` / ``<tool>:after`` its side effect, or
``model:refund``: right after the model response that asks for the refund reached the
workflow, its step journaled) makes the worker running it SIGKILL itself there, once
per run (``deps["killed"]`` marks it). ``deps["stream"]`` runs the agent with
``run_stream`` (every request a streamed one).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import fusee
from fusee.ai.pydantic import FuseeDurability, run, tool_key
from tests.workers.effects import record_line

URL = os.environ.get("FUSEE_TEST_OPENAI_URL", "http://127.0.0.1:9/v1")


def _model() -> OpenAIChatModel:
    # the PID lets the fake server SIGKILL this worker mid-request (AgentFake.kill_at)
    client = AsyncOpenAI(
        base_url=URL, api_key="test", default_headers={"X-Fake-Pid": str(os.getpid())}
    )
    return OpenAIChatModel("fake-gpt", provider=OpenAIProvider(openai_client=client))


def _hook(deps: dict[str, Any], point: str) -> None:
    if deps.get("kill_at") == point and not os.path.exists(deps["killed"]):
        Path(deps["killed"]).write_text(f"{point} {os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGKILL)


def _apply(deps: dict[str, Any], tool: str, effect: str) -> None:
    key = tool_key()
    assert key is not None
    _hook(deps, f"{tool}:before")
    record_line(deps["effects"], f"{tool} {key}")
    store = Path(deps["store"])
    store.mkdir(exist_ok=True)
    try:  # the service: one effect per idempotency key
        fd = os.open(store / key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        pass
    else:
        os.write(fd, effect.encode())
        os.close(fd)
    _hook(deps, f"{tool}:after")


async def lookup_order(ctx: RunContext[dict[str, Any]], order: str) -> str:
    """Look an order up."""
    _apply(ctx.deps, "lookup_order", f"looked up {order}")
    return f"{order}: shipped"


def refund(ctx: RunContext[dict[str, Any]], order: str, amount: int) -> str:
    """Refund part of an order."""
    _apply(ctx.deps, "refund", f"refunded {order} {amount}")
    return f"refunded {amount} on {order}"


class KillAfterModel(AbstractCapability[dict[str, Any]]):
    """The ``model:<tool>`` kill point: in the workflow, after a model response asking
    for ``<tool>`` came back from its step."""

    async def after_model_request(
        self,
        ctx: RunContext[dict[str, Any]],
        *,
        request_context: ModelRequestContext,
        response: ModelResponse,
    ) -> ModelResponse:
        for part in response.parts:
            if isinstance(part, ToolCallPart):
                _hook(ctx.deps, f"model:{part.tool_name}")
        return response


FAST = fusee.Retry(attempts=2, initial=0.05, max=0.1, on_exhausted="pause")

support = Agent(
    _model(),
    name="support",
    deps_type=dict,
    tools=[lookup_order, refund],
    capabilities=[KillAfterModel(), FuseeDurability(model_options={"retry": FAST})],
)


@fusee.workflow("pyd_support")
async def support_wf(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    if arg.get("stream"):  # the same turns as streamed requests

        async def streamed() -> str:
            async with support.run_stream(arg["prompt"], deps=arg) as result:
                return await result.get_output()

        return await run(ctx, streamed)
    result = await run(ctx, lambda: support.run(arg["prompt"], deps=arg))
    return result.output
