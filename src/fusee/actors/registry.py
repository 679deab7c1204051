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

__all__ = ("Workflow", "workflow", "REGISTRY", "Registry")

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


class Registry:
    def __init__(self) -> None:
        self._by_name: dict[str, Workflow[Any]] = {}

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
        input_type: Any = Any
        if len(params) == 2:
            try:
                hints = get_type_hints(fn)
            except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to plain JSON
                hints = {}
            input_type = hints.get(params[1].name, Any)
        wf = Workflow(checked, fn, input_type, len(params) == 2)
        REGISTRY.add(wf)
        return wf

    return register
