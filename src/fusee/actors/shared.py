"""Shared handlers: run at once, on whichever worker of the queue group gets the call,
concurrently with anything, reading the state as projected in KV (as of the last
finished exclusive invocation). Nothing is journaled: a shared handler reads, so running
it again is harmless, and its caller retries it when no answer comes.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
import msgspec

from fusee.actors.object_state import current_state
from fusee.actors.ports import ClusterStore
from fusee.actors.registry import Registry
from fusee.errors import FuseeError, error_message, error_type_name
from fusee.logs import get_logger
from fusee.runtime.codec import decode_value, encode_value
from fusee.runtime.durations import format_duration
from fusee.runtime.objects import ReadOnlyState, object_id

__all__ = ("SharedContext", "serve_shared_call")

log = get_logger()


class SharedContext:
    """``ctx`` in a shared handler: the object's type and key, and ``ctx.state`` to
    read. The journaled calls of ``Context`` (steps, waits, children) are not here.

    Attributes:
        object_type: the object type's name.
        key: the object's key.
        handler: the handler's name.
        state: the state as of the last finished exclusive invocation (read only:
            ``set``, ``delete`` and ``clear`` raise ``FuseeError``).
    """

    def __init__(self, object_type: str, key: str, handler: str, state: ReadOnlyState) -> None:
        self.object_type = object_type
        self.key = key
        self.handler = handler
        self.state = state

    if not TYPE_CHECKING:
        # Not in the type (mypy says there is no ctx.step here); code that ignores the
        # types is told why at runtime.
        def __getattr__(self, name: str) -> NoReturn:
            raise FuseeError(
                f"ctx.{name} in shared handler {self.handler!r} of object "
                f"{self.object_type!r}: shared handlers are not journaled and only read "
                f"the state; make it an exclusive handler to use ctx.{name}"
            )


def _reply(body: dict[str, Any]) -> bytes:
    return msgspec.json.encode(body)


async def serve_shared_call(
    store: ClusterStore, registry: Registry, data: bytes, reply: str
) -> None:
    """Answer one shared handler call: ``{"type", "key", "handler", "input"}`` in,
    ``{"result"}`` or ``{"error_type", "message"}`` out."""
    try:
        body = msgspec.json.decode(data)
        object_type, key, name = body["type"], body["key"], body["handler"]
        object_id(object_type, key)
        obj = registry.get_object(object_type)
        handler = obj.handlers.get(name) if obj is not None else None
        if obj is None or handler is None or not handler.shared:
            has = ", ".join(sorted(h for h, v in obj.handlers.items() if v.shared)) if obj else ""
            raise FuseeError(
                f"object {object_type!r} has no shared handler {name!r} at this worker "
                f"(shared handlers here: {has or 'none'})"
            )
        state = await current_state(store, object_type, key)
        ctx = SharedContext(object_type, key, name, ReadOnlyState(state, object_type))
        timeout = obj.handler_timeout(handler)
        # Only this deadline is a fusee.Timeout: a TimeoutError the handler raises
        # itself (an HTTP client's) is its own error, reported as such.
        with anyio.move_on_after(timeout) as deadline:
            if handler.takes_input:
                raw = msgspec.json.encode(body.get("input"))
                result = handler.fn(ctx, decode_value(raw, handler.input_type))
            else:
                result = handler.fn(ctx)
            if inspect.isawaitable(result):
                result = await result
        if deadline.cancelled_caught:
            out = _reply(
                {
                    "error_type": "fusee.Timeout",
                    "message": f"the shared handler took longer than {format_duration(timeout)}",
                }
            )
        else:
            data = encode_value(result, f"the result of {name!r}", limit=store.max_value)
            out = _reply({"result": msgspec.Raw(data)})
    except Exception as exc:  # noqa: BLE001 - the handler's error goes back to its caller
        out = _reply({"error_type": error_type_name(exc), "message": error_message(exc)})
    await store.publish_core(reply, out)
