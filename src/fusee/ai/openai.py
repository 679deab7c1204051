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
import importlib
import inspect
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, cast

import anyio

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
    from agents.exceptions import ToolTimeoutError
    from agents.items import ModelResponse, TResponseStreamEvent
    from agents.models import _openai_shared as openai_defaults
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
from fusee.ai._agents_turns import Turnstile
from fusee.errors import ConfigError, DeterminismError

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
    # the last model response's function calls: their steps take positions in its order
    turn: Turnstile = field(default_factory=Turnstile)
    # held from a model response to the next model call (the SDK's tool phase, whose
    # hooks, tools and guardrails run as tasks of its own): commits take turns
    _hold: contextlib.ExitStack | None = None

    def hold(self) -> None:
        if self._hold is None:
            self._hold = contextlib.ExitStack()
            self._hold.enter_context(concurrent_calls(self.ctx))

    def release(self) -> None:
        if self._hold is not None:
            hold, self._hold = self._hold, None
            hold.close()


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
    bound = _Bound(ctx, streams)
    token = _BOUND.set(bound)
    try:
        yield
    finally:
        bound.release()
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


def _default_client() -> Any:
    """The SDK's default provider with an OpenAI client whose own retries are off: the
    step's policy retries, with durable waits (the client's would wait inside one
    attempt). The client is the SDK's default one (``set_default_openai_client``) or
    the one its default key or the environment (``OPENAI_API_KEY``,
    ``OPENAI_BASE_URL``) gives."""
    from openai import AsyncOpenAI

    client = openai_defaults.get_default_openai_client()
    if client is not None:
        client = client.with_options(max_retries=0)
    else:
        client = AsyncOpenAI(api_key=openai_defaults.get_default_openai_key(), max_retries=0)
    return client


def _default_model(name: str | None) -> Model:
    """A model given by name, from the SDK's default provider over :func:`_default_client`."""
    return MultiProvider(openai_client=_default_client()).get_model(name)


def _function_calls(items: Any) -> list[tuple[str, str]]:
    """The (tool name, call ID) of each function call in a response's output items."""
    calls = []
    for item in items or ():
        get = item.get if isinstance(item, Mapping) else lambda k, i=item: getattr(i, k, None)
        if get("type") == "function_call" and get("call_id"):
            calls.append((str(get("name")), str(get("call_id"))))
    return calls


def _in_turn(tools: Any) -> set[str]:
    """The names of the tools whose calls take their steps in the response's order:
    durable function tools the SDK calls at once (no approval, no tool input
    guardrail: a call the SDK skips would hold the later ones up)."""
    return {
        t.name
        for t in tools or ()
        if isinstance(t, FunctionTool)
        and isinstance(t.on_invoke_tool, _DurableInvoker)
        and t.needs_approval is False
        and not t.tool_input_guardrails
    }


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

        bound.release()  # the tool phase before it has ended
        payload = await bound.ctx.step("model", call, **self._options)
        _start_tools(bound, payload.get("output"), _tools_of(args, kwargs))
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
        bound.release()
        payload = await streamed_events(
            bound.ctx, name, lambda: self.inner.stream_response(*args, **kwargs), self._options
        )
        output = [
            e["item"]
            for e in payload
            if isinstance(e, Mapping) and e.get("type") == "response.output_item.done"
        ]
        _start_tools(bound, output, _tools_of(args, kwargs))
        for event in _EVENTS.validate_python(payload):
            yield event

    def get_retry_advice(self, request: Any) -> Any:
        return self.inner.get_retry_advice(request)

    def _supports_default_prompt_cache_key(self) -> bool:
        """The SDK's (duck-typed) question whether to send its ``prompt_cache_key``
        (derived from ``group_id``): the wrapped model's answer, so the run's requests
        share the key its ID gives them."""
        supports = getattr(self.inner, "_supports_default_prompt_cache_key", None)
        return bool(supports()) if callable(supports) else False

    async def close(self) -> None:
        if isinstance(self._inner, Model):
            await self._inner.close()


def _tools_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``tools``, the fourth argument of ``Model.get_response`` / ``stream_response``."""
    return kwargs["tools"] if "tools" in kwargs else (args[3] if len(args) > 3 else ())


def _start_tools(bound: _Bound, output: Any, tools: Any) -> None:
    """A model response came: its tool phase begins (commits take turns until the
    next model call), and its function calls take their steps in its order."""
    names = _in_turn(tools)
    bound.turn.reset([cid for name, cid in _function_calls(output) if name in names])
    bound.hold()


class _DurableProvider(ModelProvider):
    """The run's provider with each model it gives made durable (the default one,
    made when a model is first asked for, has its client's retries off)."""

    def __init__(self, inner: ModelProvider | None, options: Mapping[str, Any] | None) -> None:
        self._inner = inner
        self._options = options
        self._client: Any = None  # the default provider's client, made (and closed) here

    def get_model(self, model_name: str | None) -> Model:
        if self._inner is None:
            self._client = _default_client()
            self._inner = MultiProvider(openai_client=self._client)
        return DurableModel(self._inner.get_model(model_name), self._options)

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()
        await self.close_own()

    async def close_own(self) -> None:
        """Close the default provider's client, if this made one (a provider of the
        caller's stays open: it is theirs)."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()


# -- tools, guardrails, handoffs --------------------------------------------------------


def _jsonable(value: Any) -> Any:
    return to_jsonable_python(value, fallback=str, by_alias=True)


class _DurableInvoker:
    """A function tool's ``on_invoke_tool`` as the step ``tool:<name>``, which
    journals the call's ID beside its result (a replay that hands the step to another
    call raises :class:`DeterminismError`, never a wrong result). The tool's
    ``timeout_seconds`` is enforced inside the step, so a call the SDK timed out is
    journaled with the SDK's timeout result and does not run again.

    Attribute reads go to the SDK's invoker (approvals and introspection read
    ``prepare_arguments`` and ``_get_wrapped_callable``), but not dunders: the
    SDK rebinds an invoker that has ``__agents_bind_function_tool__`` when a tool is
    copied, which would put the original back and drop the step."""

    def __init__(self, tool: FunctionTool, options: dict[str, Any]) -> None:
        self._inner = tool.on_invoke_tool
        self._name = tool.name
        self._options = options
        self._timeout = tool.timeout_seconds
        self._on_timeout = tool.timeout_behavior
        self._timeout_error = tool.timeout_error_function
        if getattr(self._inner, "__agents_sync_function_tool__", False):
            self.__agents_sync_function_tool__ = True

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        return getattr(self._inner, item)

    async def _invoke(self, tool_context: Any, arguments: str) -> dict[str, Any]:
        """The call, and the SDK's result of a timeout (``timed_out``: raise it)."""
        if self._timeout is None:
            return {"output": _jsonable(await self._inner(tool_context, arguments))}
        out: Any = None
        with anyio.move_on_after(self._timeout) as scope:
            out = await self._inner(tool_context, arguments)
        if scope.cancelled_caught:
            if self._on_timeout == "raise_exception":
                return {"timed_out": True}
            error = ToolTimeoutError(tool_name=self._name, timeout_seconds=self._timeout)
            if self._timeout_error is None:
                out = f"Tool '{self._name}' timed out after {self._timeout:g} seconds."
            else:
                out = self._timeout_error(tool_context, error)
                if inspect.isawaitable(out):
                    out = await out
        return {"output": _jsonable(out)}

    async def __call__(self, tool_context: Any, arguments: str) -> Any:
        bound = _active()
        if bound is None:
            if self._timeout is None:
                return await self._inner(tool_context, arguments)
            payload = await self._invoke(tool_context, arguments)
        else:
            payload = await self._step(bound, tool_context, arguments)
        if payload.get("timed_out"):
            assert self._timeout is not None
            raise ToolTimeoutError(tool_name=self._name, timeout_seconds=self._timeout)
        return payload["output"]

    async def _step(self, bound: _Bound, tool_context: Any, arguments: str) -> dict[str, Any]:
        call_id = tool_context.tool_call_id
        name = f"tool:{self._name}"

        async def call(s: StepInfo) -> Any:
            token = _TOOL_KEY.set(f"{s.key}-{call_id}")
            try:
                return {"call_id": call_id, **await self._invoke(tool_context, arguments)}
            finally:
                _TOOL_KEY.reset(token)

        await bound.turn.enter(call_id)  # the response's earlier calls go first
        # the SDK runs a turn's calls as tasks of its own: their commits take turns
        with concurrent_calls(bound.ctx):
            payload = await bound.ctx.step(name, call, **self._options)
        if not isinstance(payload, Mapping) or payload.get("call_id") != call_id:
            journaled = payload.get("call_id") if isinstance(payload, Mapping) else payload
            raise DeterminismError(
                f"run {bound.ctx.run_id!r}: the journaled step {name!r} is the result of "
                f"the tool call {journaled!r}, but the call {call_id!r} now takes its "
                f"position; the agent's code or its tool calls changed while the run was "
                f"in flight"
            )
        return dict(payload)


def _type_of(info: Any) -> dict[str, str]:
    """``{"type": "module:QualName"}`` for an ``output_info`` a pydantic model or a
    dataclass (rebuilt from its JSON on the way back), else nothing (JSON as is)."""
    cls = type(info)
    is_model = hasattr(cls, "model_validate") and hasattr(cls, "model_fields")
    if not (is_model or (dataclasses.is_dataclass(info) and not isinstance(info, type))):
        return {}
    return {"type": f"{cls.__module__}:{cls.__qualname__}"}


def _rebuilt(payload: Mapping[str, Any]) -> Any:
    """A guardrail's journaled ``output_info``, of its type again when it had one.

    Raises:
        ConfigError: the type is not importable by its qualified name (a class made
            inside a function): its JSON could not be read back the same way.
    """
    info = payload["info"]
    name = payload.get("type")
    if name is None:
        return info
    module, _, qualname = name.partition(":")
    try:
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            f"fusee.ai.openai: a guardrail's output_info is a {name}, which cannot be "
            f"imported by its qualified name to rebuild it from the journal (define the "
            f"class at a module's top level)"
        ) from e
    return TypeAdapter(cls).validate_python(info)


def _durable_guardrail(guardrail: Any) -> Any:
    """An input or output guardrail whose function is the step ``guardrail:<name>``."""
    name = guardrail.get_name()
    fn = guardrail.guardrail_function

    async def checked(context: Any, agent: Any, value: Any) -> GuardrailFunctionOutput:
        async def call() -> Any:
            out = fn(context, agent, value)
            if inspect.isawaitable(out):
                out = await out
            info = out.output_info
            return {
                "info": _jsonable(info),
                "tripped": out.tripwire_triggered,
                **_type_of(info),
            }

        bound = _active()
        if bound is None:
            out = fn(context, agent, value)
            plain: GuardrailFunctionOutput = await out if inspect.isawaitable(out) else out
            return plain
        with concurrent_calls(bound.ctx):  # output guardrails run at once, as tasks
            payload = await bound.ctx.step(f"guardrail:{name}", call)
        return GuardrailFunctionOutput(
            output_info=_rebuilt(payload), tripwire_triggered=payload["tripped"]
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
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    return f"{article} {kind}, which runs local code outside any step"


@dataclass
class _Maker:
    """Makes durable copies of agents, once each (handoffs may form cycles)."""

    model_options: Mapping[str, Any] | None
    tool_options: Callable[[str], dict[str, Any] | None]
    resolve_names: bool  # durable_agent alone: a model name goes to the default provider
    # id(original) -> (original, clone): the original is kept, so its id is not reused
    seen: dict[int, tuple[Agent[Any], Agent[Any]]] = field(default_factory=dict)

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        if not isinstance(agent, Agent):
            raise ConfigError(f"fusee.ai.openai: {agent!r} is not an agents.Agent")
        made = self.seen.get(id(agent))
        if made is not None and made[0] is agent:
            return made[1]
        _check(agent)
        model = agent.model
        if isinstance(model, Model) or self.resolve_names:
            model = DurableModel(model, self.model_options)
        clone = agent.clone(model=model)
        self.seen[id(agent)] = (agent, clone)
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
        invoker = _DurableInvoker(tool, options)
        # the timeout is the invoker's, inside the step (the SDK's would be around it)
        return dataclasses.replace(tool, on_invoke_tool=invoker, timeout_seconds=None)

    def _handoff(self, handoff: Agent[Any] | Handoff[Any, Any]) -> Any:
        if isinstance(handoff, Agent):
            return self.agent(handoff)
        invoke = handoff.on_invoke_handoff

        async def durable_target(context: Any, arguments: str) -> Any:
            # an agent built per call is made durable by a maker of its own (the
            # agents made up front are shared, for cycles): kept, they would pile up
            maker = dataclasses.replace(self, seen=dict(self.seen))
            return maker.agent(await invoke(context, arguments))

        return dataclasses.replace(handoff, on_invoke_handoff=durable_target)


def _nested_approvals(tool: Any, seen: set[int] | None = None) -> list[str]:
    """The tools with ``needs_approval`` that ``tool`` (an agent run as a tool, made
    by ``Agent.as_tool``) runs, at any depth."""
    nested = getattr(tool, "_agent_instance", None)  # set by Agent.as_tool (SDK 0.24)
    if not isinstance(tool, FunctionTool) or not isinstance(nested, Agent):
        return []
    seen = set() if seen is None else seen
    if id(nested) in seen:
        return []
    seen.add(id(nested))
    asking = []
    for inner in nested.tools:
        if isinstance(inner, FunctionTool) and inner.needs_approval is not False:
            asking.append(inner.name)
        asking += _nested_approvals(inner, seen)
    return asking


def _check(agent: Agent[Any]) -> None:
    """Refuse what cannot be made durable, naming it.

    Raises:
        ConfigError: a tool kind that runs local code, MCP servers, or runner retries.
    """
    where = f"agent {agent.name!r}"
    for tool in agent.tools:
        asking = _nested_approvals(tool)
        if asking:
            raise ConfigError(
                f"{where}: tool {tool.name!r} runs an agent whose tool(s) {asking} need "
                f"approval; the agent tool is one step, which cannot journal the nested "
                f"run's interruption (give the tool to {agent.name!r}, or hand off to the "
                f"agent instead)"
            )
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
    # the SDK's default provider is made here, with its client's retries off
    default_provider = config is None or (
        isinstance(config, Mapping) and "model_provider" not in config
    )
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
        model_provider=_DurableProvider(
            None if default_provider else config.model_provider, model_options
        ),
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
    try:
        return await _run(ctx, durable, input, kwargs, approve, approve_timeout)
    except Exception as e:
        # the SDK wraps a tool's error in its own (UserError): a mismatch with the
        # journal stays one, so the run pauses on it as on any other
        cause: BaseException | None = e
        while cause is not None and not isinstance(cause, DeterminismError):
            cause = cause.__cause__ or cause.__context__
        if cause is None or cause is e:
            raise
        raise cause from e
    finally:
        await kwargs["run_config"].model_provider.close_own()


async def _run(
    ctx: Context,
    durable: Agent[Any],
    input: Any,  # noqa: A002 - Runner.run's name
    kwargs: dict[str, Any],
    approve: Callable[..., Any] | None,
    approve_timeout: str | float | None,
) -> RunResult:
    with bind(ctx):
        bound = _BOUND.get()
        assert bound is not None
        try:
            result = await Runner.run(durable, input, **kwargs)
        finally:
            bound.release()  # the last tool phase (or guardrails) has ended
        while result.interruptions:
            if approve is None:
                names = sorted({item.tool_name or "?" for item in result.interruptions})
                raise ConfigError(
                    f"fusee.ai.openai.run: tool(s) {names} need approval, but run() has no "
                    f"approve= to put the completion's URL in front of someone (pass "
                    f"approve=lambda cb: notify(cb.url))"
                )
            state = result.to_state()
            # asked all at once: a person answering the second need not wait for the first
            await ctx.all(
                [
                    decide(ctx, state, item, approve, approve_timeout)
                    for item in result.interruptions
                ]
            )
            try:
                result = await Runner.run(durable, state, **kwargs)
            finally:
                bound.release()
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
        bound = _BOUND.get()
        assert bound is not None
        result = Runner.run_streamed(durable, input, **kwargs)
    task = result.run_loop_task
    if task is not None:  # (the default provider's client is left to the collector)
        task.add_done_callback(lambda _: bound.release())
    return result
