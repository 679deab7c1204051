"""``model_step``: one model request as one durable step.

The building block of ``generate`` and ``loop``: the request is sent once, its
:class:`ModelResponse` journaled, and a replay returns it without calling the model.
With ``stream=True`` the step is a token stream (``model_call``): its text chunks are
readable with ``engine.run(id).stream(name)`` while it runs, and a retry or a crash
resumes from the stored text when the model can continue it (``supports_prefill``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import msgspec

from fusee.actors.context import Context
from fusee.ai.errors import TruncatedStream
from fusee.ai.model_call import streamed_step
from fusee.ai.types import Model, ModelRequest, ModelResponse, StreamItem, check_model
from fusee.errors import InvalidArgument, NotEncodable
from fusee.runtime.retry import Retry

__all__ = ("model_step",)


async def model_step(
    ctx: Context,
    name: str,
    model: Model,
    request: ModelRequest,
    *,
    stream: bool = False,
    retry: Retry | None = None,
    timeout: str | float | timedelta | None = None,
    limit: str | None = None,
    fairness_key: str | None = None,
) -> ModelResponse:
    """Ask ``model`` once, as the durable step ``name``; the journaled response.

    ``retry``, ``timeout``, ``limit`` and ``fairness_key`` are :meth:`Context.step`'s
    (a model's own SDK retries are off: the step's policy retries).

    Raises:
        StepFailedError: the model failed for good.
        InvalidArgument: ``model`` is not a :class:`Model`, or ``request`` not a
            :class:`ModelRequest`.

    Example:
        ``reply = await model_step(ctx, "agent/turn-0", model, ModelRequest(messages=history))``
    """
    model = check_model(model, where=f"model step {name!r}")
    if not isinstance(request, ModelRequest):
        raise InvalidArgument(
            f"model step {name!r}: the request is a {type(request).__name__}, not a ModelRequest"
        )
    model_name = model.name

    def named(response: ModelResponse) -> ModelResponse:
        if not isinstance(response, ModelResponse):
            raise NotEncodable(
                f"model step {name!r}: {type(model).__name__} answered a "
                f"{type(response).__name__}, not a ModelResponse"
            )
        return response if response.model else msgspec.structs.replace(response, model=model_name)

    if not stream:

        async def call() -> ModelResponse:
            return named(await model.complete(request))

        response: ModelResponse = await ctx.step(
            name,
            call,
            retry=retry,
            timeout=timeout,
            type=ModelResponse,
            limit=limit,
            fairness_key=fairness_key,
        )
        return response

    async def items(resume: str) -> AsyncIterator[StreamItem]:
        final = None
        async for item in model.stream(request, resume):
            if isinstance(item, ModelResponse):
                final = item
            yield item
        if final is None:
            raise TruncatedStream(
                f"model step {name!r}: {model_name}'s stream ended without its final response"
            )

    def finish(text: str, final: ModelResponse | None) -> ModelResponse:
        if final is None:  # items() raises first: a model step's stream has its response
            raise TruncatedStream(f"model step {name!r}: no final response from {model_name}")
        return named(msgspec.structs.replace(final, text=text))

    streamed: ModelResponse = await streamed_step(
        ctx,
        name,
        items,
        prefill=model.supports_prefill,
        finish=finish,
        type=ModelResponse,
        needs_final=True,
        retry=retry,
        timeout=timeout,
        limit=limit,
        fairness_key=fairness_key,
    )
    return streamed
