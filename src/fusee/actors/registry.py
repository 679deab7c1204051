"""Workflows and object types by name: what ``@fusee.workflow`` and ``fusee.object``
register and workers look up. Plain data: the callers' side of an object type
(``ObjectType.key``) is ``fusee._objects``."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, get_type_hints

from fusee.errors import ConfigError, InvalidArgument
from fusee.runtime.ids import validate_name
from fusee.runtime.retry import Retry

__all__ = (
    "Workflow",
    "workflow",
    "REGISTRY",
    "Registry",
    "Handler",
    "ObjectSpec",
    "make_handler",
    "shared",
    "exclusive",
    "DEFAULT_HANDLER_TIMEOUT",
)

DEFAULT_HANDLER_TIMEOUT = 15 * 60.0  # an exclusive handler holds its key at most this long

R = TypeVar("R")


@dataclass(frozen=True)
class Workflow(Generic[R]):
    """A workflow: a name and the async function that runs it."""

    name: str
    fn: Callable[..., Awaitable[R]]
    input_type: Any
    takes_input: bool
    retry: Retry | None = None  # every step's, unless the step has its own
    max_steps: int | None = None  # steps a run may journal, all generations

    async def __call__(self, ctx: Any, *args: Any) -> R:  # ctx: a fusee.Context
        return await self.fn(ctx, *args)


@dataclass(frozen=True)
class Handler:
    """One handler of an object type: exclusive (one at a time per key, may change the
    state, journaled) or shared (concurrent, reads the state)."""

    name: str
    fn: Callable[..., Any]
    shared: bool = False
    timeout: float | None = None  # exclusive only; None: the type's
    input_type: Any = Any
    takes_input: bool = True


def shared(fn: Callable[..., Any]) -> Handler:
    """Mark ``fn(ctx[, input])`` a shared handler: it runs at once, concurrently with
    anything, on any worker, and reads the state as of the last finished exclusive
    invocation (``ctx.state.get``). Sync or async.

    Example:
        ``"history": fusee.shared(lambda ctx: ctx.state.get("history") or [])``
    """
    return make_handler("", fn, shared=True)


def exclusive(fn: Callable[..., Any], *, timeout: str | float | None = None) -> Handler:
    """Mark ``fn(ctx[, input])`` an exclusive handler with its own ``timeout`` (how long
    one invocation may hold the key; the type's default otherwise). A plain function in
    the handlers map is exclusive already.

    Example:
        ``"say": fusee.exclusive(say, timeout="30m")``
    """
    from fusee.runtime.durations import parse_duration

    seconds = parse_duration(timeout, "the timeout of an exclusive handler") if timeout else None
    return make_handler("", fn, shared=False, timeout=seconds)


def make_handler(name: str, fn: Any, *, shared: bool, timeout: float | None = None) -> Handler:
    """The handler ``name`` of ``fn`` (a function, or a ``Handler``, which keeps its kind)."""
    if isinstance(fn, Handler):
        return Handler(name, fn.fn, fn.shared, fn.timeout, fn.input_type, fn.takes_input)
    if not callable(fn):
        raise InvalidArgument(f"handler {name or ''!r}: {fn!r} is not callable")
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    if not 1 <= len(params) <= 2:
        raise InvalidArgument(
            f"handler {name!r}: {getattr(fn, '__qualname__', fn)!r} must take (ctx) or (ctx, input)"
        )
    return Handler(name, fn, shared, timeout, _input_type(fn, params), len(params) == 2)


@dataclass(frozen=True)
class ObjectSpec:
    """A keyed object type as workers see it: its name, its handlers, and the default
    timeout of its exclusive handlers (``fusee.ObjectType`` adds the callers' ``key``)."""

    name: str
    handlers: dict[str, Handler]
    timeout: float = DEFAULT_HANDLER_TIMEOUT

    def handler_timeout(self, handler: Handler) -> float:
        return handler.timeout if handler.timeout is not None else self.timeout


class Registry:
    def __init__(self) -> None:
        self._by_name: dict[str, Workflow[Any]] = {}
        self._objects: dict[str, ObjectSpec] = {}

    def add_object(self, obj: ObjectSpec) -> None:
        self._objects[obj.name] = obj  # a module imported twice defines it again

    def get_object(self, name: str) -> ObjectSpec | None:
        return self._objects.get(name)

    def object_names(self) -> list[str]:
        return sorted(self._objects)

    def add(self, wf: Workflow[Any]) -> None:
        existing = self._by_name.get(wf.name)
        if existing is not None and existing.fn is not wf.fn:
            same_place = (
                existing.fn.__module__ == wf.fn.__module__
                and existing.fn.__qualname__ == wf.fn.__qualname__
            )
            if not same_place:  # a module imported twice re-registers the same function
                raise InvalidArgument(
                    f"two workflows are named {wf.name!r}: {_where(existing.fn)} and {_where(wf.fn)}"
                )
        self._by_name[wf.name] = wf

    def get(self, name: str) -> Workflow[Any] | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)


def _input_type(fn: Callable[..., Any], params: list[inspect.Parameter]) -> Any:
    """The annotation of ``fn``'s second parameter (its input), or ``Any``."""
    if len(params) != 2:
        return Any
    try:
        hints = get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to plain JSON
        hints = {}
    return hints.get(params[1].name, Any)


def _where(fn: Callable[..., Any]) -> str:
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn)
    return f"{code.co_filename}:{code.co_firstlineno}"


REGISTRY = Registry()


def workflow(
    name: str, *, retry: Retry | None = None, max_steps: int | None = None
) -> Callable[[Callable[..., Awaitable[R]]], Workflow[R]]:
    """Register an async function ``fn(ctx, arg)`` as the workflow ``name``.

    The second parameter's annotation, when it has one, is the type the run's input
    is decoded into (a dataclass, a msgspec Struct, ``list[str]``...). ``retry``: the
    retry policy of every step of its runs (a step's own ``retry=`` wins; its
    compensations' too). ``max_steps``: a run may journal at most this many steps
    (across replays and generations, not attempts); the step that would start beyond
    it fails the run with ``fusee.StepBudgetExceeded``.

    Raises:
        ConfigError: ``retry`` is not a ``fusee.Retry``, or ``max_steps`` not an int >= 1.

    Example:
        ``@fusee.workflow("agent")
        async def agent(ctx: fusee.Context, question: str) -> str: ...``
    """
    checked = validate_name(name, "workflow name")
    if retry is not None and not isinstance(retry, Retry):
        raise ConfigError(f"workflow {checked!r}: retry={retry!r} must be a fusee.Retry")
    if max_steps is not None and (
        isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1
    ):
        raise ConfigError(f"workflow {checked!r}: max_steps={max_steps!r} must be an int >= 1")

    def register(fn: Callable[..., Awaitable[R]]) -> Workflow[R]:
        if not inspect.iscoroutinefunction(fn):
            raise InvalidArgument(f"workflow {checked!r}: {fn!r} must be an async function")
        params = list(inspect.signature(fn).parameters.values())
        if not params or len(params) > 2:
            raise InvalidArgument(
                f"workflow {checked!r}: {fn.__qualname__} must take (ctx) or (ctx, input)"
            )
        wf = Workflow(checked, fn, _input_type(fn, params), len(params) == 2, retry, max_steps)
        REGISTRY.add(wf)
        return wf

    return register
