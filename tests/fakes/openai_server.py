"""A small OpenAI-compatible server for tests: ``POST /v1/chat/completions`` and
``POST /v1/responses``, JSON and SSE, on 127.0.0.1 and a free port, in a thread of the
test process.

Two modes. With ``text`` (the token-stream tests of ``model_call``) it streams that one
text as Chat Completions. With ``replies`` (fusee.ai's provider tests) the ``n``-th
request gets the ``n``-th :class:`Reply`: a text, tool calls, or an error status, in
the shape of the endpoint asked (a ``chat.completion`` or a ``Response``, as JSON or as
their SSE events). What follows describes the text mode.

It streams one known text token by token (``delay`` seconds before each), as OpenAI
does: server-sent events of ``chat.completion.chunk`` objects over chunked HTTP/1.1,
the first with the assistant role, one per token, a last one with ``finish_reason``
``"stop"``, then ``data: [DONE]``.

An assistant prefill is honoured: when the request's last message is
``{"role": "assistant", "content": prefix}``, the reply continues the text after
``prefix`` (a prefix that is not one of the text is a 400, in OpenAI's error shape).
That is how fusee's ``resume`` maps to a provider.

``cut_after`` makes a request end *cleanly* after that many tokens, with neither a
``finish_reason`` nor ``[DONE]`` (a proxy or load balancer that closes the stream):
the raw client then ends its iteration quietly, with no error.

``hold(request, at)`` makes a request wait before its token ``at`` until ``release()``:
a test that kills the client mid-stream holds the stream open as long as it needs.

Every request is recorded (:class:`Request`): its body, the prefill it carried, the
chunks the server wrote, and how the response ended.

    with FakeOpenAI(text, delay=0.02) as fake:
        client = AsyncOpenAI(base_url=fake.base_url, api_key="test")
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import anyio

__all__ = ("FakeOpenAI", "Handler", "Reply", "Request", "tokenize")

Ending = Literal["running", "done", "cut", "disconnected", "rejected", "killed"]


def tokenize(text: str) -> list[str]:
    """Split ``text`` the way the fake streams it: a word with the space before it
    (``"Hello"``, ``" world"``, ``"."`` ...), trailing space as a last token."""
    return re.findall(r"\s*\S+|\s+$", text)


@dataclass
class Reply:
    """One scripted answer: ``text`` (JSON text for structured output), ``tool_calls``
    as ``(call id, name, arguments JSON)``; ``status`` other than 200 answers an error
    of that status in OpenAI's shape; ``cut_after`` cuts a stream after that many text
    tokens (a clean close with no terminal event)."""

    text: str = ""
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)
    status: int = 200
    cut_after: int | None = None
    usage: tuple[int, int] = (11, 7)


@dataclass
class Request:
    """One request the fake server received, and what it answered."""

    body: dict[str, Any]
    prefill: str | None  # the assistant prefix it continued from (None: no prefill)
    path: str = "/v1/chat/completions"
    sent: list[str] = field(default_factory=list)  # the chunks written, in order
    ending: Ending = "running"

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))


class FakeOpenAI:
    """The fake server; a context manager that starts and stops it."""

    def __init__(
        self,
        text: str = "",
        *,
        replies: list[Reply | str] | None = None,
        delay: float = 0.02,
        model: str = "fake-gpt",
        cut_after: Callable[[int], int | None] | None = None,
    ) -> None:
        """``cut_after(n)``: for the ``n``-th request (from 1), cut the stream cleanly after
        that many tokens, or None to finish it. ``replies``: the scripted mode."""
        self.text = text
        self.replies = [Reply(r) if isinstance(r, str) else r for r in replies or []]
        self.scripted = replies is not None
        self.delay = delay
        self.model = model
        self.cut_after = cut_after or (lambda n: None)
        self.requests: list[Request] = []
        self._holds: dict[int, int] = {}  # request number (from 1) -> token it waits before
        self._released = threading.Event()
        self._lock = threading.Lock()
        # notified as each request's handler returns
        self._answered = threading.Condition(self._lock)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """What ``AsyncOpenAI(base_url=...)`` takes: ``http://127.0.0.1:<port>/v1``."""
        assert self._server is not None, "the fake server is not running"
        return f"http://127.0.0.1:{self._server.server_port}/v1"

    handler: type[Handler]  # set below the class: the request handler it serves with

    def start(self) -> FakeOpenAI:
        handler = type("Handler", (self.handler,), {"fake": self})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True  # a stream being written never holds up the test
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def hold(self, request: int, at: int) -> None:
        """Make the ``request``-th request (from 1) wait before its token ``at`` (from 0)
        until :meth:`release` (at most 30 s)."""
        self._holds[request] = at

    def release(self) -> None:
        self._released.set()

    # -- for the handler ------------------------------------------------------------

    def _record(
        self, body: dict[str, Any], prefill: str | None, path: str = "/v1/chat/completions"
    ) -> tuple[int, Request]:
        with self._lock:
            self.requests.append(Request(body, prefill, path))
            return len(self.requests), self.requests[-1]

    def snapshot(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def _answer_done(self) -> None:
        with self._answered:
            self._answered.notify_all()

    async def settled(self, count: int, timeout: float = 5.0) -> list[Request]:
        """The requests, once ``count`` came and none is still being answered: a client
        that read a stream's last event can be ahead of the handler recording its ending."""

        def wait() -> list[Request] | None:
            with self._answered:
                done = self._answered.wait_for(
                    lambda: (
                        len(self.requests) >= count
                        and all(r.ending != "running" for r in self.requests)
                    ),
                    timeout=timeout,
                )
                return list(self.requests) if done else None

        found = await anyio.to_thread.run_sync(wait)
        if found is None:
            endings = [r.ending for r in self.snapshot()]
            raise AssertionError(f"{count} settled requests not seen in {timeout}s: {endings}")
        return found


class Handler(BaseHTTPRequestHandler):
    """The OpenAI endpoints; its helpers (``_write``, ``_json``, ``_start_sse``,
    ``_error``) serve other providers' fakes too."""

    fake: FakeOpenAI
    protocol_version = "HTTP/1.1"  # chunked responses, keep-alive, as the real API

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        finally:
            self.fake._answer_done()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass  # quiet: the test reads ``fake.requests``

    def do_POST(self) -> None:
        if self.fake.scripted:
            self._scripted()
            return
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"Unknown request URL: POST {self.path}", "invalid_request_error")
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        except ValueError:
            self._error(
                400, "We could not parse the JSON body of your request.", "invalid_request_error"
            )
            return
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        prefill = last.get("content") if last.get("role") == "assistant" else None
        n, request = self.fake._record(body, prefill)
        if not body.get("stream"):
            request.ending = "rejected"
            self._error(400, "this fake server only streams (stream=true)", "invalid_request_error")
            return
        prefix = prefill or ""
        if not isinstance(prefix, str) or not self.fake.text.startswith(prefix):
            request.ending = "rejected"
            self._error(
                400,
                f"the assistant prefill is not a prefix of the text: {prefix!r}",
                "invalid_request_error",
            )
            return
        tokens = tokenize(self.fake.text[len(prefix) :])
        self._stream(request, tokens, self.fake.cut_after(n), self.fake._holds.get(n))

    def _stream(
        self, request: Request, tokens: list[str], cut: int | None, hold: int | None = None
    ) -> None:
        ident = f"chatcmpl-fake{len(self.fake.requests)}"
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.fake.model,
                "system_fingerprint": "fp_fake",
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }

        self._start_sse()
        try:
            self._event(chunk({"role": "assistant", "content": "", "refusal": None}, None))
            for i, token in enumerate(tokens):
                if cut is not None and i >= cut:
                    request.ending = "cut"
                    self._write(b"")  # the end of the chunked body: a clean close
                    return
                if i == hold:
                    self.fake._released.wait(timeout=30)
                time.sleep(self.fake.delay)
                request.sent.append(token)
                self._event(chunk({"content": token}, None))
            self._event(chunk({}, "stop"))
            self._write(b"data: [DONE]\n\n")
            self._write(b"")
            request.ending = "done"
        except (BrokenPipeError, ConnectionResetError):
            request.ending = "disconnected"
            self.close_connection = True

    def _event(self, data: dict[str, Any]) -> None:
        self._write(b"data: " + json.dumps(data).encode() + b"\n\n")

    def _write(self, data: bytes) -> None:
        """One HTTP chunk (an empty one ends the body), flushed at once."""
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _error(self, status: int, message: str, type_: str) -> None:
        error = {"message": message, "type": type_, "param": None, "code": None}
        self._json({"error": error}, status)

    # -- the scripted mode ------------------------------------------------------------

    def _scripted(self) -> None:
        path = self.path.rstrip("/")
        if path not in ("/v1/chat/completions", "/v1/responses"):
            self._error(404, f"Unknown request URL: POST {self.path}", "invalid_request_error")
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        except ValueError:
            self._error(400, "We could not parse the JSON body.", "invalid_request_error")
            return
        messages = body.get("messages") or []
        for i, m in enumerate(messages):
            # as OpenAI: an assistant message's content may be null only with tool calls
            if (
                m.get("role") == "assistant"
                and m.get("content") is None
                and not m.get("tool_calls")
            ):
                self._error(
                    400,
                    f"Invalid value for 'messages[{i}].content': expected a string, got null.",
                    "invalid_request_error",
                )
                return
        last = messages[-1] if messages else {}
        prefill = last.get("content") if last.get("role") == "assistant" else None
        taken = self._take(body, prefill, path, "server_error")
        if taken is None:
            return
        n, request, reply = taken
        text = reply.text
        if prefill and text.startswith(prefill) and not reply.tool_calls:
            text = text[len(prefill) :]
        ident = f"fake{n}"
        if path == "/v1/responses":
            if body.get("stream"):
                self._responses_sse(request, reply, text, ident)
            else:
                self._json(_response_object(self.fake.model, reply, text, ident, "completed"))
                request.sent.append(text)
                request.ending = "done"
            return
        if body.get("stream"):
            self._chat_sse(request, reply, text, ident, bool(body.get("stream_options")))
            return
        calls = [
            {"id": i, "type": "function", "function": {"name": name, "arguments": args}}
            for i, name, args in reply.tool_calls
        ]
        message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        self._json(
            {
                "id": f"chatcmpl-{ident}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.fake.model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": "tool_calls" if calls else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": reply.usage[0],
                    "completion_tokens": reply.usage[1],
                    "total_tokens": sum(reply.usage),
                },
            }
        )
        request.sent.append(text)
        request.ending = "done"

    def _take(
        self, body: dict[str, Any], prefill: str | None, path: str, error_type: str
    ) -> tuple[int, Request, Reply] | None:
        """Record the request and take its reply; None: answered with an error."""
        n, request = self.fake._record(body, prefill, path)
        if n > len(self.fake.replies):
            request.ending = "rejected"
            self._error(500, f"the fake has {len(self.fake.replies)} replies", error_type)
            return None
        reply = self.fake.replies[n - 1]
        if reply.status != 200:
            request.ending = "rejected"
            self._error(reply.status, f"scripted error {reply.status}", error_type)
            return None
        return n, request, reply

    def _tokens(self, request: Request, reply: Reply, text: str) -> Iterator[str]:
        """The text's tokens as they are to be sent; at the reply's ``cut_after`` the
        body ends cleanly (``request.ending`` is ``"cut"``) and so does the iteration."""
        for i, token in enumerate(tokenize(text)):
            if reply.cut_after is not None and i >= reply.cut_after:
                request.ending = "cut"
                self._write(b"")
                return
            time.sleep(self.fake.delay)
            request.sent.append(token)
            yield token

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chat_sse(self, request: Request, reply: Reply, text: str, ident: str, usage: bool) -> None:
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {
                "id": f"chatcmpl-{ident}",
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.fake.model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }

        self._start_sse()
        try:
            self._event(chunk({"role": "assistant", "content": ""}, None))
            for token in self._tokens(request, reply, text):
                self._event(chunk({"content": token}, None))
            if request.ending in ("cut", "killed"):
                return
            for index, (call_id, name, args) in enumerate(reply.tool_calls):
                head = {"index": index, "id": call_id, "type": "function"}
                self._event(
                    chunk(
                        {"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]},
                        None,
                    )
                )
                half = len(args) // 2  # the arguments come in two pieces, as OpenAI splits them
                for piece in (args[:half], args[half:]):
                    self._event(
                        chunk(
                            {"tool_calls": [{"index": index, "function": {"arguments": piece}}]},
                            None,
                        )
                    )
            self._event(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
            if usage:
                self._event(
                    {
                        **chunk({}, None),
                        "choices": [],
                        "usage": {
                            "prompt_tokens": reply.usage[0],
                            "completion_tokens": reply.usage[1],
                            "total_tokens": sum(reply.usage),
                        },
                    }
                )
            self._write(b"data: [DONE]\n\n")
            self._write(b"")
            request.ending = "done"
        except (BrokenPipeError, ConnectionResetError):
            request.ending = "disconnected"
            self.close_connection = True

    def _responses_sse(self, request: Request, reply: Reply, text: str, ident: str) -> None:
        seq = iter(range(1_000_000))

        def event(kind: str, **data: Any) -> None:
            payload = {"type": kind, "sequence_number": next(seq), **data}
            self._write(f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode())

        self._start_sse()
        model = self.fake.model
        try:
            event(
                "response.created",
                response=_response_object(model, reply, "", ident, "in_progress", empty=True),
            )
            index = 0
            if text or not reply.tool_calls:
                item = _message_item(ident, "")
                event(
                    "response.output_item.added",
                    output_index=0,
                    item={**item, "content": [], "status": "in_progress"},
                )
                part = {"type": "output_text", "text": "", "annotations": []}
                event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=0,
                    content_index=0,
                    part=part,
                )
                for token in self._tokens(request, reply, text):
                    event(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=0,
                        content_index=0,
                        delta=token,
                        logprobs=[],
                    )
                if request.ending == "cut":
                    return
                event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=0,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
                done_part = {**part, "text": text}
                event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=0,
                    content_index=0,
                    part=done_part,
                )
                event("response.output_item.done", output_index=0, item=_message_item(ident, text))
                index = 1
            for k, (call_id, name, args) in enumerate(reply.tool_calls):
                item = _call_item(f"fc_{ident}_{k}", call_id, name, args)
                out = index + k
                event(
                    "response.output_item.added",
                    output_index=out,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
                event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=out,
                    delta=args,
                )
                event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=out,
                    arguments=args,
                    name=name,
                )
                event("response.output_item.done", output_index=out, item=item)
            event(
                "response.completed",
                response=_response_object(model, reply, text, ident, "completed"),
            )
            self._write(b"")
            request.ending = "done"
        except (BrokenPipeError, ConnectionResetError):
            request.ending = "disconnected"
            self.close_connection = True

    def _json(self, data: dict[str, Any], status: int = 200) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _message_item(ident: str, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{ident}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call_item(item_id: str, call_id: str, name: str, args: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": args,
        "status": "completed",
    }


def _response_object(
    model: str, reply: Reply, text: str, ident: str, status: str, *, empty: bool = False
) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if not empty:
        if text or not reply.tool_calls:
            output.append(_message_item(ident, text))
        output.extend(
            _call_item(f"fc_{ident}_{k}", i, name, args)
            for k, (i, name, args) in enumerate(reply.tool_calls)
        )
    return {
        "id": f"resp_{ident}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "output": output,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "temperature": None,
        "top_p": None,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": reply.usage[0],
            "output_tokens": reply.usage[1],
            "total_tokens": sum(reply.usage),
            # as the API sends it (openai 3.57's type requires both: a replay that
            # validates a journaled Responses event needs them)
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


FakeOpenAI.handler = Handler
