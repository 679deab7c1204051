"""A streamed model step of ``fusee.ai.openai`` (``run_streamed``): the Agents SDK
model's stream events journaled as one list, its text deltas a live token stream."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from agents.items import TResponseStreamEvent
from pydantic import TypeAdapter

from fusee.actors.context import Context, token_stream
from fusee.ai.errors import TruncatedStream
from fusee.ai.model_call import FLUSH_ON_FAILURE
from fusee.errors import FuseeError

__all__ = ("streamed_events",)

_EVENT: TypeAdapter[TResponseStreamEvent] = TypeAdapter(TResponseStreamEvent)


async def streamed_events(
    ctx: Context,
    name: str,
    stream: Callable[[], AsyncIterator[TResponseStreamEvent]],
    options: dict[str, Any],
) -> Any:
    """The step ``name``: the model's stream events, journaled as one list, its text
    deltas written to the token stream ``name`` as they come.

    An attempt whose stream ends without ``response.completed`` (a cut SSE stream ends
    quietly in the openai client) raises ``TruncatedStream`` and is retried. The events
    are the end marker's payload, so a worker that died between the marker and the
    commit leaves a result the next attempt takes without asking the model again."""
    tokens = token_stream(ctx, name)

    async def attempt() -> Any:
        writer = await tokens.open()
        try:
            state = writer.state
            if state.ended and not state.broken and state.final:
                return json.loads(state.final)
            if state.chunks:  # the Agents SDK's models cannot continue a prefix
                await writer.restart()
            events: list[Any] = []
            completed = False
            async for event in stream():
                events.append(_EVENT.dump_python(event, mode="json", by_alias=True))
                kind = getattr(event, "type", "")
                if kind == "response.output_text.delta":
                    await writer.write(str(event.delta))  # type: ignore[union-attr]
                completed = completed or kind == "response.completed"
            if not completed:
                raise TruncatedStream(f"model step {name!r}: the stream ended without its response")
            await writer.end(json.dumps(events, separators=(",", ":")).encode())
            return events
        except BaseException:
            # Let what was sent be stored before a retry reads the stream back.
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(FLUSH_ON_FAILURE),
                contextlib.suppress(FuseeError),
            ):
                await writer.flush()
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await writer.close()

    return await ctx.step(name, attempt, **options)
