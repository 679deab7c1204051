"""The OpenAI Agents SDK made durable: ``run`` is ``Runner.run`` with the agent's model
calls and function tools as fusee steps (the extra ``fusee[openai-agents]``).

- A model call is the step ``model`` (with :func:`run_streamed`, ``model-<i>``: its
  text deltas are the token stream of that name, readable live with
  ``engine.run(id).stream("model-0")``, and a stream's name is unique in a run).
- A function tool call is the step ``tool:<name>``. Inside it,
  :func:`idempotency_key` is ``<step key>-<tool call id>``: unique per run (a bare
  call ID repeats across runs of a scripted model or a server that numbers its calls).
- An input or output guardrail's function is the step ``guardrail:<name>``.
- The agents it hands off to are made durable too (recursively, cycles included);
  hosted tools (web search, file search...) run on the provider's side, inside the
  model step. Tools that run locally outside a step (``ComputerTool``,
  ``LocalShellTool``, a local ``ShellTool``, ``ApplyPatchTool``, ``CustomTool``,
  ``mcp_servers``...) are refused, and so is a ``session=``.
- A tool with ``needs_approval`` becomes a completion wait (``ctx.await_completion``,
  a callback URL): the run parks until a person approves or rejects the call, and the
  SDK's ``RunState.approve``/``reject`` resumes it with that answer.

Outside a workflow (no :func:`run`, no :func:`bind`) a durable agent is an ordinary
agent, so the same agent serves tests and scripts.

Example:
    ``result = await run(ctx, agent, question, model_options={"retry": fusee.Retry(on_exhausted="pause")})``
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, cast

try:
    from agents import (
        Agent,
        FunctionTool,
        GuardrailFunctionOutput,
        Handoff,
        InputGuardrail,
        Model,
        ModelProvider,
        MultiProvider,
        RunConfig,
        Runner,
        RunResult,
        RunResultStreaming,
    )
    from agents import (
        tool as agents_tool,
    )
    from agents.items import ModelResponse, TResponseStreamEvent
    from pydantic import TypeAdapter
    from pydantic_core import to_jsonable_python
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError(
        "fusee.ai.openai needs the OpenAI Agents SDK: pip install 'fusee[openai-agents]'"
    ) from e


from fusee.actors.context import Context, concurrent_calls
from fusee.actors.steps import StepInfo, in_step
from fusee.ai._agents_approval import decide
from fusee.ai._agents_stream import streamed_events
from fusee.errors import ConfigError

__all__ = ("run", "run_streamed", "durable_agent", "bind", "idempotency_key", "REFUSED_TOOLS")

_MODEL_RESPONSE: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)
_EVENTS: TypeAdapter[list[TResponseStreamEvent]] = TypeAdapter(list[TResponseStreamEvent])

# What a step's options may hold (ctx.step's keyword arguments).
_STEP_OPTIONS = frozenset({"retry", "timeout", "limit", "fairness_key"})

# Tools that run on the provider's side, inside the model's request (so inside its step).
_HOSTED = tuple(
    getattr(agents_tool, name)
    for name in (
        "FileSearchTool",
        "WebSearchTool",
        "CodeInterpreterTool",
        "ImageGenerationTool",
        "ToolSearchTool",  # newer SDKs only
    )
    if hasattr(agents_tool, name)
)
REFUSED_TOOLS = (
    "ComputerTool",
    "LocalShellTool",
    "ShellTool (local environment)",
    "ApplyPatchTool",
    "CustomTool",
    "HostedMCPTool with on_approval_request",
    "ProgrammaticToolCallingTool",
)
"""The tool kinds a durable agent refuses: they run local code the SDK calls outside
any function tool, so no step could hold their effect."""


# -- the run in progress ------------------------------------------------------------------


@dataclass
class _Bound:
    """The workflow a durable agent's calls are steps of."""

    ctx: Context
    streams: Iterator[int]  # the next streamed model step's number


# A run's stream numbers, per context (one activation's code, replayed from the start).
_STREAMS: weakref.WeakKeyDictionary[Context, Iterator[int]] = weakref.WeakKeyDictionary()
_BOUND: ContextVar[_Bound | None] = ContextVar("fusee_openai_agents", default=None)
_TOOL_KEY: ContextVar[str | None] = ContextVar("fusee_openai_tool_key", default=None)


def _counter() -> Iterator[int]:
    i = 0
    while True:
        yield i
        i += 1


@contextlib.contextmanager
def bind(ctx: Context) -> Iterator[None]:
    """Make the durable agents called in this block steps of ``ctx``'s run (for code
    that calls ``Runner`` itself with a :func:`durable_agent`; :func:`run` binds itself).

    Example:
        ``with bind(ctx): result = await Runner.run(durable_agent(agent), question)``
    """
    if not isinstance(ctx, Context):
        raise ConfigError(f"fusee.ai.openai: {ctx!r} is not a workflow's ctx")
    streams = _STREAMS.get(ctx)
    if streams is None:
        streams = _STREAMS[ctx] = _counter()
    token = _BOUND.set(_Bound(ctx, streams))
    try:
        yield
    finally:
        _BOUND.reset(token)


def _active() -> _Bound | None:
    """The bound workflow, unless the caller is inside one of its steps (an agent run as
    a tool is one step: its own model calls are part of it)."""
    bound = _BOUND.get()
    if bound is None or in_step() is not None:
        return None
    return bound


def idempotency_key() -> str:
    """Inside a durable function tool: ``<step key>-<tool call id>``, the same on every
    attempt and after a crash, different in every run (pass it to the services the tool
    changes). Outside a step it is an error.

    Raises:
        ConfigError: not called inside a durable tool call.

    Example:
        ``payments.refund(order, amount, idempotency_key=idempotency_key())``
    """
    key = _TOOL_KEY.get()
    if key is None:
        raise ConfigError("idempotency_key(): not inside a durable tool call (fusee.ai.openai)")
    return key


# -- options --------------------------------------------------------------------------


def _step_options(options: Any, where: str) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"{where}: {options!r} is not a dict of step options")
    unknown = set(options) - _STEP_OPTIONS
    if unknown:
        raise ConfigError(
            f"{where}: unknown step option(s) {sorted(unknown)}; a step takes "
            f"{sorted(_STEP_OPTIONS)}"
        )
    return dict(options)


def _tool_options(options: Any) -> Callable[[str], dict[str, Any] | None]:
    """``tool_options``: ``{"refund": {...}, "*": {...}}`` (``False``: no step) ->
    a tool's options, or None for a tool called without a step."""
    if options is None:
        return lambda name: {}
    if not isinstance(options, Mapping):
        raise ConfigError(
            f"tool_options={options!r}: a dict of tool name (or '*') -> step options or False"
        )
    table: dict[str, dict[str, Any] | None] = {}
    for name, value in options.items():
        where = f"tool_options[{name!r}]"
        table[name] = None if value is False else _step_options(value, where)
    default = table.get("*", {})

    def of(name: str) -> dict[str, Any] | None:
        if name not in table:
            return default
        own = table[name]
        if own is None or default is None:
            return own
        return {**default, **own}

    return of


# -- the model ------------------------------------------------------------------------


def _default_model(name: str | None) -> Model:
    """A model given by name, from the SDK's default provider with an OpenAI client
    whose own retries are off: the step's policy retries, with durable waits (the
    client's would wait inside one attempt)."""
    from openai import AsyncOpenAI

    return MultiProvider(openai_client=AsyncOpenAI(max_retries=0)).get_model(name)


class DurableModel(Model):
    """A model whose requests are steps (``model``, or ``model-<i>`` when streamed) of
    the bound run; an ordinary model outside one."""

    def __init__(self, inner: Model | str | None, options: Mapping[str, Any] | None = None):
        self._inner = inner
        self._options = _step_options(options, "model_options")

    @property
    def inner(self) -> Model:
        if not isinstance(self._inner, Model):  # a name: the SDK's default provider's
            self._inner = _default_model(self._inner)
        return self._inner

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        bound = _active()
        if bound is None:
            return await self.inner.get_response(*args, **kwargs)

        async def call() -> Any:
            response = await self.inner.get_response(*args, **kwargs)
            return _MODEL_RESPONSE.dump_python(response, mode="json", by_alias=True)

        payload = await bound.ctx.step("model", call, **self._options)
        return _MODEL_RESPONSE.validate_python(payload)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        return self._stream(args, kwargs)

    async def _stream(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncIterator[TResponseStreamEvent]:
        bound = _active()
        if bound is None:
            async for event in self.inner.stream_response(*args, **kwargs):
                yield event
            return
        name = f"model-{next(bound.streams)}"
        payload = await streamed_events(
            bound.ctx, name, lambda: self.inner.stream_response(*args, **kwargs), self._options
        )
        for event in _EVENTS.validate_python(payload):
            yield event

    def get_retry_advice(self, request: Any) -> Any:
        return self.inner.get_retry_advice(request)

    async def close(self) -> None:
        if isinstance(self._inner, Model):
            await self._inner.close()


class _DurableProvider(ModelProvider):
    """The run's provider with each model it gives made durable."""

    def __init__(self, inner: ModelProvider, options: Mapping[str, Any] | None) -> None:
        self._inner = inner
        self._options = options

    def get_model(self, model_name: str | None) -> Model:
        return DurableModel(self._inner.get_model(model_name), self._options)

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()


# -- tools, guardrails, handoffs --------------------------------------------------------


def _jsonable(value: Any) -> Any:
    return to_jsonable_python(value, fallback=str, by_alias=True)


class _DurableInvoker:
    """A function tool's ``on_invoke_tool`` as the step ``tool:<name>``.

    Attribute reads go to the SDK's invoker (approvals and introspection read
    ``prepare_arguments`` and ``_get_wrapped_callable``), but not dunders: the
    SDK rebinds an invoker that has ``__agents_bind_function_tool__`` when a tool is
    copied, which would put the original back and drop the step."""

    def __init__(self, tool: FunctionTool, options: dict[str, Any]) -> None:
        self._inner = tool.on_invoke_tool
        self._name = tool.name
        self._options = options
        if getattr(self._inner, "__agents_sync_function_tool__", False):
            self.__agents_sync_function_tool__ = True

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        return getattr(self._inner, item)

    async def __call__(self, tool_context: Any, arguments: str) -> Any:
        bound = _active()
        if bound is None:
            return await self._inner(tool_context, arguments)
        call_id = tool_context.tool_call_id

        async def call(s: StepInfo) -> Any:
            token = _TOOL_KEY.set(f"{s.key}-{call_id}")
            try:
                return _jsonable(await self._inner(tool_context, arguments))
            finally:
                _TOOL_KEY.reset(token)

        # the SDK runs a turn's calls as tasks of its own: their commits take turns
        with concurrent_calls(bound.ctx):
            return await bound.ctx.step(f"tool:{self._name}", call, **self._options)


def _durable_guardrail(guardrail: Any) -> Any:
    """An input or output guardrail whose function is the step ``guardrail:<name>``."""
    name = guardrail.get_name()
    fn = guardrail.guardrail_function

    async def checked(context: Any, agent: Any, value: Any) -> GuardrailFunctionOutput:
        async def call() -> Any:
            out = fn(context, agent, value)
            if inspect.isawaitable(out):
                out = await out
            return {"info": _jsonable(out.output_info), "tripped": out.tripwire_triggered}

        bound = _active()
        if bound is None:
            out = fn(context, agent, value)
            plain: GuardrailFunctionOutput = await out if inspect.isawaitable(out) else out
            return plain
        with concurrent_calls(bound.ctx):  # output guardrails run at once, as tasks
            payload = await bound.ctx.step(f"guardrail:{name}", call)
        return GuardrailFunctionOutput(
            output_info=payload["info"], tripwire_triggered=payload["tripped"]
        )

    changes: dict[str, Any] = {"guardrail_function": checked, "name": name}
    if isinstance(guardrail, InputGuardrail):
        # Beside the model call, a tripwire cancels that call's step wherever it is, and
        # a replay (the model's step journaled) would take another path: run it first.
        changes["run_in_parallel"] = False
    return dataclasses.replace(guardrail, **changes)


def _refusal(agent: Agent[Any], tool: Any) -> str | None:
    """Why ``tool`` cannot be made durable, or None."""
    kind = type(tool).__name__
    if isinstance(tool, (FunctionTool, *_HOSTED)):
        return None
    if isinstance(tool, agents_tool.HostedMCPTool):
        if tool.on_approval_request is None:
            return None
        return "a HostedMCPTool with on_approval_request (a local callback outside any step)"
    if isinstance(tool, agents_tool.ShellTool):
        environment: Mapping[str, Any] = cast("Mapping[str, Any]", tool.environment or {})
        if environment.get("type") != "local":
            return None  # a hosted container: the provider runs it
        return "a ShellTool with a local environment, which runs commands outside any step"
    return f"a {kind}, which runs local code outside any step"


@dataclass
class _Maker:
    """Makes durable copies of agents, once each (handoffs may form cycles)."""

    model_options: Mapping[str, Any] | None
    tool_options: Callable[[str], dict[str, Any] | None]
    resolve_names: bool  # durable_agent alone: a model name goes to the default provider
    seen: dict[int, Agent[Any]] = field(default_factory=dict)

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        if not isinstance(agent, Agent):
            raise ConfigError(f"fusee.ai.openai: {agent!r} is not an agents.Agent")
        made = self.seen.get(id(agent))
        if made is not None:
            return made
        _check(agent)
        model = agent.model
        if isinstance(model, Model) or self.resolve_names:
            model = DurableModel(model, self.model_options)
        clone = agent.clone(model=model)
        self.seen[id(agent)] = clone
        clone.tools = [self._tool(t) for t in agent.tools]
        clone.handoffs = [self._handoff(h) for h in agent.handoffs]
        clone.input_guardrails = [_durable_guardrail(g) for g in agent.input_guardrails]
        clone.output_guardrails = [_durable_guardrail(g) for g in agent.output_guardrails]
        return clone

    def _tool(self, tool: Any) -> Any:
        if not isinstance(tool, FunctionTool):
            return tool  # hosted: inside the model step
        options = self.tool_options(tool.name)
        if options is None:
            return tool
        return dataclasses.replace(tool, on_invoke_tool=_DurableInvoker(tool, options))

    def _handoff(self, handoff: Agent[Any] | Handoff[Any, Any]) -> Any:
        if isinstance(handoff, Agent):
            return self.agent(handoff)
        invoke = handoff.on_invoke_handoff

        async def durable_target(context: Any, arguments: str) -> Any:
            return self.agent(await invoke(context, arguments))

        return dataclasses.replace(handoff, on_invoke_handoff=durable_target)


def _check(agent: Agent[Any]) -> None:
    """Refuse what cannot be made durable, naming it.

    Raises:
        ConfigError: a tool kind that runs local code, MCP servers, or runner retries.
    """
    where = f"agent {agent.name!r}"
    for tool in agent.tools:
        why = _refusal(agent, tool)
        if why is not None:
            raise ConfigError(
                f"{where}: tool {getattr(tool, 'name', type(tool).__name__)!r} is {why}; "
                f"a durable agent cannot journal it (make it a function tool)"
            )
    if agent.mcp_servers:
        names = [getattr(s, "name", type(s).__name__) for s in agent.mcp_servers]
        raise ConfigError(
            f"{where}: mcp_servers {names} list and call their tools outside any step; "
            f"wrap the calls you need in function tools (or use a HostedMCPTool)"
        )
    if getattr(agent.model_settings, "retry", None) is not None:
        raise ConfigError(
            f"{where}: model_settings.retry is the runner's retry, which waits in memory "
            f"between attempts; use model_options={{'retry': fusee.Retry(...)}} (durable waits)"
        )


def durable_agent(
    agent: Agent[Any],
    *,
    model_options: Mapping[str, Any] | None = None,
    tool_options: Mapping[str, Any] | None = None,
) -> Agent[Any]:
    """The durable copy of ``agent`` (and of the agents it hands off to): in a workflow
    (:func:`bind`) its model calls and function tools are steps; outside one it is an
    ordinary agent. A model given by name is resolved by the SDK's default provider
    (:func:`run` uses the run's ``model_provider``).

    Raises:
        ConfigError: a tool that cannot be made durable (named), ``mcp_servers``,
            ``model_settings.retry``, or bad options.

    Example:
        ``durable = durable_agent(agent, tool_options={"refund": {"retry": fusee.Retry(attempts=5)}})``
    """
    return _Maker(model_options, _tool_options(tool_options), resolve_names=True).agent(agent)


# -- running --------------------------------------------------------------------------


def _prepare(
    ctx: Context,
    agent: Agent[Any],
    model_options: Mapping[str, Any] | None,
    tool_options: Mapping[str, Any] | None,
    runner_kwargs: dict[str, Any],
) -> tuple[Agent[Any], dict[str, Any]]:
    if not isinstance(ctx, Context):
        raise ConfigError(f"fusee.ai.openai.run: {ctx!r} is not a workflow's ctx")
    if runner_kwargs.get("session") is not None:
        raise ConfigError(
            "fusee.ai.openai.run: session= keeps the conversation outside the journal; "
            "a durable run replays its history from its steps (pass the history as input)"
        )
    durable = _Maker(model_options, _tool_options(tool_options), resolve_names=False).agent(agent)
    config = runner_kwargs.pop("run_config", None)
    if config is None:
        # Traces of a replay would be exported again, with new IDs: off unless asked for.
        config = RunConfig(tracing_disabled=True)
    elif isinstance(config, Mapping):
        config = RunConfig(**config)
    if getattr(config.model_settings, "retry", None) is not None:
        raise ConfigError(
            "fusee.ai.openai.run: run_config.model_settings.retry waits in memory between "
            "attempts; use model_options={'retry': fusee.Retry(...)}"
        )
    model = config.model
    config = dataclasses.replace(
        config,
        model=DurableModel(model, model_options) if isinstance(model, Model) else model,
        model_provider=_DurableProvider(config.model_provider, model_options),
        group_id=config.group_id or ctx.run_id,  # a stable prompt-cache key
    )
    return durable, {**runner_kwargs, "run_config": config}


async def run(
    ctx: Context,
    agent: Agent[Any],
    input: Any,  # noqa: A002 - Runner.run's name
    *,
    model_options: Mapping[str, Any] | None = None,
    tool_options: Mapping[str, Any] | None = None,
    approve: Callable[..., Any] | None = None,
    approve_timeout: str | float | None = None,
    **runner_kwargs: Any,
) -> RunResult:
    """``Runner.run(agent, input, **runner_kwargs)`` as part of the workflow: model calls
    are steps ``model``, function tools ``tool:<name>``, guardrails ``guardrail:<name>``.

    ``model_options`` and ``tool_options`` are the steps' options (``retry``,
    ``timeout``, ``limit``, ``fairness_key``); ``tool_options`` maps a tool's name, or
    ``"*"``, to its options, ``False`` calls it without a step. A call of a tool with
    ``needs_approval`` waits for a completion ``approve:<tool>:<call id>``: ``approve(cb)``
    (or ``approve(cb, item)``, the SDK's ``ToolApprovalItem``) runs once to put ``cb.url``
    in front of someone; ``True`` or ``{"approved": true}`` approves, anything else
    rejects (``{"approved": false, "reason": r}`` tells the model ``r``).

    Raises:
        ConfigError: the agent has what cannot be made durable (named), or ``session=``.
        StepFailedError: a model call or a tool with ``failure_error_function=None``
            failed for good (a paused step pauses the run instead).

    Example:
        ``result = await run(ctx, agent, question, model_options={"retry": fusee.Retry(on_exhausted="pause")})``
    """
    durable, kwargs = _prepare(ctx, agent, model_options, tool_options, runner_kwargs)
    with bind(ctx):
        result = await Runner.run(durable, input, **kwargs)
        while result.interruptions:
            state = result.to_state()
            for item in result.interruptions:
                await decide(ctx, state, item, approve, approve_timeout)
            result = await Runner.run(durable, state, **kwargs)
    return result


def run_streamed(
    ctx: Context,
    agent: Agent[Any],
    input: Any,  # noqa: A002 - Runner.run_streamed's name
    *,
    model_options: Mapping[str, Any] | None = None,
    tool_options: Mapping[str, Any] | None = None,
    **runner_kwargs: Any,
) -> RunResultStreaming:
    """``Runner.run_streamed`` as part of the workflow: as :func:`run`, but each model
    call is the step ``model-<i>`` (0, 1, ... in the run) whose text deltas go live to
    the token stream of that name (``engine.run(id).stream("model-0")``). The events
    the result yields come once each model step has ended (they are its journaled
    value, the same live and on replay). Approvals are left to the caller
    (``result.interruptions``).

    Example:
        ``result = run_streamed(ctx, agent, question); async for e in result.stream_events(): ...``
    """
    durable, kwargs = _prepare(ctx, agent, model_options, tool_options, runner_kwargs)
    with bind(ctx):  # the runner's task copies the context as it is made
        return Runner.run_streamed(durable, input, **kwargs)
