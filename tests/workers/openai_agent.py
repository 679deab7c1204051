"""A workflow for worker-process tests of ``model_call`` through the real ``openai``
client: one chat completion, streamed, from the OpenAI-compatible server the run's input
names (``tests/fakes/openai_server.py`` in tests).

A run's input is a dict: ``base_url`` (the server's ``.../v1``), ``messages`` (the chat
so far), ``model`` and ``prefill`` (whether the provider continues a stored prefix).
The result is the assistant's whole text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

import fusee
from fusee.ai import model_call


class TruncatedStream(ConnectionError):
    """The provider's stream ended without a ``finish_reason``: the text is cut short."""


async def stream_openai(
    client: AsyncOpenAI, messages: list[dict[str, Any]], resume: str, *, model: str
) -> AsyncIterator[str]:
    """The text chunks of one streamed chat completion, continuing ``resume`` (an
    assistant prefill) when it is not empty.

    The raw client ends its iteration quietly when the stream is closed before the
    final chunk (no ``finish_reason``, no ``[DONE]``); that is a truncated attempt for
    ``model_call``, so it raises :class:`TruncatedStream` instead of ending normally.
    """
    prefill = [{"role": "assistant", "content": resume}] if resume else []
    stream = await client.chat.completions.create(
        model=model,
        messages=cast("list[ChatCompletionMessageParam]", [*messages, *prefill]),
        stream=True,
    )
    finish: str | None = None
    async with stream:
        async for chunk in stream:
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            if choice.delta.content:
                yield choice.delta.content
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    if finish is None:
        raise TruncatedStream("the chat completion stream ended without a finish_reason")


@fusee.workflow("openai_agent")
async def openai_agent(ctx: fusee.Context, arg: dict[str, Any]) -> str:
    messages: list[dict[str, Any]] = arg["messages"]
    async with AsyncOpenAI(
        base_url=arg["base_url"], api_key="test", max_retries=0, timeout=10.0
    ) as client:
        return await model_call(
            ctx,
            "model-0",
            lambda resume: stream_openai(client, messages, resume, model=arg["model"]),
            prefill=bool(arg["prefill"]),
            retry=fusee.Retry(attempts=4, initial="50ms", jitter=0),
            timeout=30,
        )
