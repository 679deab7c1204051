"""Approvals of ``fusee.ai.openai``: a tool call the SDK interrupted for (its
``needs_approval``) waits for a completion, and the answer goes to the run's state."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from agents.items import ToolApprovalItem

from fusee.actors.context import Context
from fusee.runtime.completions import Completion

__all__ = ("decide",)


async def decide(
    ctx: Context,
    state: Any,
    item: ToolApprovalItem,
    approve: Callable[..., Any] | None,
    timeout: str | float | None,
) -> None:
    """Wait for a person's answer to ``item`` and give it to the run's state."""
    raw = item.raw_item
    call_id = getattr(raw, "call_id", None) or (raw.get("call_id") if isinstance(raw, dict) else "")
    ask: Callable[[Completion], Any] | None = None
    if approve is not None:
        ask = _ask(approve, item)
    answer = await ctx.await_completion(
        f"approve:{item.tool_name}:{call_id}", ask=ask, timeout=timeout
    )
    if answer is True or (isinstance(answer, Mapping) and answer.get("approved") is True):
        state.approve(item)
        return
    reason = answer.get("reason") if isinstance(answer, Mapping) else None
    message = f"the call was not approved, so it did not run{': ' + reason if reason else ''}"
    state.reject(item, rejection_message=message)


def _ask(approve: Callable[..., Any], item: ToolApprovalItem) -> Callable[[Completion], Any]:
    try:
        params = [
            p
            for p in inspect.signature(approve).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
    except (TypeError, ValueError):
        params = []
    if len(params) >= 2:
        return lambda cb: approve(cb, item)
    return approve
