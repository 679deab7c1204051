"""Tools of the agent loop: what a model may call, their JSON Schemas, their arguments.

A tool is a plain function (sync or async: one durable step per call), a workflow
(:func:`workflow_tool`: a child run per call), or either behind an approval
(:func:`tool` with ``approve=``: a completion first). Its schema comes from the
function's signature and docstring: the parameters become a msgspec Struct (or a
pydantic model, when a parameter's type is one), whose JSON Schema the model sees and
which validates the arguments the model writes. A parameter annotated
:class:`fusee.StepInfo` is not an argument: it gets the step's info, whose ``key`` is
``<the step's key>-<the model's tool-call ID>``: the same in every attempt and replay of
the call, different in every run.

Example:
    ``tools = {"search_kb": search_kb, "refund": tool(refund, approve=ask_slack)}``
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated, Any, get_type_hints

import docstring_parser
import msgspec

from fusee.actors.context import Named
from fusee.actors.registry import Workflow
from fusee.actors.steps import StepInfo
from fusee.ai.types import ToolCall, ToolSpec
from fusee.errors import ConfigError, FuseeError
from fusee.runtime.completions import Completion
from fusee.runtime.durations import parse_duration
from fusee.runtime.ids import validate_name
from fusee.runtime.retry import Retry

__all__ = (
    "Tool",
    "WorkflowTool",
    "tool",
    "workflow_tool",
    "ToolInputError",
    "UnknownTool",
    "TOOL_RETRY",
    "Arguments",
    "as_tool",
    "check_tool_name",
    "content_of",
)

TOOL_RETRY = Retry(attempts=1)
"""A tool's retry policy unless it has its own: none. The model gets the error at once
and decides what to do, as in the Vercel AI SDK and the OpenAI Agents SDK."""

# What a plain function's tool is made of besides the function (description, arguments,
# StepInfo parameter), by function: a loop's tools= is read on every call of loop
# (every run, every replay) and a function's schema (its Struct, its docstring) is the
# same each time. Weak, and the values hold no reference to the function, so a closure
# made per run is not kept.
_MADE: weakref.WeakKeyDictionary[Callable[..., Any], tuple[str, Arguments, str | None]] = (
    weakref.WeakKeyDictionary()
)

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


class ToolInputError(FuseeError):
    """The model's arguments for a tool call are not JSON, or do not match the tool's
    schema. The loop gives the model this message as the call's result (never retried)."""


class UnknownTool(FuseeError):
    """The model called a tool the loop does not have. The loop gives the model this
    message as the call's result."""


class Arguments:
    """A tool's arguments: their JSON Schema (``parameters``) and their validation
    (``parse``: the model's JSON text in, the value the tool is called with out)."""

    def __init__(self, parameters: dict[str, Any], parse: Callable[[Any], Any]) -> None:
        self.parameters = parameters
        self._parse = parse

    def parse(self, tool: str, text: str) -> Any:
        """The tool's input from the model's arguments ``text``.

        Raises:
            ToolInputError: ``text`` is not JSON, or does not match the schema.
        """
        try:
            raw = msgspec.json.decode(text or "{}")
        except msgspec.DecodeError as e:
            raise ToolInputError(
                f"the arguments of tool {tool!r} are not JSON ({e}): {_cut(text)}; call it "
                f"again with a JSON object that matches its schema"
            ) from None
        try:
            return self._parse(raw)
        except (msgspec.ValidationError, ValueError, TypeError) as e:
            # pydantic's ValidationError is a ValueError
            raise ToolInputError(
                f"invalid arguments for tool {tool!r}: {_said(e)}; call it again with "
                f"arguments that match its schema"
            ) from None


@dataclass(frozen=True)
class Tool:
    """A function the model may call, with the options of its step (see :func:`tool`)."""

    fn: Callable[..., Any]
    description: str
    arguments: Arguments
    info_param: str | None  # the parameter that gets the StepInfo, if any
    approve: Callable[..., Any] | None = None
    approve_timeout: float | None = None
    retry: Retry = TOOL_RETRY
    timeout: float | None = None
    limit: str | None = None
    fairness_key: str | None = None

    def spec(self, name: str) -> ToolSpec:
        return ToolSpec(
            name=name, description=self.description, parameters=self.arguments.parameters
        )

    def step_fn(self, kwargs: dict[str, Any], call_id: str) -> Callable[[StepInfo], Any]:
        """The step function of one call: the tool with its validated arguments, its
        ``StepInfo`` keyed ``<the step's key>-<call_id>`` (the step's key makes it unique
        per run, as a model's call IDs need not be: ``call_0`` in every run). Sync for a
        sync tool (a step runs it in a worker thread), async for an async one."""
        fn, info_param = self.fn, self.info_param

        def args(s: StepInfo) -> dict[str, Any]:
            if info_param is None:
                return kwargs
            return {**kwargs, info_param: s.with_key(f"{s.key}-{call_id}")}

        if inspect.iscoroutinefunction(fn):

            async def run_async(s: StepInfo) -> Any:
                return _jsonable(await fn(**args(s)))

            return run_async

        def run(s: StepInfo) -> Any:
            result = fn(**args(s))
            if inspect.isawaitable(result):
                return _converted(result)
            return _jsonable(result)

        return run


@dataclass(frozen=True)
class WorkflowTool:
    """A workflow the model may call: each call a child run (see :func:`workflow_tool`)."""

    workflow: str
    description: str
    arguments: Arguments
    timeout: float | None = None
    approve: Callable[..., Any] | None = None
    approve_timeout: float | None = None
    target: Any = field(
        default=None, compare=False
    )  # what ctx.child takes: the workflow, or its name

    def spec(self, name: str) -> ToolSpec:
        return ToolSpec(
            name=name, description=self.description, parameters=self.arguments.parameters
        )


def tool(
    fn: Callable[..., Any] | WorkflowTool | Workflow[Any],
    *,
    approve: Callable[..., Any] | None = None,
    approve_timeout: str | float | timedelta | None = None,
    retry: Retry | None = None,
    timeout: str | float | timedelta | None = None,
    limit: str | None = None,
    fairness_key: str | None = None,
    description: str | None = None,
) -> Tool | WorkflowTool:
    """A tool for :func:`fusee.ai.loop` with options: ``fn`` (a function, sync or async,
    a workflow, or a :func:`workflow_tool`) and how its calls run.

    Args:
        approve: ``ask(cb)`` or ``ask(cb, call)`` (the :class:`~fusee.ai.ToolCall` when
            ``ask`` has a second positional parameter without a default): each call
            first waits for a completion (``ctx.await_completion``), and ``ask`` runs
            once as a step to put ``cb.url`` in front of a person. ``True`` (or ``{"approved": true}``) runs the tool;
            ``{"approved": false, "reason": ...}`` (or ``False``) gives the model the
            refusal as the call's result.
        approve_timeout: how long to wait for the approval; when it passes the model is
            told so, as the call's result.
        retry: the tool step's retry policy (default: no retry: the model gets the
            error). ``on_exhausted="pause"`` pauses the run instead.
        timeout: each attempt's timeout.
        limit: a limit (``engine.limit``) each attempt takes a permit of; with
            ``fairness_key``.
        description: what the model is told the tool does (default: the docstring).

    Raises:
        ConfigError: ``fn`` cannot be a tool (its parameters have no JSON Schema, it
            takes ``*args``), or an option is wrong.

    Example:
        ``"refund": fusee.ai.tool(refund, approve=lambda cb, call: slack.post(cb.url))``
    """
    if approve is not None and not callable(approve):
        raise ConfigError(
            f"tool(approve={approve!r}): approve must be an ask function (cb[, call])"
        )
    wait = parse_duration(approve_timeout, "tool(approve_timeout=...)") if approve_timeout else None
    if isinstance(fn, Workflow):
        fn = workflow_tool(fn)
    if isinstance(fn, WorkflowTool):
        if retry is not None or limit is not None or fairness_key is not None:
            raise ConfigError(
                f"tool(workflow_tool({fn.workflow!r}), ...): a workflow tool runs as a child "
                f"run with its own steps' retries and limits; give only approve=, "
                f"approve_timeout=, timeout= and description="
            )
        return WorkflowTool(
            fn.workflow,
            description if description is not None else fn.description,
            fn.arguments,
            parse_duration(timeout, "tool(timeout=...)") if timeout is not None else fn.timeout,
            approve if approve is not None else fn.approve,
            wait if wait is not None else fn.approve_timeout,
            fn.target,
        )
    made = _function_tool(fn, description)
    if retry is not None and not isinstance(retry, Retry):
        raise ConfigError(f"tool(retry={retry!r}): give a fusee.Retry")
    permits = None
    if limit is not None:
        permits = validate_name(limit, "limit name")
    elif fairness_key is not None:
        raise ConfigError("tool(fairness_key=...) needs limit=")
    return Tool(
        made.fn,
        made.description,
        made.arguments,
        made.info_param,
        approve=approve,
        approve_timeout=wait,
        retry=retry if retry is not None else TOOL_RETRY,
        timeout=parse_duration(timeout, "tool(timeout=...)") if timeout is not None else None,
        limit=permits,
        fairness_key=(
            validate_name(fairness_key, "fairness key") if fairness_key is not None else None
        ),
    )


def workflow_tool(
    workflow: Named | str,
    *,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    timeout: str | float | timedelta | None = None,
    approve: Callable[..., Any] | None = None,
    approve_timeout: str | float | timedelta | None = None,
) -> WorkflowTool:
    """A workflow as a tool of :func:`fusee.ai.loop`: each call is the child run
    ``<run id>/<tool call id>-<16 hex: the step name and generation, hashed>``
    (``ctx.child``), so a replay attaches to the same child.

    The arguments' schema is the workflow's input type (an object type: a msgspec
    Struct, a dataclass, a TypedDict, a pydantic model), or ``{"input": <its schema>}``
    for another type; the description is the workflow function's docstring. A workflow
    given by name (another deployment's) takes ``parameters=``, a JSON Schema.
    ``approve=`` and ``approve_timeout=`` are :func:`tool`'s.

    Raises:
        ConfigError: the input type has no JSON Schema, or a name comes without
            ``parameters=``.

    Example:
        ``"lookup_order": workflow_tool(orders_lookup)``
    """
    if isinstance(workflow, str):
        name = validate_name(workflow, "workflow name")
        if parameters is None:
            raise ConfigError(
                f"workflow_tool({name!r}): a workflow given by name needs parameters= (the "
                f"JSON Schema of its input, an object)"
            )
        arguments = Arguments(_checked_schema(parameters, name), lambda raw: raw)
        doc = description or ""
    elif isinstance(workflow, Workflow):
        name = workflow.name
        arguments = (
            _schema_arguments(parameters, name)
            if parameters is not None
            else _input_arguments(workflow)
        )
        doc = description if description is not None else _describe(workflow.fn)[0]
    else:
        raise ConfigError(
            f"workflow_tool({workflow!r}): give a workflow (@fusee.workflow) or its name"
        )
    if approve is not None and not callable(approve):
        raise ConfigError(f"workflow_tool(approve={approve!r}): approve must be an ask function")
    wait = (
        parse_duration(approve_timeout, "workflow_tool(approve_timeout=...)")
        if approve_timeout is not None
        else None
    )
    return WorkflowTool(
        name,
        doc,
        arguments,
        parse_duration(timeout, "workflow_tool(timeout=...)") if timeout is not None else None,
        approve,
        wait,
        workflow,
    )


def as_tool(name: str, value: Any) -> Tool | WorkflowTool:
    """The tool ``name`` of a loop's ``tools=`` from what the user gave: a function, a
    :class:`Tool`, a :class:`WorkflowTool`, or a workflow (made a workflow tool). A
    function's tool is made once and kept while the function lives.

    Raises:
        ConfigError: ``value`` cannot be a tool.
    """
    if isinstance(value, Tool | WorkflowTool):
        return value
    if isinstance(value, Workflow):
        return workflow_tool(value)
    if not callable(value):
        raise ConfigError(
            f"tool {name!r}: {value!r} is not a function, a tool() or a workflow_tool()"
        )
    try:
        return Tool(value, *_MADE[value])
    except (KeyError, TypeError):  # not made yet, or no weak reference to it
        pass
    made = tool(value)
    assert isinstance(made, Tool)
    try:
        _MADE[value] = (made.description, made.arguments, made.info_param)
    except TypeError:
        pass
    return made


def check_tool_name(name: object, where: str) -> str:
    """A tool name as the providers take it: 1 to 64 of ``a-z A-Z 0-9 _ -``.

    Raises:
        ConfigError: it is not.
    """
    if not isinstance(name, str) or not 1 <= len(name) <= 64 or not set(name) <= _NAME_CHARS:
        raise ConfigError(
            f"{where}: tool name {name!r} must be 1 to 64 characters of a-z, A-Z, 0-9, '_' "
            f"and '-' (what OpenAI and Anthropic accept)"
        )
    return name


def content_of(value: Any) -> str:
    """A tool's result as the text a model reads: a str as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


def ask_for(approve: Callable[..., Any], call: ToolCall) -> Callable[[Completion], Any]:
    """The ``ask`` of a call's completion: ``approve(cb, call)`` when ``approve`` has a
    second positional parameter without a default (or ``*args``), else ``approve(cb)``
    (``ask(cb, channel="#ops")`` keeps its channel)."""
    if _positional(approve) >= 2:
        return lambda cb: approve(cb, call)
    return approve


# -- schemas --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Made:
    fn: Callable[..., Any]
    description: str
    arguments: Arguments
    info_param: str | None


def _function_tool(fn: Callable[..., Any], description: str | None) -> _Made:
    where = f"tool {getattr(fn, '__qualname__', fn)!r}"
    if not callable(fn):
        raise ConfigError(f"{where}: not callable")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: its signature cannot be read ({e})") from None
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as e:  # noqa: BLE001 - any unresolvable annotation says the same
        raise ConfigError(f"{where}: its annotations cannot be resolved ({e})") from None
    doc, params_doc = _describe(fn)
    fields: list[tuple[str, Any, Any]] = []
    info_param = None
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ConfigError(
                f"{where}: *{p.name} has no schema; give each argument a parameter of its own"
            )
        if p.kind is p.POSITIONAL_ONLY:
            raise ConfigError(f"{where}: {p.name} is positional-only; tools are called by name")
        hint = hints.get(p.name, Any)
        if hint is StepInfo:
            info_param = p.name
            continue
        fields.append((p.name, hint, p.default))
    arguments = _struct_arguments(
        where, fn.__name__ if hasattr(fn, "__name__") else "tool", fields, params_doc
    )
    return _Made(fn, description if description is not None else doc, arguments, info_param)


def _struct_arguments(
    where: str, name: str, fields: list[tuple[str, Any, Any]], docs: dict[str, str]
) -> Arguments:
    """The arguments of a function's parameters: a msgspec Struct of them, or a
    pydantic model when msgspec has no schema for a type (a pydantic model's)."""
    annotated = [
        (n, Annotated[t, msgspec.Meta(description=docs[n])] if n in docs else t, d)
        for n, t, d in fields
    ]
    struct = msgspec.defstruct(
        f"{name}_arguments",
        [(n, t) if d is inspect.Parameter.empty else (n, t, d) for n, t, d in annotated],
        kw_only=True,
        forbid_unknown_fields=True,
    )
    names = [n for n, _, _ in fields]
    try:
        parameters = _inline(msgspec.json.schema(struct))
    except TypeError as e:
        return _pydantic_arguments(where, name, fields, docs, e)

    def parse(raw: Any) -> dict[str, Any]:
        value = msgspec.convert(raw, struct, strict=False)
        return {n: getattr(value, n) for n in names}

    return Arguments(parameters, parse)


def _pydantic_arguments(
    where: str,
    name: str,
    fields: list[tuple[str, Any, Any]],
    docs: dict[str, str],
    cause: Exception,
) -> Arguments:
    try:
        import pydantic
    except ImportError:
        raise ConfigError(f"{where}: its parameters have no JSON Schema ({cause})") from None
    defs: dict[str, Any] = {
        n: (
            t,
            pydantic.Field(
                default=... if d is inspect.Parameter.empty else d, description=docs.get(n)
            ),
        )
        for n, t, d in fields
    }
    try:
        model = pydantic.create_model(
            f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **defs
        )
        parameters = model.model_json_schema()
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, TypeError) as e:
        raise ConfigError(f"{where}: its parameters have no JSON Schema ({e})") from None
    names = [n for n, _, _ in fields]

    def parse(raw: Any) -> dict[str, Any]:
        value = model.model_validate(raw)
        return {n: getattr(value, n) for n in names}

    return Arguments(parameters, parse)


def _input_arguments(workflow: Workflow[Any]) -> Arguments:
    """A workflow tool's arguments: its input type's schema when that is an object
    (the arguments are the input), else ``{"input": ...}``."""
    where = f"workflow_tool({workflow.name!r})"
    if not workflow.takes_input:
        return Arguments(
            {"type": "object", "properties": {}, "additionalProperties": False}, _no_input
        )
    kind = workflow.input_type
    if kind is Any:
        return Arguments({"type": "object"}, _object_only(where))
    if _is_pydantic(kind):
        return _pydantic_input(where, kind)
    try:
        schema = _inline(msgspec.json.schema(kind))
    except TypeError as e:
        raise ConfigError(f"{where}: its input type {kind!r} has no JSON Schema ({e})") from None
    if schema.get("type") == "object":

        def parse(raw: Any) -> Any:
            msgspec.convert(raw, kind, strict=False)  # checked; the child decodes it itself
            return raw

        return Arguments(schema, parse)
    wrapped = {
        "type": "object",
        "properties": {"input": schema},
        "required": ["input"],
        "additionalProperties": False,
    }
    envelope = msgspec.defstruct("input", [("input", kind)], forbid_unknown_fields=True)

    def parse_wrapped(raw: Any) -> Any:
        msgspec.convert(raw, envelope, strict=False)
        return raw["input"]

    return Arguments(wrapped, parse_wrapped)


def _no_input(raw: Any) -> None:
    """A no-input workflow's arguments: ``{}`` (its schema allows no property)."""
    if raw != {}:
        shown = msgspec.json.encode(raw).decode()
        raise ValueError(f"the tool takes no arguments; give {{}}, not {_cut(shown)}")


def _pydantic_input(where: str, kind: Any) -> Arguments:
    try:
        parameters = kind.model_json_schema()
    except Exception as e:  # noqa: BLE001 - pydantic's schema errors are many
        raise ConfigError(f"{where}: its input type {kind!r} has no JSON Schema ({e})") from None

    def parse(raw: Any) -> Any:
        return kind.model_validate(raw).model_dump(mode="json")

    return Arguments(parameters, parse)


def _schema_arguments(parameters: dict[str, Any], where: str) -> Arguments:
    return Arguments(_checked_schema(parameters, where), lambda raw: raw)


def _checked_schema(parameters: Any, where: str) -> dict[str, Any]:
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise ConfigError(
            f"workflow_tool({where!r}, parameters=...): give a JSON Schema whose type is "
            f"'object', got {parameters!r}"
        )
    return parameters


def _object_only(where: str) -> Callable[[Any], Any]:
    def parse(raw: Any) -> Any:
        if not isinstance(raw, dict):
            raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
        return raw

    return parse


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """msgspec's schema of a type, its root inlined: ``{"$ref": "#/$defs/X", "$defs":
    {...}}`` becomes X's object schema, the other definitions kept beside it."""
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return schema
    defs = dict(schema.get("$defs", {}))
    root = dict(defs.pop(ref[len("#/$defs/") :]))
    root.pop("title", None)
    if defs:
        root["$defs"] = defs
    return root


def _describe(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The docstring's description and each parameter's (Google, NumPy or reST style)."""
    text = inspect.getdoc(fn)
    if not text:
        return "", {}
    parsed = docstring_parser.parse(text)
    parts = [p for p in (parsed.short_description, parsed.long_description) if p]
    params = {p.arg_name: p.description for p in parsed.params if p.description}
    return "\n\n".join(parts), params


def _is_pydantic(kind: Any) -> bool:
    return (
        isinstance(kind, type)
        and hasattr(kind, "model_json_schema")
        and hasattr(kind, "model_validate")
    )


def _jsonable(value: Any) -> Any:
    """A pydantic model a tool returned, as JSON-ready data (a step's result must be)."""
    if hasattr(value, "model_dump") and _is_pydantic(type(value)):
        return value.model_dump(mode="json")
    return value


async def _converted(awaitable: Any) -> Any:
    return _jsonable(await awaitable)


def _positional(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(
        1
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    )


def _said(error: Exception) -> str:
    """A validation error in one line: pydantic's as ``loc: msg`` for each error (its
    text spans lines and links to its docs), msgspec's as it is."""
    errors = getattr(error, "errors", None)
    if not callable(errors):
        return str(error)
    try:
        found = errors()
    except TypeError:
        return str(error)
    return "; ".join(
        f"{'.'.join(str(x) for x in e.get('loc', ())) or '$'}: {e.get('msg', '')}" for e in found
    )


def _cut(text: str, size: int = 200) -> str:
    return text if len(text) <= size else f"{text[:size]}..."
