"""``generate``: one model call as a durable step, with structured output and a durable
re-ask.

The call is the step ``name`` (:func:`fusee.ai.model_step`): a replay returns the
journaled answer without calling the model. With ``output=`` the answer is parsed into
that type, and ``validate`` runs on the parsed value; an answer that fails either is
re-asked with the error fed back, each re-ask its own step (``name#reask-1``, ...), at
most ``reask`` of them. Parsing and validating run in the workflow's code on the
journaled text, so a replay takes the same path without asking the model again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Generic, TypeVar, overload

from fusee.actors.context import Context
from fusee.ai.errors import OutputInvalid
from fusee.ai.model_step import model_step
from fusee.ai.output import Invalid, OutputType, output_type
from fusee.ai.types import (
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    Usage,
    UserMessage,
    as_messages,
    check_model,
)
from fusee.errors import InvalidArgument
from fusee.runtime.ids import validate_name
from fusee.runtime.retry import Retry

__all__ = ("generate", "Generation", "reask_step")

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Generation(Generic[T]):
    """What :func:`generate` returns.

    ``text``: the answer's text (for structured output, its JSON); ``output``: the parsed
    value (``None`` without ``output=``); ``usage``: the tokens of every step of the call
    (re-asks included); ``model``: the model that answered; ``response``: the last step's
    journaled response; ``messages``: the conversation, the answer last; ``reasks``: how
    many re-asks it took."""

    text: str
    output: T
    usage: Usage
    model: str
    response: ModelResponse
    messages: list[Message]
    reasks: int = 0


def reask_step(name: str, k: int) -> str:
    """The step name of re-ask ``k`` of ``name`` (``name`` itself for ``k == 0``)."""
    return name if k == 0 else f"{name}#reask-{k}"


# Two signatures for one function: ``output=Triage`` gives a ``Generation[Triage]``, any
# other output (none, a schema dict, ``T | None``, ``Optional[T]``) a ``Generation[Any]``.
# One signature cannot say both: ``output: type[T] | Any`` loses ``T``, and a defaulted
# TypeVar refuses ``Optional[T]`` (a special form, not a ``type``) under mypy.
@overload
async def generate(
    ctx: Context,
    name: str,
    *,
    model: Model,
    prompt: str | None = ...,
    messages: list[Message] | list[dict[str, Any]] | None = ...,
    output: type[T],
    validate: Callable[[T], str | bool | None] | None = ...,
    reask: int = ...,
    stream: bool = ...,
    retry: Retry | None = ...,
    timeout: str | float | timedelta | None = ...,
    limit: str | None = ...,
    fairness_key: str | None = ...,
) -> Generation[T]: ...


@overload
async def generate(
    ctx: Context,
    name: str,
    *,
    model: Model,
    prompt: str | None = ...,
    messages: list[Message] | list[dict[str, Any]] | None = ...,
    output: dict[str, Any] | Any = ...,
    validate: Callable[[Any], str | bool | None] | None = ...,
    reask: int = ...,
    stream: bool = ...,
    retry: Retry | None = ...,
    timeout: str | float | timedelta | None = ...,
    limit: str | None = ...,
    fairness_key: str | None = ...,
) -> Generation[Any]: ...


async def generate(
    ctx: Context,
    name: str,
    *,
    model: Model,
    prompt: str | None = None,
    messages: list[Message] | list[dict[str, Any]] | None = None,
    output: Any = None,
    validate: Callable[[Any], str | bool | None] | None = None,
    reask: int = 0,
    stream: bool = False,
    retry: Retry | None = None,
    timeout: str | float | timedelta | None = None,
    limit: str | None = None,
    fairness_key: str | None = None,
) -> Generation[Any]:
    """Ask ``model`` once, as the durable step ``name``; with ``output=``, for an answer
    of that type.

    ``prompt=`` (one user message) or ``messages=`` (a conversation). ``output=`` a
    msgspec Struct, a pydantic model, a dataclass, a TypedDict, another type msgspec
    knows, or a JSON Schema dict (the answer is the decoded JSON, validated with
    ``jsonschema``). ``validate(value)`` returns ``None`` (or ``True``) when the value
    is good, and a message (or ``False``) when it is not; raising ``ValueError`` or
    ``AssertionError`` says the same. A bad answer (not JSON, not of the type, refused
    by ``validate``) is re-asked with the error fed back, each re-ask a durable step
    ``name#reask-<k>``, at most ``reask`` times. ``stream=True``: each step is a token
    stream of its name (``engine.run(id).stream(name)``), resumed from the stored text
    after a crash when the model can continue it. ``retry``, ``timeout``, ``limit`` and
    ``fairness_key`` are :meth:`Context.step`'s, for each step.

    Raises:
        OutputInvalid: the answer was still bad after ``reask`` re-asks (names the step
            and the last error).
        OutputError: ``output`` cannot be made a JSON Schema (before any step).
        InvalidArgument: ``prompt=`` and ``messages=`` both or neither, ``reask`` not
            an int >= 0, ``model`` not a model, ``validate`` not callable.
        StepFailedError: the model failed for good.

    Example:
        ``triage = await generate(ctx, "classify", model=model, prompt=p, output=Triage, reask=3)``
    """
    name = validate_name(name, "generate step name")
    where = f"generate {name!r}"
    history = as_messages(prompt, messages, where=where)
    if not isinstance(reask, int) or isinstance(reask, bool) or reask < 0:
        raise InvalidArgument(f"{where}: reask={reask!r}, expected an int >= 0")
    if validate is not None and not callable(validate):
        raise InvalidArgument(f"{where}: validate={validate!r} is not callable")
    model = check_model(model, where=where)
    shape = output_type(output, where=where) if output is not None else None
    validate_name(reask_step(name, reask), "generate step name")  # the last one fits too
    usage = Usage()
    error = ""
    for k in range(reask + 1):
        step = reask_step(name, k)
        request = ModelRequest(messages=history, output=shape.spec if shape else None)
        response = await model_step(
            ctx,
            step,
            model,
            request,
            stream=stream,
            retry=retry,
            timeout=timeout,
            limit=limit,
            fairness_key=fairness_key,
        )
        usage = usage + response.usage
        history = [*history, response.message()]
        try:
            value = _check(response, shape, validate)
        except Invalid as e:
            error = str(e)
            history = [*history, UserMessage(_feedback(error, shape))]
            continue
        return Generation(
            text=response.text,
            output=value,
            usage=usage,
            model=response.model,
            response=response,
            messages=history,
            reasks=k,
        )
    last = reask_step(name, reask)
    raise OutputInvalid(
        f"{where}: the answer of step {last!r} is still invalid after {reask} re-ask(s): {error}",
        step=last,
        error=error,
        attempts=reask + 1,
    )


def _check(
    response: ModelResponse,
    shape: OutputType[Any] | None,
    validate: Callable[[Any], str | bool | None] | None,
) -> Any:
    value: Any = shape.parse(response.text) if shape is not None else None
    if validate is None:
        return value
    try:
        verdict = validate(value if shape is not None else response.text)
    except (ValueError, AssertionError) as e:
        raise Invalid(str(e) or type(e).__name__) from None
    if verdict is None or verdict is True:
        return value
    if verdict is False:
        raise Invalid("the answer did not pass validation")
    if isinstance(verdict, str):
        raise Invalid(verdict)
    raise InvalidArgument(
        f"validate returned a {type(verdict).__name__}; return None when the value is "
        f"good and a message (str) when it is not"
    )


def _feedback(error: str, shape: OutputType[Any] | None) -> str:
    if shape is None:
        return f"Your answer was not accepted: {error}\nPlease answer again."
    return (
        f"Your answer was not accepted: {error}\n"
        f"Answer again with only a JSON value that matches the schema {shape.spec.name!r}."
    )
