"""``loop``: the agent loop, each model turn and each tool call a durable step.

Turn ``i`` is the step ``<name>/turn-<i>`` (a request to the model, or the user's
``turn(state, i)``); each tool call it asks for is the step ``<name>/tool-<i>-<tool>``
whose ``s.key`` is ``<the step's own key>-<tool call id>`` (unique per run, the call's
ID visible), a child run ``<run id>/<tool call id>-<key>`` for a workflow tool (``key``
hashes the step name and the generation), and, for a
tool behind an approval, first the completion ``<name>/approve-<i>-<tool>``. The calls
of one turn run at once (``ctx.all``). A replay returns what the journal holds: the
model is not asked again for a turn it answered, and a tool call that ended does not
run again.

What the model gets back for a call that went wrong is the call's result, never a
failure of the loop: an unknown tool, arguments that are not JSON or do not match the
tool's schema, a tool that raised (after its retries), a workflow tool's run that
failed or was cancelled, a refused or timed-out approval. A ``FatalError`` (raised by
a tool, or failing a workflow tool's run) fails the loop at once with a ``FatalError``
(the turn's other calls cancelled).

Example:
    ``result = await loop(ctx, "agent", model=model, prompt=question, tools={"search": search})``
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeAlias

import msgspec

from fusee.actors.context import Context, generation_key, token_stream
from fusee.actors.steps import StepInfo
from fusee.ai.model_step import model_step
from fusee.ai.tools import (
    Tool,
    ToolInputError,
    UnknownTool,
    WorkflowTool,
    as_tool,
    ask_for,
    check_tool_name,
    content_of,
)
from fusee.ai.types import (
    AssistantMessage,
    Message,
    Model,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    Usage,
    as_messages,
    check_model,
)
from fusee.errors import (
    ConfigError,
    FatalError,
    InvalidArgument,
    InvalidId,
    RunCancelled,
    RunExists,
    RunFailed,
    StepFailedError,
    Timeout,
)
from fusee.runtime.durations import format_duration
from fusee.runtime.ids import MAX_ID_BYTES, MAX_NAME_BYTES, validate_name
from fusee.runtime.retry import Retry

__all__ = ("loop", "Turn", "LoopResult", "LoopState", "approval_verdict")

Turn: TypeAlias = ModelResponse
"""What a turn returns: the model's text and the tool calls it asks for (a
:class:`~fusee.ai.ModelResponse`). A ``turn=`` function may also return a str (a final
answer) or a dict of the same shape."""

_FATAL = "fusee.FatalError"
_OURS = ("fusee.ToolInputError", "fusee.UnknownTool")  # their message is the result
_ERROR_STEP = Retry(attempts=1)
_INVALID = "invalid-name"  # the step name's label of a tool name that is none
_UNKNOWN = "unknown-tool"  # of an unknown tool whose name makes the step name too long
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_MAX_CALL_ID = 128
_MAX_STEP = MAX_NAME_BYTES
_HASHED = 16  # hex characters of a hashed call ID in a child's ID


class LoopResult(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`loop` returns.

    Attributes:
        text: the last turn's text (the final answer).
        messages: the whole conversation: the prompt or messages given, each turn's
            assistant message and each tool call's result.
        usage: the tokens of every turn, added up.
        iterations: how many turns the loop took.
        stopped: ``stop=`` ended the loop (else the model answered without tool calls).
    """

    text: str
    messages: list[Message]
    usage: Usage
    iterations: int
    stopped: bool = False


@dataclass(frozen=True)
class LoopState:
    """What ``turn(state, i)`` and ``stop(state, i)`` see.

    Attributes:
        name: the loop's name.
        run_id: the run's ID.
        iteration: the turn's number, from 0.
        prompt: the ``prompt=`` given (``None`` with ``messages=``).
        history: the conversation so far (a copy: changing it changes nothing).
        tools: the tools as the model sees them.
        usage: the tokens of the turns so far.
        last: the last turn's answer (``None`` before the first turn).
        results: the results of the last turn's tool calls.
        step: in ``turn=``, the turn step's :class:`~fusee.StepInfo` (``s.key``,
            ``s.signal``); ``None`` in ``stop=``.
    """

    name: str
    run_id: str
    iteration: int
    prompt: str | None
    history: list[Message]
    tools: list[ToolSpec]
    usage: Usage
    last: ModelResponse | None = None
    results: list[ToolResultMessage] = field(default_factory=list)
    step: StepInfo | None = None


TurnFn: TypeAlias = Callable[[LoopState, int], Any]
StopFn: TypeAlias = Callable[[LoopState, int], bool | Awaitable[bool]]


async def loop(
    ctx: Context,
    name: str,
    *,
    model: Model | None = None,
    turn: TurnFn | None = None,
    prompt: str | None = None,
    messages: list[Message] | list[dict[str, Any]] | None = None,
    tools: Mapping[str, Any] | None = None,
    max_iterations: int = 10,
    stop: StopFn | None = None,
    parallel_tools: bool = True,
    stream: bool = False,
    retry: Retry | None = None,
    timeout: str | float | timedelta | None = None,
    limit: str | None = None,
    fairness_key: str | None = None,
) -> LoopResult:
    """Run the agent loop ``name``: ask the model, run the tools it calls, give it the
    results, until it answers without a tool call (or ``stop`` says so).

    Args:
        model: the model each turn asks (a :class:`~fusee.ai.Model`); or
        turn: ``turn(state, i) -> Turn`` (sync or async) calls a model itself; it runs
            as the turn's step (it must not call ``ctx``) and may return a
            :data:`Turn`, a str (a final answer) or a dict of a Turn's shape.
        prompt: the user's message; or ``messages=`` the conversation so far.
        tools: ``{name: tool}``: a function (one step per call), a
            :func:`~fusee.ai.workflow_tool` (a child run per call), or a
            :func:`~fusee.ai.tool` (options, an approval).
        max_iterations: the most turns the loop takes (at least 1); a model still
            calling tools after them fails the loop with ``FatalError``.
        stop: ``stop(state, i)``, workflow code (it may call ``ctx``, sync or async),
            asked after each turn's tool calls; true ends the loop with that turn.
        parallel_tools: run the tool calls of one turn at once (``ctx.all``); else in
            the order the model gave them.
        stream: each turn with ``model=`` is a token stream named after its step
            (``engine.run(id).stream("agent/turn-0")``).
        retry: each turn's retry policy (default: the workflow's); also ``timeout`` (an
            attempt's), ``limit`` and ``fairness_key``, as for ``ctx.step``.

    Returns:
        A :class:`LoopResult`: the final text, the whole conversation, the usage.

    Raises:
        FatalError: ``max_iterations`` turns went by and the model still calls tools,
            or a tool raised ``FatalError`` (or a workflow tool's run failed with it):
            the turn's other calls are cancelled, the original error is its cause.
        StepFailedError: a turn failed for good (the model's errors, after retries).
        InvalidArgument: a wrong argument (``max_iterations=0``, both ``model=`` and
            ``turn=``, a loop or tool name that makes a step name over 128 bytes, a run
            ID too long for a workflow tool's child, ``stream=True`` for a second loop
            of one name in a run...), raised before anything is journaled.
        ConfigError: a tool that cannot be one (its parameters have no JSON Schema).

    Example:
        ``result = await loop(ctx, "agent", model=model, prompt=q, tools={"search_kb": search_kb})``
    """
    where = f"loop {name!r}"
    name = validate_name(name, "loop name")
    if (model is None) == (turn is None):
        raise InvalidArgument(f"{where}: give model= or turn=, exactly one of them")
    if model is not None:
        model = check_model(model, where=where)
    if turn is not None and not callable(turn):
        raise InvalidArgument(f"{where}: turn={turn!r} is not callable (turn(state, i) -> Turn)")
    if stop is not None and not callable(stop):
        raise InvalidArgument(f"{where}: stop={stop!r} is not callable (stop(state, i) -> bool)")
    if (
        isinstance(max_iterations, bool)
        or not isinstance(max_iterations, int)
        or max_iterations < 1
    ):
        raise InvalidArgument(
            f"{where}: max_iterations={max_iterations!r}; give an int of at least 1 (the "
            f"most model turns the loop may take)"
        )
    if stream and model is None:
        raise InvalidArgument(
            f"{where}: stream=True streams a model= turn; turn= streams on its own"
        )
    if stream:
        _check_stream(ctx, name, where)
    toolset = _toolset(tools, where)
    _check_names(ctx, name, max_iterations, toolset, where)
    history = as_messages(prompt, messages, where=where)
    specs = [t.spec(n) for n, t in toolset.items()]
    seen: set[str] = set()  # tool-call IDs so far: each names one step, one child
    for m in history:
        if isinstance(m, AssistantMessage):
            seen.update(c.id for c in m.tool_calls)
    usage = Usage()
    last: ModelResponse | None = None
    results: list[ToolResultMessage] = []
    for i in range(max_iterations):
        state = LoopState(name, ctx.run_id, i, prompt, list(history), specs, usage, last, results)
        step = f"{name}/turn-{i}"
        if model is not None:
            request = ModelRequest(messages=state.history, tools=specs)
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
        else:
            assert turn is not None
            response = await ctx.step(
                step,
                _turn_step(turn, state, i, where),
                retry=retry,
                timeout=timeout,
                type=ModelResponse,
                limit=limit,
                fairness_key=fairness_key,
            )
        usage = usage + response.usage
        calls = _with_ids(ctx, response.tool_calls, seen)
        history.append(AssistantMessage(content=response.text, tool_calls=calls))
        last = response
        if not calls:
            return LoopResult(text=response.text, messages=history, usage=usage, iterations=i + 1)
        results = await _run_calls(ctx, where, name, i, calls, toolset, parallel_tools)
        history.extend(results)
        if stop is not None:
            state = LoopState(
                name, ctx.run_id, i, prompt, list(history), specs, usage, last, results
            )
            verdict = stop(state, i)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            if verdict:
                return LoopResult(
                    text=response.text,
                    messages=history,
                    usage=usage,
                    iterations=i + 1,
                    stopped=True,
                )
    asked = ", ".join(c.name for c in calls)
    raise FatalError(
        f"{where}: no final answer after {max_iterations} turn(s) (max_iterations="
        f"{max_iterations}); the last turn still called {asked}"
    )


def approval_verdict(value: Any) -> tuple[bool, str | None]:
    """A completion's value as an approval: ``(approved, reason)``. ``True`` and
    ``{"approved": true}`` approve; ``False`` and ``{"approved": false, "reason": ...}``
    refuse; anything else refuses, saying what came."""
    if value is True:
        return True, None
    if value is False or value is None:
        return False, None
    if isinstance(value, dict) and isinstance(value.get("approved"), bool):
        reason = value.get("reason")
        return value["approved"], None if reason is None else str(reason)
    return (
        False,
        f"the approval's value {msgspec.json.encode(value).decode()} is neither true nor {{'approved': ...}}",
    )


# -- one turn's tool calls ----------------------------------------------------------


@dataclass
class _Call:
    """One tool call of a turn, on its way to its result."""

    call: ToolCall
    step: str  # <name>/tool-<i>-<tool>
    approval: str  # <name>/approve-<i>-<tool>
    tool: Tool | WorkflowTool | None
    where: str  # the loop, as an error names it
    value: Any = None  # the validated arguments (a function's) or input (a workflow's)
    error: ToolInputError | UnknownTool | None = None
    result: ToolResultMessage | None = None


async def _run_calls(
    ctx: Context,
    where: str,
    name: str,
    i: int,
    calls: list[ToolCall],
    toolset: dict[str, Tool | WorkflowTool],
    parallel: bool,
) -> list[ToolResultMessage]:
    """The results of turn ``i``'s calls, in the order the model gave them. An approval
    is a call of its own, so with ``parallel`` the turn runs in two rounds: every call
    that needs no approval and every approval at once, then the approved tools at once.
    A call's errors are its result (:func:`_kept`) but a fatal one, which fails the
    round fast: the other calls are cancelled (an approval no longer waited for)."""
    plans = [_plan(where, name, i, call, toolset) for call in calls]
    if parallel and len(plans) > 1:
        first = await ctx.all([_kept(p, _first, ctx) for p in plans])
        approved = [p for p, out in zip(plans, first, strict=True) if _took(p, out)]
        if approved:
            second = await ctx.all([_kept(p, _run, ctx) for p in approved])
            for p, out in zip(approved, second, strict=True):
                p.result = _result(p, out)
    else:
        for p in plans:
            if _took(p, await _kept(p, _first, ctx)):
                p.result = _result(p, await _kept(p, _run, ctx))
    results: list[ToolResultMessage] = []
    for p in plans:
        assert p.result is not None
        results.append(p.result)
    return results


def _plan(
    where: str, name: str, i: int, call: ToolCall, toolset: dict[str, Tool | WorkflowTool]
) -> _Call:
    tool = toolset.get(call.name)
    label = call.name if tool is not None else _unknown_label(name, i, call.name)
    plan = _Call(call, f"{name}/tool-{i}-{label}", f"{name}/approve-{i}-{label}", tool, where)
    if plan.tool is None:
        known = ", ".join(sorted(toolset)) or "none"
        plan.error = UnknownTool(f"there is no tool {call.name!r}; the tools are: {known}")
        return plan
    try:
        plan.value = plan.tool.arguments.parse(call.name, call.arguments)
    except ToolInputError as e:
        plan.error = e
    return plan


def _first(ctx: Context, p: _Call) -> Awaitable[Any]:
    """The call's first durable call: its error's step, its approval, or its run."""
    if p.error is not None:
        return ctx.step(p.step, _raiser(p.error), retry=_ERROR_STEP)
    assert p.tool is not None
    if p.tool.approve is not None:
        return ctx.await_completion(
            p.approval, ask=ask_for(p.tool.approve, p.call), timeout=p.tool.approve_timeout
        )
    return _run(ctx, p)


def _run(ctx: Context, p: _Call) -> Awaitable[Any]:
    """The call's tool: a step (``s.key`` its own key and the tool-call ID), or a child
    run."""
    tool = p.tool
    if isinstance(tool, Tool):
        return ctx.step(
            p.step,
            tool.step_fn(p.value, p.call.id),
            retry=tool.retry,
            timeout=tool.timeout,
            limit=tool.limit,
            fairness_key=tool.fairness_key,
        )
    assert isinstance(tool, WorkflowTool)
    target = tool.target if tool.target is not None else tool.workflow
    child = _child_id(ctx.run_id, p.call.id, generation_key(ctx, p.step))
    return ctx.child(target, child, p.value, timeout=tool.timeout)


async def _kept(p: _Call, call: Callable[[Context, _Call], Awaitable[Any]], ctx: Context) -> Any:
    """``call(ctx, p)``'s value, or the error the model is to read as a value: a tool
    that failed (not fatally), a workflow tool's run failed or cancelled, an approval
    that timed out, a workflow tool's child ID taken by a run not this call's.

    Raises:
        FatalError: the tool raised ``FatalError``, or the workflow tool's run failed
            with it (the original error its cause).
    """
    try:
        return await call(ctx, p)
    except (StepFailedError, RunFailed) as e:  # RunCancelled is a RunFailed
        if e.error_type == _FATAL and not isinstance(e, RunCancelled):
            raise FatalError(
                f"{p.where}: tool {p.call.name!r} (call {p.call.id}) failed with FatalError: "
                f"{e.message}"
            ) from e
        return e
    except (Timeout, RunExists) as e:
        return e


def _took(p: _Call, out: Any) -> bool:
    """``out`` ended the call's first call: whether the tool runs now (its approval
    came), else the call's result is set."""
    if p.error is None and p.tool is not None and p.tool.approve is not None:
        if isinstance(out, Timeout):
            wait = p.tool.approve_timeout
            took = f" within {format_duration(wait)}" if wait is not None else ""
            p.result = _message(p, f"the call was not approved{took}: it did not run", error=True)
            return False
        if isinstance(out, StepFailedError):  # its ask(cb) failed for good
            p.result = _message(
                p,
                f"the approval could not be asked: {out.error_type}: {out.message}; "
                f"the tool did not run",
                error=True,
            )
            return False
        ok, reason = approval_verdict(out)
        if ok:
            return True
        why = f": {reason}" if reason else ""
        p.result = _message(p, f"the call was not approved, so it did not run{why}")
        return False
    p.result = _result(p, out)
    return False


def _result(p: _Call, out: Any) -> ToolResultMessage:
    """The model's view of how the call's tool ended (``out``: its value, or an error
    :func:`_kept` kept)."""
    tool = p.call.name
    match out:
        case StepFailedError() if out.error_type in _OURS:
            return _message(p, out.message, error=True)
        case StepFailedError():
            return _message(p, f"tool {tool!r} failed: {out.error_type}: {out.message}", error=True)
        case RunCancelled():
            return _message(p, f"tool {tool!r} was cancelled: {out.reason}", error=True)
        case RunFailed():
            return _message(p, f"tool {tool!r} failed: {out.error_type}: {out.message}", error=True)
        case Timeout():
            return _message(p, f"tool {tool!r} timed out: {out}", error=True)
        case RunExists():
            return _message(p, f"tool {tool!r} could not start its run: {out}", error=True)
    return _message(p, content_of(out))


def _message(p: _Call, content: str, *, error: bool = False) -> ToolResultMessage:
    return ToolResultMessage(
        tool_call_id=p.call.id, name=p.call.name, content=content, is_error=error
    )


def _raiser(error: Exception) -> Callable[[], Any]:
    def fail() -> Any:
        raise error

    return fail


# -- turns ---------------------------------------------------------------------------


def _turn_step(turn: TurnFn, state: LoopState, i: int, where: str) -> Callable[[StepInfo], Any]:
    """The step function of a ``turn=`` turn: sync or async as ``turn`` is."""

    def at(s: StepInfo) -> LoopState:
        return LoopState(
            state.name,
            state.run_id,
            i,
            state.prompt,
            list(state.history),
            state.tools,
            state.usage,
            state.last,
            state.results,
            s,
        )

    if inspect.iscoroutinefunction(turn):

        async def run_async(s: StepInfo) -> ModelResponse:
            return _as_turn(await turn(at(s), i), where)

        return run_async

    def run(s: StepInfo) -> Any:
        out = turn(at(s), i)
        if inspect.isawaitable(out):
            return _awaited_turn(out, where)
        return _as_turn(out, where)

    return run


async def _awaited_turn(out: Awaitable[Any], where: str) -> ModelResponse:
    return _as_turn(await out, where)


def _as_turn(value: Any, where: str) -> ModelResponse:
    """What ``turn=`` returned, as a :data:`Turn`.

    Raises:
        FatalError: it is none (a programming error: retrying would not help).
    """
    if isinstance(value, ModelResponse):
        return value
    if isinstance(value, str):
        return ModelResponse(text=value)
    if isinstance(value, AssistantMessage):
        return ModelResponse(text=value.content, tool_calls=list(value.tool_calls))
    if isinstance(value, dict):
        try:
            return msgspec.convert(value, ModelResponse)
        except msgspec.ValidationError as e:
            raise FatalError(f"{where}: turn= returned a dict that is no Turn ({e})") from None
    raise FatalError(
        f"{where}: turn= returned a {type(value).__name__}; return a fusee.ai.Turn "
        f"(text=, tool_calls=), a str or a dict of that shape"
    )


# -- the tools and their calls' IDs ------------------------------------------------------


def _toolset(tools: Mapping[str, Any] | None, where: str) -> dict[str, Tool | WorkflowTool]:
    if tools is None:
        return {}
    if not isinstance(tools, Mapping):
        raise InvalidArgument(
            f"{where}: tools= must be a dict of name -> tool, got {type(tools).__name__}"
        )
    out: dict[str, Tool | WorkflowTool] = {}
    for n, value in tools.items():
        check_tool_name(n, where)
        try:
            out[n] = as_tool(n, value)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    return out


def _with_ids(ctx: Context, calls: list[ToolCall], seen: set[str]) -> list[ToolCall]:
    """The turn's calls, each with an ID no other call of the loop has: a model (some
    OpenAI-compatible servers, a ``turn=`` function) may give none, or repeat one, and
    an ID names the call's child run and is in its step's ``s.key``. A missing, unusable
    or repeated ID is made ``call_<32 hex>`` from ``ctx.uuid()``: journaled (a replay
    makes the same), different in every run and generation, and of the characters every
    provider takes back (Anthropic's ``tool_use.id``: ``a-z A-Z 0-9 _ -``)."""
    out = []
    for call in calls:
        cid = call.id
        if not _usable(cid) or cid in seen:
            cid = f"call_{ctx.uuid().hex}"
            call = msgspec.structs.replace(call, id=cid)
        seen.add(cid)
        out.append(call)
    return out


def _child_id(run_id: str, call_id: str, key: str) -> str:
    """A workflow tool's child run: ``<run id>/<call id>-<key>`` (``key``: the call's
    step name and the run's generation, hashed), both hashed together (16 hex characters
    of their BLAKE2b) when that would be over 256 bytes. A server that numbers its calls
    (``call_0`` in every request) gives the same call ID in two loops of a run or in two
    generations: the key keeps their children apart."""
    whole = f"{run_id}/{call_id}-{key}"
    if len(whole.encode()) <= MAX_ID_BYTES:
        return whole
    digest = hashlib.blake2b(f"{call_id}-{key}".encode(), digest_size=_HASHED // 2)
    return f"{run_id}/{digest.hexdigest()}"


def _check_names(
    ctx: Context,
    name: str,
    max_iterations: int,
    toolset: dict[str, Tool | WorkflowTool],
    where: str,
) -> None:
    """Every name the loop may make fits (128 bytes a step name, 256 a child's ID).

    Raises:
        InvalidArgument: the longest of them does not.
    """
    last = max_iterations - 1
    labels = [*toolset, _INVALID, _UNKNOWN]
    longest = [f"{name}/turn-{last}", f"{name}/tool-{last}-{max(labels, key=len)}"]
    approved = [n for n, t in toolset.items() if t.approve is not None]
    if approved:
        longest.append(f"ask/{name}/approve-{last}-{max(approved, key=len)}")
    for made in longest:
        try:
            validate_name(made, "step name")
        except InvalidId as e:
            raise InvalidArgument(
                f"{where}: its step names would be too long ({e}); give the loop or its "
                f"tools shorter names, or fewer max_iterations"
            ) from None
    if any(isinstance(t, WorkflowTool) for t in toolset.values()):
        child = f"{ctx.run_id}/{'0' * _HASHED}"
        if len(child.encode()) > MAX_ID_BYTES:
            raise InvalidArgument(
                f"{where}: the run ID is {len(ctx.run_id.encode())} bytes, too long for a "
                f"workflow tool's child run ID (<run id>/<call id>-<key>, at most {MAX_ID_BYTES} "
                f"bytes with the call ID hashed to {_HASHED} characters)"
            )


def _check_stream(ctx: Context, name: str, where: str) -> None:
    """The loop's turns can stream: no earlier step of the generation is named
    ``<name>/turn-0`` (a loop of that name ran before, whose streams these would be).

    Raises:
        InvalidArgument: one is.
        FuseeError: the store keeps no token streams.
    """
    try:
        token_stream(ctx, f"{name}/turn-0")
    except InvalidArgument:
        raise InvalidArgument(
            f"{where}: stream=True, and an earlier loop of this run is named {name!r}: its "
            f"turns' token streams have this loop's names; give each streamed loop of a run "
            f"its own name ('{name}-2')"
        ) from None


def _unknown_label(name: str, i: int, tool: str) -> str:
    """An unknown tool's label in its step name: its name, unless that is no tool name
    or makes the step name too long."""
    if not _plain(tool):
        return _INVALID
    if len(f"{name}/tool-{i}-{tool}".encode()) > _MAX_STEP:
        return _UNKNOWN
    return tool


def _usable(cid: str) -> bool:
    return bool(cid) and len(cid) <= _MAX_CALL_ID and set(cid) <= _ID_CHARS


def _plain(tool: str) -> bool:
    try:
        check_tool_name(tool, "")
    except ConfigError:
        return False
    return True
