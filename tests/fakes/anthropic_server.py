"""A small Anthropic-compatible server for tests: ``POST /v1/messages``, JSON and SSE,
on 127.0.0.1 and a free port, in a thread of the test process.

The ``n``-th request gets the ``n``-th :class:`Reply` (``tests.fakes.openai_server``):
a text, ``tool_use`` blocks, or an error status in Anthropic's error shape. Streams are
the Messages API's events: ``message_start``, ``content_block_start``,
``content_block_delta`` (``text_delta``, ``input_json_delta``), ``content_block_stop``,
``message_delta`` (the ``stop_reason`` and output tokens), ``message_stop``; a reply's
``cut_after`` closes the stream after that many text tokens, with no ``message_stop``.

A request whose last message is the assistant's (a prefill) gets the rest of the
reply's text after it. Every request is recorded (``requests``).

    with FakeAnthropic([Reply("Hello")]) as fake:
        client = AsyncAnthropic(base_url=fake.base_url, api_key="test")
"""

from __future__ import annotations

import json
from typing import Any

from tests.fakes.openai_server import FakeOpenAI, Handler, Reply, Request

__all__ = ("FakeAnthropic",)


class FakeAnthropic(FakeOpenAI):
    """The fake Messages API; a context manager that starts and stops it."""

    def __init__(
        self, replies: list[Reply | str], *, delay: float = 0.0, model: str = "fake-claude"
    ) -> None:
        super().__init__(replies=replies, delay=delay, model=model)

    @property
    def base_url(self) -> str:
        """What ``AsyncAnthropic(base_url=...)`` takes: ``http://127.0.0.1:<port>``."""
        assert self._server is not None, "the fake server is not running"
        return f"http://127.0.0.1:{self._server.server_port}"


class AnthropicHandler(Handler):
    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/messages":
            self._error(404, f"Unknown request URL: POST {self.path}", "not_found_error")
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        except ValueError:
            self._error(400, "the body is not JSON", "invalid_request_error")
            return
        messages = body.get("messages") or []
        prefill = None
        if messages and messages[-1].get("role") == "assistant":
            content = messages[-1].get("content")
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            prefill = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        taken = self._take(body, prefill, "/v1/messages", "api_error")
        if taken is None:
            return
        n, request, reply = taken
        if "max_tokens" not in body:
            request.ending = "rejected"
            self._error(400, "max_tokens: Field required", "invalid_request_error")
            return
        text = reply.text
        if prefill and text.startswith(prefill):
            text = text[len(prefill) :]
        if body.get("stream"):
            self._sse(request, reply, text, n)
            return
        content_blocks: list[dict[str, Any]] = []
        if text:
            content_blocks.append({"type": "text", "text": text})
        content_blocks.extend(
            {"type": "tool_use", "id": i, "name": name, "input": json.loads(args)}
            for i, name, args in reply.tool_calls
        )
        self._json(
            {
                "id": f"msg_fake{n}",
                "type": "message",
                "role": "assistant",
                "model": self.fake.model,
                "content": content_blocks,
                "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": reply.usage[0], "output_tokens": reply.usage[1]},
            }
        )
        request.sent.append(text)
        request.ending = "done"

    def _sse(self, request: Request, reply: Reply, text: str, n: int) -> None:
        def event(kind: str, **data: Any) -> None:
            payload = {"type": kind, **data}
            self._write(f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode())

        self._start_sse()
        try:
            event(
                "message_start",
                message={
                    "id": f"msg_fake{n}",
                    "type": "message",
                    "role": "assistant",
                    "model": self.fake.model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": reply.usage[0], "output_tokens": 1},
                },
            )
            index = 0
            if text:
                event(
                    "content_block_start",
                    index=0,
                    content_block={"type": "text", "text": ""},
                )
                for token in self._tokens(request, reply, text):
                    event(
                        "content_block_delta",
                        index=0,
                        delta={"type": "text_delta", "text": token},
                    )
                if request.ending == "cut":
                    return
                event("content_block_stop", index=0)
                index = 1
            for k, (call_id, name, args) in enumerate(reply.tool_calls):
                block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
                event("content_block_start", index=index + k, content_block=block)
                half = len(args) // 2
                for piece in (args[:half], args[half:]):
                    event(
                        "content_block_delta",
                        index=index + k,
                        delta={"type": "input_json_delta", "partial_json": piece},
                    )
                event("content_block_stop", index=index + k)
            event(
                "message_delta",
                delta={
                    "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
                    "stop_sequence": None,
                },
                usage={"output_tokens": reply.usage[1]},
            )
            event("message_stop")
            self._write(b"")
            request.ending = "done"
        except (BrokenPipeError, ConnectionResetError):
            request.ending = "disconnected"
            self.close_connection = True

    def _error(self, status: int, message: str, type_: str) -> None:
        self._json({"type": "error", "error": {"type": type_, "message": message}}, status)


FakeAnthropic.handler = AnthropicHandler
