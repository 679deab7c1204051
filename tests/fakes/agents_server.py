"""The fake OpenAI server (``openai_server.py``) answering by conversation, not by
request number: for agents run by several workers at once, or again after a crash.

``script`` is the agent's turns, each a :class:`Reply`. A request gets the first turn
whose tool calls its input has not answered yet (a ``function_call_output`` item of
the Responses API, a ``tool`` message of Chat Completions, naming the call's ID), so
the same conversation always gets the same answer, and every request is counted
(``fake.requests``: a request asked again for a journaled answer shows there). While
``down`` is set, every request for turn ``down_from`` or later gets a 500.
"""

from __future__ import annotations

import threading
from typing import Any

from tests.fakes.openai_server import FakeOpenAI, Handler, Reply, Request

__all__ = ("AgentsFake", "answered")


def answered(body: dict[str, Any]) -> set[str]:
    """The tool-call IDs whose results the request carries."""
    ids = {
        item.get("call_id", "")
        for item in body.get("input") or []
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }
    ids |= {
        m.get("tool_call_id", "") for m in body.get("messages") or [] if m.get("role") == "tool"
    }
    return ids


class AgentsFake(FakeOpenAI):
    """``AgentsFake(script)``: a context manager, as :class:`FakeOpenAI`."""

    def __init__(self, script: list[Reply], **kwargs: Any) -> None:
        super().__init__(replies=[], **kwargs)
        self.script = script
        self.down = threading.Event()
        self.down_from = 0

    def __enter__(self) -> AgentsFake:
        self.start()
        return self

    def turn(self, body: dict[str, Any]) -> int:
        """The turn a request is for: the first whose calls it has not answered."""
        done = answered(body)
        for i, reply in enumerate(self.script):
            if not reply.tool_calls or not {c[0] for c in reply.tool_calls} <= done:
                return i
        return len(self.script) - 1

    def turns(self) -> list[int]:
        """The turn of each request so far, in the order they came."""
        return [self.turn(r.body) for r in self.snapshot()]


class _Handler(Handler):
    fake: AgentsFake

    def _take(
        self, body: dict[str, Any], prefill: str | None, path: str, error_type: str
    ) -> tuple[int, Request, Reply] | None:
        n, request = self.fake._record(body, prefill, path)
        if self.fake.down.is_set() and self.fake.turn(body) >= self.fake.down_from:
            request.ending = "rejected"
            self._error(500, "the fake is down", error_type)
            return None
        return n, request, self.fake.script[self.fake.turn(body)]


AgentsFake.handler = _Handler
