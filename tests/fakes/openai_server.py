"""A small OpenAI-compatible server for tests: ``POST /v1/chat/completions`` with
``stream=true``, on 127.0.0.1 and a free port, in a thread of the test process.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

__all__ = ("FakeOpenAI", "Request", "tokenize")

Ending = Literal["running", "done", "cut", "disconnected", "rejected"]


def tokenize(text: str) -> list[str]:
    """Split ``text`` the way the fake streams it: a word with the space before it
    (``"Hello"``, ``" world"``, ``"."`` ...), trailing space as a last token."""
    return re.findall(r"\s*\S+|\s+$", text)


@dataclass
class Request:
    """One request the fake server received, and what it answered."""

    body: dict[str, Any]
    prefill: str | None  # the assistant prefix it continued from (None: no prefill)
    sent: list[str] = field(default_factory=list)  # the chunks written, in order
    ending: Ending = "running"

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))


class FakeOpenAI:
    """The fake server; a context manager that starts and stops it."""

    def __init__(
        self,
        text: str,
        *,
        delay: float = 0.02,
        model: str = "fake-gpt",
        cut_after: Callable[[int], int | None] | None = None,
    ) -> None:
        """``cut_after(n)``: for the ``n``-th request (from 1), cut the stream cleanly after
        that many tokens, or None to finish it."""
        self.text = text
        self.delay = delay
        self.model = model
        self.cut_after = cut_after or (lambda n: None)
        self.requests: list[Request] = []
        self._holds: dict[int, int] = {}  # request number (from 1) -> token it waits before
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """What ``AsyncOpenAI(base_url=...)`` takes: ``http://127.0.0.1:<port>/v1``."""
        assert self._server is not None, "the fake server is not running"
        return f"http://127.0.0.1:{self._server.server_port}/v1"

    def start(self) -> FakeOpenAI:
        handler = type("Handler", (_Handler,), {"fake": self})
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

    def _record(self, body: dict[str, Any], prefill: str | None) -> tuple[int, Request]:
        with self._lock:
            self.requests.append(Request(body, prefill))
            return len(self.requests), self.requests[-1]

    def snapshot(self) -> list[Request]:
        with self._lock:
            return list(self.requests)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAI
    protocol_version = "HTTP/1.1"  # chunked responses, keep-alive, as the real API

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass  # quiet: the test reads ``fake.requests``

    def do_POST(self) -> None:
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

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
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
        body = json.dumps(
            {"error": {"message": message, "type": type_, "param": None, "code": None}}
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
