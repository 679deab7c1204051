"""Workflows by name: what ``@fusee.workflow`` registers and workers look up."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, get_type_hints

from fusee.errors import InvalidArgument
from fusee.runtime.ids import validate_name

if TYPE_CHECKING:
    from fusee.actors.context import Context

__all__ = (
    "Workflow",
    "workflow",
    "REGISTRY",
    "Registry",
    "Handler",
    "ObjectType",
    "object",
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

    async def __call__(self, ctx: Context, *args: Any) -> R:
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
    return _handler("", fn, shared=True)


def exclusive(fn: Callable[..., Any], *, timeout: str | float | None = None) -> Handler:
    """Mark ``fn(ctx[, input])`` an exclusive handler with its own ``timeout`` (how long
    one invocation may hold the key; the type's default otherwise). A plain function in
    the handlers map is exclusive already.

    Example:
        ``"say": fusee.exclusive(say, timeout="30m")``
    """
    from fusee.runtime.durations import parse_duration

    seconds = parse_duration(timeout, "the timeout of an exclusive handler") if timeout else None
    return _handler("", fn, shared=False, timeout=seconds)


def _handler(name: str, fn: Any, *, shared: bool, timeout: float | None = None) -> Handler:
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
class ObjectType:
    """A keyed object type: its name, its handlers, and the default timeout of its
    exclusive handlers. ``key(k)`` is the handle callers use."""

    name: str
    handlers: dict[str, Handler]
    timeout: float = DEFAULT_HANDLER_TIMEOUT

    def key(self, key: str, *, engine: Any = None) -> Any:
        """The object under ``key``: ``call``, ``send``, ``state``... (see ``ObjectKey``).
        Uses the engine ``fusee.connect()`` made last unless ``engine`` is given.

        Example:
            ``await chats.key("user-7").call("say", "Where is my order?")``
        """
        from fusee._objects import ObjectKey

        return ObjectKey(self, key, engine)

    def handler_timeout(self, handler: Handler) -> float:
        return handler.timeout if handler.timeout is not None else self.timeout


def object(  # noqa: A001 - fusee.object reads as the concept's name
    name: str,
    handlers: dict[str, Any],
    *,
    timeout: str | float = DEFAULT_HANDLER_TIMEOUT,
) -> ObjectType:
    """Define (and register) the keyed object type ``name``: one actor per key, its
    state in KV, exclusive handlers one at a time per key in arrival order, shared ones
    at once. ``timeout`` bounds each exclusive invocation (default 15 minutes).

    Example:
        ``chats = fusee.object("chat", {"say": say, "history": fusee.shared(history)})``
    """
    from fusee.runtime.durations import parse_duration
    from fusee.runtime.objects import object_id

    object_id(name, "k")  # the type's name rules
    if not isinstance(handlers, dict) or not handlers:
        raise InvalidArgument(
            f"object {name!r}: handlers must be a non-empty dict of name: function"
        )
    made: dict[str, Handler] = {}
    for hname, fn in handlers.items():
        hname = validate_name(hname, f"handler name of object {name!r}")
        if hname.startswith("fusee."):
            raise InvalidArgument(
                f"object {name!r}: handler names starting with 'fusee.' are reserved"
            )
        made[hname] = _handler(hname, fn, shared=False)  # a Handler keeps its own kind
    seconds = parse_duration(timeout, f"the timeout of object {name!r}")
    if seconds <= 0:
        raise InvalidArgument(f"object {name!r}: timeout must be positive, got {timeout!r}")
    obj = ObjectType(name, made, seconds)
    REGISTRY.add_object(obj)
    return obj


class Registry:
    def __init__(self) -> None:
        self._by_name: dict[str, Workflow[Any]] = {}
        self._objects: dict[str, ObjectType] = {}

    def add_object(self, obj: ObjectType) -> None:
        self._objects[obj.name] = obj  # a module imported twice defines it again

    def get_object(self, name: str) -> ObjectType | None:
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


def workflow(name: str) -> Callable[[Callable[..., Awaitable[R]]], Workflow[R]]:
    """Register an async function ``fn(ctx, arg)`` as the workflow ``name``.

    The second parameter's annotation, when it has one, is the type the run's input
    is decoded into (a dataclass, a msgspec Struct, ``list[str]``...).

    Example:
        ``@fusee.workflow("agent")
        async def agent(ctx: fusee.Context, question: str) -> str: ...``
    """
    checked = validate_name(name, "workflow name")

    def register(fn: Callable[..., Awaitable[R]]) -> Workflow[R]:
        if not inspect.iscoroutinefunction(fn):
            raise InvalidArgument(f"workflow {checked!r}: {fn!r} must be an async function")
        params = list(inspect.signature(fn).parameters.values())
        if not params or len(params) > 2:
            raise InvalidArgument(
                f"workflow {checked!r}: {fn.__qualname__} must take (ctx) or (ctx, input)"
            )
        wf = Workflow(checked, fn, _input_type(fn, params), len(params) == 2)
        REGISTRY.add(wf)
        return wf

    return register
