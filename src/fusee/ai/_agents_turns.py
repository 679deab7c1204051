"""The order a model response's tool calls take their steps in (``fusee.ai.openai``).

The SDK runs a response's function calls as tasks of its own, each reaching its tool
after awaiting its hooks, guardrails and approval check, whose latency varies: the
step positions would follow that timing, and a replay would hand one call's journaled
result to another call of the same tool. A :class:`Turnstile` makes each call wait
until every earlier call of the response has taken its position.
"""

from __future__ import annotations

from collections.abc import Iterable

import anyio

__all__ = ("Turnstile",)


class Turnstile:
    """The call IDs of one model response, in its order; each takes its turn once."""

    def __init__(self) -> None:
        self._order: list[str] = []
        self._taken: dict[str, anyio.Event] = {}

    def reset(self, call_ids: Iterable[str]) -> None:
        """A new response: its calls, in order (earlier ones no longer wait)."""
        for event in self._taken.values():
            event.set()  # a call of the old response still waiting goes on
        self._order = list(dict.fromkeys(call_ids))
        self._taken = {cid: anyio.Event() for cid in self._order}

    async def enter(self, call_id: str) -> None:
        """Wait until every call before ``call_id`` in the response has taken its turn,
        then take it (the caller reserves its step position next, before it awaits:
        the calls behind it only run once it has). A call not in the response (a
        resumed run's approved call) does not wait."""
        if call_id not in self._taken:
            return
        for earlier in self._order[: self._order.index(call_id)]:
            await self._taken[earlier].wait()
        self._taken[call_id].set()
