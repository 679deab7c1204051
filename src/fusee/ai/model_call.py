"""``model_call``: a model call as a durable step whose tokens are a stream.

Each chunk the model yields is appended to the run's token stream as it arrives
(pipelined), and the whole text is the step's result, journaled once. Readers follow
the stream from any process with ``engine.run(id).stream(name)``.

How an attempt ends decides what it is:

- the chunk iterator **finishes normally**: the provider finished. The end marker is
  stored (for a model step, with the final response less its text as its payload),
  then the step's result is journaled. An adapter over a provider whose stream
  can be cut silently (an SSE stream without its terminator ends quietly in the raw
  OpenAI client) must raise when the terminal event (``finish_reason``,
  ``response.completed``, ``message_stop``) is missing.
- it **raises**, is **cancelled** (the step's timeout) or its process **dies**: the
  attempt is truncated, never a result. The step's retry policy retries it, and the
  next attempt gets the stored text as ``resume``.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, Awaitable, Callable
from datetime import timedelta
from typing import TypeAlias, TypeVar

import anyio
import msgspec

from fusee.actors.context import Context, token_stream
from fusee.actors.ports import TokenSink, TokenWriterPort
from fusee.actors.steps import StepInfo
from fusee.ai.types import ModelResponse
from fusee.errors import FuseeError, NotEncodable
from fusee.runtime.ids import validate_name
from fusee.runtime.retry import Retry

__all__ = ("model_call", "streamed_step", "Chunks", "Items", "TokenSink", "TokenWriterPort")

Chunks: TypeAlias = AsyncIterable[str] | Awaitable[AsyncIterable[str]]
"""What ``fn(resume)`` returns: an async iterator of text chunks (or an awaitable of one)."""

Items: TypeAlias = AsyncIterable[str | ModelResponse]
"""What a streamed model step's ``fn(resume)`` returns: text chunks, then a
:class:`ModelResponse` (``Model.stream``)."""

T = TypeVar("T")

FLUSH_ON_FAILURE = 2.0  # seconds a failed attempt waits for its in-flight tokens to be stored


async def model_call(
    ctx: Context,
    name: str,
    fn: Callable[[str], Chunks],
    *,
    retry: Retry | None = None,
    timeout: str | float | timedelta | None = None,
    prefill: bool = True,
    limit: str | None = None,
    fairness_key: str | None = None,
) -> str:
    """Call a model as the durable step ``name``, streaming its tokens as stream ``name``.

    ``fn(resume)`` returns an async iterator of text chunks. ``resume`` is ``""`` on the
    first attempt; on a retry or after a crash it is the text already stored for this
    step, and ``fn`` continues from it (a provider prefill): the result is ``resume``
    plus the new text. With ``prefill=False`` the provider cannot continue: ``fn``
    always gets ``""``, the stream records an attempt boundary, and the new attempt's
    tokens follow it. ``retry``, ``timeout``, ``limit`` and ``fairness_key`` are
    :meth:`Context.step`'s.

    Returns:
        The whole text of the final attempt. On replay, the journaled text (the token
        stream is not touched).

    Raises:
        StepFailedError: the call failed for good (its last attempt raised).
        InvalidArgument: another step of this run already has the name ``name``
            (a stream name is unique in a run).

    Example:
        ``text = await model_call(ctx, f"model-{turn}", lambda resume: llm.stream(history, prefill=resume))``
    """
    result: str = await streamed_step(
        ctx,
        name,
        fn,
        prefill=prefill,
        finish=lambda text, final: text,
        type=str,
        retry=retry,
        timeout=timeout,
        limit=limit,
        fairness_key=fairness_key,
    )
    return result


async def streamed_step(
    ctx: Context,
    name: str,
    fn: Callable[[str], Chunks] | Callable[[str], Items],
    *,
    prefill: bool,
    finish: Callable[[str, ModelResponse | None], T],
    type: type[T],  # noqa: A002 - ctx.step's name
    needs_final: bool = False,
    retry: Retry | None = None,
    timeout: str | float | timedelta | None = None,
    limit: str | None = None,
    fairness_key: str | None = None,
) -> T:
    """The durable step of :func:`model_call` and of a streamed model step
    (``fusee.ai.model_step``): ``fn(resume)`` yields text chunks, and for a model,
    a last :class:`ModelResponse`; ``finish(stored text, that response or None)`` is
    the step's result (``None``: the iterator gave none).

    The final response, less its text, is the payload of the stream's end marker, so
    when an attempt stored the end marker and its worker died before the result was
    journaled, the next attempt rebuilds the result from the stored stream without
    calling ``fn``. ``needs_final``: an end marker without that payload (one written
    before payloads were, or one whose response was too big for a message) does not
    make a result: the step starts over behind an attempt marker.
    """
    name = validate_name(name, "model call name")
    stream = token_stream(ctx, name)

    async def attempt(s: StepInfo) -> T:
        writer = await stream.open()
        try:
            text, final = await _attempt(writer, fn, prefill, needs_final)
            return finish(text, final)
        except BaseException:
            # A truncated attempt: let what was sent be stored (or fail) before the
            # retry reads the stream back, so the next attempt resumes from a settled
            # stream. Shielded, bounded: the attempt may have been cancelled.
            with anyio.CancelScope(shield=True), anyio.move_on_after(FLUSH_ON_FAILURE):
                try:
                    await writer.flush()
                except FuseeError:
                    pass  # the next attempt reads what landed
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await writer.close()

    result: T = await ctx.step(
        name,
        attempt,
        retry=retry,
        timeout=timeout,
        type=type,
        limit=limit,
        fairness_key=fairness_key,
    )
    return result


async def _attempt(
    writer: TokenWriterPort,
    fn: Callable[[str], Chunks] | Callable[[str], Items],
    prefill: bool,
    needs_final: bool,
) -> tuple[str, ModelResponse | None]:
    state = writer.state
    if state.ended and not state.broken:
        # The provider finished in an attempt whose result was not journaled (its
        # worker died between the end marker and the commit): that text, and the final
        # response stored with the marker, are the result.
        stored = _stored_final(state.final)
        if stored is not None or not needs_final:
            return state.text, stored
        await writer.restart()  # the response is not stored: ask again
    if state.chunks and (state.broken or state.ended or not prefill):
        await writer.restart()
    resume = state.text
    chunks = fn(resume)
    if inspect.isawaitable(chunks):
        chunks = await chunks
    if not isinstance(chunks, AsyncIterable):
        raise NotEncodable(
            f"model_call: fn(resume) returned {type(chunks).__name__}, not an async "
            f"iterator of text chunks"
        )
    final: ModelResponse | None = None
    async for chunk in chunks:
        if isinstance(chunk, ModelResponse) and final is None:
            final = chunk  # the model's last item: usage, finish reason, tool calls
            continue
        if final is not None:
            raise NotEncodable("model_call: a chunk came after the model's final response")
        if not isinstance(chunk, str):
            raise NotEncodable(
                f"model_call: fn yielded a {type(chunk).__name__}; chunks must be str"
            )
        await writer.write(chunk)
    await writer.end(
        msgspec.json.encode(msgspec.structs.replace(final, text="")) if final is not None else b""
    )
    return state.text, final


def _stored_final(payload: bytes) -> ModelResponse | None:
    """The final response an end marker stored (its text empty), or None."""
    if not payload:
        return None
    try:
        return msgspec.json.decode(payload, type=ModelResponse)
    except msgspec.MsgspecError:
        return None
