"""Pydantic AI agents as fusee workflows: ``FuseeDurability`` and ``run`` (extra ``fusee[pydantic-ai]``).

``FuseeDurability`` is a Pydantic AI capability built on its public durable-execution
API (``pydantic_ai.durable_exec``: ``BaseDurabilityCapability`` with a
``JournalCallableOperationBackend``). Inside :func:`run`, each model request and each
tool call of the agent is one ``ctx.step``, named by Pydantic AI's journal convention
(``support__model.request``, ``support__function_toolset__<agent>.call_tool:refund``,
``support__mcp_server__<id>.call_tool``); a replay returns the journaled results and
never asks the model again. Outside :func:`run` the same agent is an ordinary agent.

- Step options: ``model_options`` / ``tool_options`` are ``ctx.step``'s (``retry``,
  ``timeout``, ``limit``, ``fairness_key``); a tool's metadata entry ``"fusee"`` (a dict)
  overrides them for that tool, and ``False`` calls it without a step.
- Retries: the model SDK's own retries are off inside a model step (``max_retries=0``,
  ``sdk_retries=`` to keep some), so the step's ``Retry`` owns retrying, with
  ``on_exhausted="pause"`` pausing the run; Pydantic AI's own waits
  (``Agent.using_sleep``) are durable ``ctx.sleep``s.
- Tool calls: each tool step's idempotency key is ``<step key>-<tool call id>``
  (:func:`tool_key`), unique per run.
- Streaming (``run_stream``, ``iter``, an ``event_stream_handler``): the model's text
  deltas are written, as they come, from inside the model step to the run's token
  stream ``<step name>/<n>`` (the run's n-th streamed request of the agent), readable
  with ``engine.run(id).stream(name)``; a retried attempt writes a reset marker first.
- Approvals: a tool that needs approval (``requires_approval=True``, ``ApprovalRequired``)
  waits for a completion (``ctx.await_completion``, a callback URL given to ``approve``);
  the person's answer is Pydantic AI's deferred-tool result.

Example:
    ``agent = Agent("openai:gpt-5", name="support", capabilities=[FuseeDurability()])``
    ``result = await run(ctx, lambda: agent.run(question))``
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar, cast
from weakref import WeakKeyDictionary

import anyio
import msgspec
from pydantic_ai import Agent
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.capabilities.abstract import WrapRunHandler
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationId,
    JournalCallableOperationBackend,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    conversation_id_from_run_id,
)
from pydantic_ai.exceptions import (
    ModelQuotaExceededError,
    ModelRequestRejectedError,
    ModelRequestTimeout,
    UnexpectedModelBehavior,
    UserError,
)
from pydantic_ai.messages import (
    AgentStreamEvent,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
)
from pydantic_ai.models import Model
from pydantic_ai.run import AgentRunResult
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import (
    AgentDepsT,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.toolsets import ToolsetTool

try:  # Pydantic AI >= 2.68: keeps the telemetry of replayed steps out of traces
    from pydantic_ai.durable_exec import record_durable_unit, replay_scope
except ImportError:  # pragma: no cover - the floor version: replays are traced again
    record_durable_unit = None  # type: ignore[assignment]
    replay_scope = None  # type: ignore[assignment]

from fusee.actors.context import Context, token_stream
from fusee.actors.ports import TokenWriterPort
from fusee.actors.steps import DEFAULT_RETRY, StepInfo, in_step
from fusee.errors import (
    ConfigError,
    ControlFlow,
    FuseeError,
    InvalidArgument,
    NotEncodable,
    Timeout,
)
from fusee.runtime.completions import Completion
from fusee.runtime.retry import Retry

__all__ = (
    "FuseeDurability",
    "run",
    "tool_key",
    "StepOptions",
    "STEP_OPTIONS",
    "NON_RETRYABLE_MODEL_ERRORS",
)

T = TypeVar("T")

StepOptions = dict[str, Any]
"""``ctx.step``'s options for a model request or a tool call: ``retry`` (a
:class:`fusee.Retry`), ``timeout``, ``limit``, ``fairness_key``."""

STEP_OPTIONS = frozenset({"retry", "timeout", "limit", "fairness_key"})
"""The keys a :data:`StepOptions` dict may hold."""

NON_RETRYABLE_MODEL_ERRORS: tuple[type[BaseException], ...] = (
    UserError,
    UnexpectedModelBehavior,
    ModelRequestRejectedError,
    ModelQuotaExceededError,
    ModelRequestTimeout,
)
"""The errors another attempt of the same model request cannot fix (Temporal's
integration does not retry them either): a misuse, a response Pydantic AI cannot use,
a request the provider rejected (a bad key, an unknown model, a context overflow), an
exhausted quota, a request past its run's deadline. A model step fails at once on them,
even under ``Retry(on_exhausted="pause")``."""

FLUSH_ON_FAILURE = 2.0  # seconds a failed streamed attempt waits for its tokens to be stored

Approve = Callable[..., Any]
"""``approve(cb)`` or ``approve(cb, call)``: puts ``cb.url`` (a :class:`fusee.Completion`)
in front of someone; ``call`` is Pydantic AI's ``ToolCallPart``."""


@dataclass(eq=False)
class _Binding:
    """What :func:`run` binds for the agent code it runs: the workflow's context."""

    ctx: Context


@dataclass(eq=False)
class _Counters:
    """Per workflow context: agent runs started and streamed model requests made, so
    run IDs and stream names are the same on every replay (workflow code is)."""

    runs: int = 0
    streams: dict[str, int] = field(default_factory=dict)


_BOUND: ContextVar[_Binding | None] = ContextVar("fusee_pydantic_bound", default=None)
# The token writer of the streamed model step whose attempt runs in this task.
_WRITER: ContextVar[TokenWriterPort | None] = ContextVar("fusee_pydantic_writer", default=None)
# The running tool step's info under its tool-call key (tool_key()).
_TOOL_STEP: ContextVar[StepInfo | None] = ContextVar("fusee_pydantic_tool_step", default=None)
_COUNTERS: WeakKeyDictionary[Context, _Counters] = WeakKeyDictionary()


def _counters(ctx: Context) -> _Counters:
    found = _COUNTERS.get(ctx)
    if found is None:
        found = _COUNTERS[ctx] = _Counters()
    return found


def _durable_ctx() -> Context | None:
    """The workflow context the agent runs in, or None: not in :func:`run`, or inside a
    step's function (a nested agent there is an ordinary one)."""
    bound = _BOUND.get()
    if bound is None or in_step() is not None:
        return None
    return bound.ctx


async def run(ctx: Context, fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn()`` (an agent call: ``agent.run``, ``run_stream``, ``iter``, ...) as part
    of the workflow ``ctx``: the model requests and tool calls of every agent with a
    :class:`FuseeDurability` are its steps. Outside ``run`` those agents are ordinary.

    Raises:
        InvalidArgument: ``ctx`` is not a workflow's (or an object handler's) context.
        FuseeError: ``fn`` is not callable, or ``run`` was called inside a step's
            function (a step cannot take steps).

    Example:
        ``result = await run(ctx, lambda: agent.run(question))``
    """
    if not isinstance(ctx, Context):
        raise InvalidArgument(
            f"fusee.ai.pydantic.run: ctx is a {type(ctx).__name__}, not the fusee.Context "
            f"a workflow gets"
        )
    if not callable(fn):
        raise FuseeError(f"fusee.ai.pydantic.run: {fn!r} is not callable")
    step = in_step()
    if step is not None:
        raise FuseeError(
            f"fusee.ai.pydantic.run was called inside step {step!r}: a step's function "
            f"cannot take steps; run the agent in the workflow"
        )
    token = _BOUND.set(_Binding(ctx))
    try:
        with Agent.using_sleep(_durable_sleep):
            return await fn()
    finally:
        _BOUND.reset(token)


async def _durable_sleep(seconds: float) -> None:
    """Pydantic AI's waits (a suspended response's polls, continuation delays) as durable
    sleeps in the workflow; a plain sleep where no workflow is bound (in a step)."""
    ctx = _durable_ctx()
    if ctx is None:
        await anyio.sleep(seconds)
        return
    await ctx.sleep(seconds, name="pydantic_ai.sleep")


def tool_key() -> str | None:
    """The idempotency key of the tool call running here: ``<its step's key>-<the
    model's tool-call ID>``, the same on every attempt and replay, unique per run.
    ``None`` where the tool runs without a step (outside :func:`run`, or with
    ``metadata={"fusee": False}``).

    Example:
        ``payments.refund(order, amount, idempotency_key=tool_key() or ctx.tool_call_id)``
    """
    info = _TOOL_STEP.get()
    return info.key if info is not None else None


def _check_options(options: Mapping[str, Any] | None, what: str) -> StepOptions:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"{what} must be a dict of step options, not {type(options).__name__}")
    unknown = sorted(set(options) - STEP_OPTIONS)
    if unknown:
        raise ConfigError(
            f"{what}: unknown step option(s) {', '.join(map(repr, unknown))}; the options "
            f"are {', '.join(sorted(STEP_OPTIONS))}"
        )
    retry = options.get("retry")
    if retry is not None and not isinstance(retry, Retry):
        raise ConfigError(f"{what}: retry= must be a fusee.Retry, not {type(retry).__name__}")
    return dict(options)


def _tool_options(base: StepOptions) -> Callable[[DurableOperationId, object | None, str], Any]:
    """Per tool: its metadata's ``"fusee"`` entry over ``tool_options``; ``False``: no step."""

    def resolve(operation_id: DurableOperationId, tool: object | None, tool_name: str) -> Any:
        metadata = tool.tool_def.metadata if isinstance(tool, ToolsetTool) else None
        entry = (metadata or {}).get("fusee")
        if entry is False:
            return False
        if entry is None or entry is True:
            return dict(base)
        return {**base, **_check_options(entry, f"tool {tool_name!r}: metadata['fusee']")}

    return resolve


class _Backend(JournalCallableOperationBackend[StepOptions]):
    """Each durable unit of Pydantic AI is one ``ctx.step`` named by its journal namer."""

    def __init__(self, owner: FuseeDurability[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._owner = owner

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: StepOptions,
    ) -> object:
        ctx = _durable_ctx()
        if ctx is None:  # the base routes here only inside the workflow
            raise FuseeError(f"Pydantic AI step {name!r} outside fusee.ai.pydantic.run")
        options = dict(config or {})
        ran = False

        async def counted() -> object:
            nonlocal ran
            ran = True
            return await body()

        if isinstance(operation_id, ToolsetCallToolId):
            fn = _tool_body(counted, _tool_call_id(cache_key))
        elif isinstance(operation_id, ModelRequestId) and operation_id.streaming:
            # counted per stream name: two agents with one stream_prefix take turns
            # (chat/0, chat/1), never one stream
            base = self._owner.stream_prefix or name
            counters = _counters(ctx).streams
            n = counters.get(base, 0)
            counters[base] = n + 1
            stream_name = f"{base}/{n}"
            fn = _streamed_body(ctx, stream_name, counted)
        else:
            fn = counted
        result = await ctx.step(name, fn, **options)
        if record_durable_unit is not None:
            # a step replayed from the journal: its spans and metrics were reported
            record_durable_unit(executed=ran)
        return result


def _tool_call_id(cache_key: tuple[object, ...]) -> str | None:
    # The cache key's layout is Pydantic AI's own; its RunContext is found by type.
    rc = next((c for c in cache_key if isinstance(c, RunContext)), None)
    return rc.tool_call_id if rc is not None else None


def _tool_body(body: Callable[[], Awaitable[object]], call_id: str | None) -> Callable[..., Any]:
    async def attempt(s: StepInfo) -> object:
        info = s.with_key(f"{s.key}-{call_id}") if call_id else s
        token = _TOOL_STEP.set(info)
        try:
            return await body()
        finally:
            _TOOL_STEP.reset(token)

    return attempt


def _streamed_body(
    ctx: Context, stream_name: str, body: Callable[[], Awaitable[object]]
) -> Callable[..., Any]:
    async def attempt(s: StepInfo) -> object:
        # opened by the attempt: a replay that returns the journaled response never
        # touches the stream
        writer = await token_stream(ctx, stream_name).open()
        try:
            state = writer.state
            stored = _stored_response(state.final, s.key) if state.ended else None
            if stored is not None and not state.broken:
                # The model finished in an attempt of this step whose result was not
                # journaled (its worker died between the end marker and the commit):
                # the response stored with the marker is the result, not asked again.
                return stored.response
            if state.chunks or state.ended:
                # An earlier attempt wrote text (its worker died, or it failed): Pydantic
                # AI's models cannot continue it, so readers drop it at this marker.
                await writer.restart()
            token = _WRITER.set(writer)
            try:
                payload = await body()
            finally:
                _WRITER.reset(token)
            # the response (Pydantic AI's JSON) rides on the end marker (left out when
            # it is over a message's size: a death before the commit then asks again)
            await writer.end(msgspec.json.encode(_Stored(step=s.key, response=payload)))
            return payload
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(FLUSH_ON_FAILURE):
                try:
                    await writer.flush()
                except FuseeError:
                    pass  # the next attempt reads what landed
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await writer.close()

    return attempt


class _Stored(msgspec.Struct, frozen=True):
    """What a streamed model step's end marker holds: the step it answers (its key, one
    run's one position) and Pydantic AI's response (JSON)."""

    step: str
    response: Any


def _stored_response(final: bytes, step: str) -> _Stored | None:
    """The response an end marker stored for the step ``step``, or None: no response
    (over a message's size), or another step's (a stream another agent shares)."""
    if not final:
        return None
    try:
        stored = msgspec.json.decode(final, type=_Stored)
    except msgspec.MsgspecError:
        return None
    return stored if stored.step == step else None


def _serialization_failure(exc: Exception) -> BaseException:
    return NotEncodable(f"a Pydantic AI result cannot be journaled as JSON: {exc}")


@dataclass(init=False)
class FuseeDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes a Pydantic AI agent's model requests and tool calls fusee steps inside
    :func:`run`; outside it the agent is ordinary.

    Args:
        model_options: ``ctx.step`` options of every model request (``retry``,
            ``timeout``, ``limit``, ``fairness_key``).
        tool_options: ``ctx.step`` options of every tool call (MCP tools included); a
            tool's metadata ``{"fusee": {...}}`` overrides them, ``{"fusee": False}``
            calls it without a step.
        event_options: ``ctx.step`` options of the event handler's steps (its tool
            events); default none (the workflow's defaults), not the model's.
        non_retryable_model_errors: errors a model step fails on at once, added to its
            retry policy's (default :data:`NON_RETRYABLE_MODEL_ERRORS`; ``()`` retries
            them all as the policy says).
        name: the name in the step names (default: the agent's ``name``).
        models: models a run may switch to (``agent.run(model=...)``), by ID.
        event_stream_handler: Pydantic AI's; it gets the model's events live inside the
            model step, and each tool event in a step of its own.
        stream_prefix: the token streams' name before ``/<n>`` (default: the step name,
            ``support__model.request_stream``).
        sdk_retries: the model client's own retries inside one step attempt (default 0:
            the step's retry policy retries); ``None`` leaves the client's setting.
        approve: ``approve(cb)`` or ``approve(cb, call)`` puts an approval's callback URL
            (``cb.url``) in front of someone; it runs once, as a step. Without it a tool
            that needs approval fails the run with a ``ConfigError`` naming the tool
            (the URL is a credential: it is not logged, and nothing else lists it).
        approve_timeout: how long an approval may take (``None``: forever); after it the
            call is denied.

    Raises:
        ConfigError: an option that is not a step option, a ``retry`` that is not a
            ``fusee.Retry``, or a non-retryable error that is not an exception type.

    Example:
        ``FuseeDurability(model_options={"retry": fusee.Retry(on_exhausted="pause")})``
    """

    engine_spec: ClassVar[DurabilityEngineSpec] = DurabilityEngineSpec(
        engine_name="fusee",
        durable_unit_noun="step",
        durable_container_noun="workflow",
        codec=JSON_CODEC,
        serialization_failure=_serialization_failure,
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-never",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        tool_config_key="fusee",
        # Pydantic AI's parallel tool calls are tasks of its own: fusee serializes
        # their commits and checks on replay that they take the positions they had
        # (see "Concurrent calls outside ctx.all" in docs/design.md)
        sequential_tools_in_durable_context=False,
        # fusee's suspension (a park, a pause, an eviction, a fence) is BaseException
        # control flow: the run must let it through untouched.
        cancellation_error_types=(ControlFlow,),
    )

    def __init__(
        self,
        *,
        model_options: Mapping[str, Any] | None = None,
        tool_options: Mapping[str, Any] | None = None,
        event_options: Mapping[str, Any] | None = None,
        non_retryable_model_errors: tuple[type[BaseException], ...] = NON_RETRYABLE_MODEL_ERRORS,
        name: str | None = None,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        stream_prefix: str | None = None,
        sdk_retries: int | None = 0,
        approve: Approve | None = None,
        approve_timeout: str | float | timedelta | None = None,
    ) -> None:
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self._model_options = _model_step_options(
            _check_options(model_options, "model_options"), non_retryable_model_errors
        )
        self._tool_options = _check_options(tool_options, "tool_options")
        self._event_options = _check_options(event_options, "event_options")
        if sdk_retries is not None and (not isinstance(sdk_retries, int) or sdk_retries < 0):
            raise ConfigError(f"sdk_retries must be an int >= 0 or None, not {sdk_retries!r}")
        if approve is not None and not callable(approve):
            raise ConfigError(f"approve={approve!r} is not callable")
        self._sdk_retries = sdk_retries
        self._approve = approve
        self._approve_timeout = approve_timeout
        self.stream_prefix = stream_prefix

    # -- the engine -------------------------------------------------------------------

    @property
    def in_durable_context(self) -> bool:
        return _durable_ctx() is not None

    def get_durable_operation_backend(self) -> _Backend:
        return _Backend(
            self,
            agent_name=self.name,
            default_model_id=self.default_model_id,
            config=RoleBasedOperationConfig(
                model=self._model_options,
                event=self._event_options,
                capability=self._tool_options,
                tool=self._tool_options,
                resolve_tool=_tool_options(self._tool_options),
            ),
        )

    async def wrap_run(
        self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        if replay_scope is None or not self.in_durable_context:
            return await super().wrap_run(ctx, handler=handler)
        with replay_scope():
            return await super().wrap_run(ctx, handler=handler)

    def get_default_run_id(self) -> str | None:
        ctx = _durable_ctx()
        if ctx is None:
            return None
        counters = _counters(ctx)
        n, counters.runs = counters.runs, counters.runs + 1
        return f"{ctx.run_id}:{n}"

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        # Journaled (ctx.now()): a replay counts the run's timeout= from when the run
        # first started, so a run that parked past its deadline times out as it resumes.
        ctx = _durable_ctx()
        return ctx.now() if ctx is not None else None

    def get_run_clock(self) -> Callable[[], datetime] | None:
        # The deadline's remaining time is measured on the live clock: fusee's timer is
        # the activation's own (a replay starts it again), so a journaled clock would
        # give every replay the whole timeout again. (Temporal's workflow.now() can be
        # replayed because its timer is durable.)
        return _utc_now if self.in_durable_context else None

    def get_model_settings(self) -> Callable[[RunContext[AgentDepsT]], ModelSettings] | None:
        retries = self._sdk_retries
        if retries is None:
            return None

        def settings(_: RunContext[AgentDepsT]) -> ModelSettings:
            # Resolved in the workflow, carried into the step with the request.
            return (
                ModelSettings(max_retries=retries) if self.in_durable_context else ModelSettings()
            )

        return settings

    def _model_stream_event_handler(self) -> EventStreamHandler[AgentDepsT] | None:
        # The one private seam (pinned by tests/e2e/test_pydantic_ai.py): the handler the
        # base runs on the live model stream inside the model step. Temporal overrides it
        # the same way to publish the events while the model streams.
        inner = super()._model_stream_event_handler()

        async def handler(
            run_context: RunContext[AgentDepsT], events: AsyncIterable[AgentStreamEvent]
        ) -> None:
            writer = _WRITER.get()
            tee = _write_text(writer, events) if writer is not None else events
            if inner is not None:
                await inner(run_context, tee)
            else:
                async for _ in tee:
                    pass

        return handler

    # -- approvals --------------------------------------------------------------------

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[AgentDepsT], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        fctx = _durable_ctx()
        if fctx is None or not requests.approvals:
            return None
        waits = [self._approval(fctx, call) for call in requests.approvals]
        answers = await fctx.all(waits) if len(waits) > 1 else [await waits[0]]
        approvals: dict[str, bool | ToolApproved | ToolDenied] = {
            call.tool_call_id: answer
            for call, answer in zip(requests.approvals, answers, strict=True)
        }
        return DeferredToolResults(approvals=cast(Any, approvals))

    async def _approval(self, fctx: Context, call: ToolCallPart) -> ToolApproved | ToolDenied:
        approve = self._approve
        if approve is None:
            # The callback URL is a credential and no engine call lists a run's waiting
            # completions: without approve= nobody could ever answer (a log line would
            # leak it), so the run fails here, before anything waits.
            raise ConfigError(
                f"tool {call.tool_name!r} of agent {self.name!r} needs approval, but "
                f"FuseeDurability has no approve=: pass approve=lambda cb: ... to put its "
                f"callback URL (cb.url) in front of someone"
            )
        two = _takes_call(approve)

        def ask(cb: Completion) -> Any:
            return approve(cb, call) if two else approve(cb)

        # the Agents SDK adapter's name (fusee.ai.openai): one wait per call
        name = f"approve:{call.tool_name}:{call.tool_call_id}"
        try:
            value = await fctx.await_completion(name, ask=ask, timeout=self._approve_timeout)
        except Timeout:
            return ToolDenied(message="the call was not approved in time, so it did not run")
        return _verdict(value)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _model_step_options(
    options: StepOptions, non_retryable: tuple[type[BaseException], ...]
) -> StepOptions:
    """The model step's options: its retry policy (``model_options``' or fusee's
    default) also fails at once on ``non_retryable``."""
    if not isinstance(non_retryable, tuple) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in non_retryable
    ):
        raise ConfigError(
            f"non_retryable_model_errors must be a tuple of exception types, not {non_retryable!r}"
        )
    if not non_retryable:
        return options
    retry: Retry = options.get("retry") or DEFAULT_RETRY
    merged = tuple(dict.fromkeys((*retry.non_retryable, *non_retryable)))
    return {**options, "retry": replace(retry, non_retryable=merged)}


def _takes_call(fn: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 and positional[1].default is inspect.Parameter.empty


def _verdict(value: Any) -> ToolApproved | ToolDenied:
    """A person's answer as Pydantic AI's: ``True`` / ``{"approved": true}`` approves,
    ``False`` / ``{"approved": false, "reason": r}`` denies with ``r``."""
    if value is True:
        return ToolApproved()
    if isinstance(value, dict) and value.get("approved") is True:
        return ToolApproved()
    if value is False:
        return ToolDenied(message="the call was not approved, so it did not run")
    if isinstance(value, dict) and value.get("approved") is False:
        reason = value.get("reason")
        text = f": {reason}" if reason else ""
        return ToolDenied(message=f"the call was not approved, so it did not run{text}")
    return ToolDenied(
        message=f"the approval's answer was {value!r}, not a yes or a no, so the call did not run"
    )


async def _write_text(
    writer: TokenWriterPort, events: AsyncIterable[AgentStreamEvent]
) -> AsyncIterator[AgentStreamEvent]:
    """Pass the events on, writing each text part's text to the token stream first."""
    async for event in events:
        text = ""
        if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
            text = event.part.content
        elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
            text = event.delta.content_delta
        if text:
            await writer.write(text)
        yield event
