"""The fake OpenAI server answering by the conversation, not by request count: for the
Pydantic AI adapter's worker tests, where many runs (and replays after kills) share one
server. A reply is picked by the conversation's first user message (its key) and the
number of tool results in it (the turn), so every run of a script gets the same answers
whatever the order its requests arrive in. Every request is counted per (key, turn).

``down`` answers 500 to requests of that turn (a provider outage) until it is cleared.

``kill_at[(key, turn)] = i`` SIGKILLs the process that made that request (its PID in
the header ``X-Fake-Pid``), once: on arrival for ``i == 0`` (the request in flight,
nothing answered), else as the stream reaches its ``i``-th text token (mid-stream). The
kills are recorded in ``killed`` as ``(key, turn, pid)``.
"""

from __future__ import annotations

import collections
import json
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

from tests.fakes.openai_server import FakeOpenAI, Handler, Reply, Request

__all__ = ("AgentFake", "Script")

Script = Callable[[str, int], Reply]
"""``script(key, turn)``: the reply to the ``turn``-th request of conversation ``key``."""


def _conversation(body: dict[str, Any]) -> tuple[str, int]:
    messages = body.get("messages") or []
    users = [m for m in messages if m.get("role") == "user"]
    first = users[0].get("content") if users else ""
    key = first if isinstance(first, str) else json.dumps(first)
    return key, sum(m.get("role") == "tool" for m in messages)


class AgentHandler(Handler):
    _kill: tuple[tuple[str, int], int] | None = None  # this request's mid-stream kill

    def _kill_sender(self, conversation: tuple[str, int]) -> None:
        fake: AgentFake = self.fake  # type: ignore[assignment]
        pid = int(self.headers.get("X-Fake-Pid") or 0)
        with fake._lock:
            fake.kill_at.pop(conversation, None)
            fake.killed.append((*conversation, pid))
        if pid > 0:
            os.kill(pid, signal.SIGKILL)
        self.close_connection = True

    def _tokens(self, request: Request, reply: Reply, text: str) -> Iterator[str]:
        for i, token in enumerate(super()._tokens(request, reply, text)):
            if self._kill is not None and i == self._kill[1]:
                self._kill_sender(self._kill[0])
                request.ending = "killed"
                return
            yield token

    def _take(
        self, body: dict[str, Any], prefill: str | None, path: str, error_type: str
    ) -> tuple[int, Request, Reply] | None:
        fake: AgentFake = self.fake  # type: ignore[assignment]
        n, request = fake._record(body, prefill, path)
        key, turn = _conversation(body)
        with fake._lock:
            fake.asked[(key, turn)] += 1
            kill = fake.kill_at.get((key, turn))
        if kill == 0:
            request.ending = "killed"
            self._kill_sender((key, turn))
            return None
        if kill is not None:
            self._kill = ((key, turn), kill)
        if fake.down is not None and turn == fake.down:
            request.ending = "rejected"
            self._error(500, "the fake provider is down", error_type)
            return None
        return n, request, fake.script(key, turn)


class AgentFake(FakeOpenAI):
    """:class:`FakeOpenAI` in a mode of its own: ``script(key, turn)`` answers."""

    handler = AgentHandler

    def __init__(self, script: Script, **kwargs: Any) -> None:
        super().__init__(replies=[], **kwargs)
        self.script = script
        self.asked: collections.Counter[tuple[str, int]] = collections.Counter()
        self.down: int | None = None
        self.kill_at: dict[tuple[str, int], int] = {}
        self.killed: list[tuple[str, int, int]] = []

    def __enter__(self) -> AgentFake:
        self.start()
        return self
