"""``ScriptedModel``: a model that answers from a script, for offline tests and demos.

Each request takes the next reply of the script; every request is recorded, so a test
can assert that a replay did not ask the model again. With ``log=`` a file holds the
record (one JSON line per request) and the script position is the number of requests
in it, so the model behaves as one across worker processes: a worker killed and
replaced goes on with the next reply, and the test process reads what every worker
asked.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import msgspec

from fusee.ai.types import ModelRequest, ModelResponse, NamedModel, StreamItem, ToolCall, Usage
from fusee.errors import FatalError, InvalidArgument

__all__ = ("ScriptedModel", "Streamed", "ScriptedCall", "Reply", "tool_call", "tokenize")


class Streamed(msgspec.Struct, frozen=True):
    """A reply streamed as these chunks. With ``error``, the stream breaks after them
    (the chunks are sent, then ``error`` is raised: a cut connection), so the step
    retries and the next reply continues from the stored text."""

    chunks: list[str]
    error: str | None = None


Reply: TypeAlias = (
    str | ModelResponse | ToolCall | list[ToolCall] | Streamed | BaseException | dict[str, Any]
)
"""One scripted reply: a text; a dict (structured output: its JSON is the text); a
tool call or a list of them; a whole :class:`ModelResponse`; :class:`Streamed` chunks;
or an exception, raised."""


class ScriptedCall(msgspec.Struct, frozen=True, kw_only=True):
    """One request the model got: the request, whether streamed, the prefill it
    continued, and the reply's index in the script."""

    request: ModelRequest
    stream: bool = False
    prefill: str = ""
    index: int = 0
    pid: int = 0


_calls = msgspec.json.Decoder(ScriptedCall)
_encode = msgspec.json.Encoder().encode
_ids = re.compile(r"\s*\S+|\s+$")


def tokenize(text: str) -> list[str]:
    """How a scripted text is streamed: a word with the space before it."""
    return _ids.findall(text)


def tool_call(name: str, call_id: str | None = None, /, **arguments: Any) -> ToolCall:
    """A scripted tool call: ``tool_call("search_kb", "call_1", query="refund")``
    (without an ID, one is made from the name and arguments)."""
    args = _encode(arguments).decode()
    if call_id is None:
        digest = hashlib.blake2b(f"{name}\0{args}".encode(), digest_size=6).hexdigest()
        call_id = f"call_{digest}"
    return ToolCall(id=call_id, name=name, arguments=args)


class ScriptedModel(NamedModel):
    """A :class:`fusee.ai.Model` whose replies are scripted.

    ``script`` is a list of :data:`Reply` taken in order (one per request), or a
    function ``(request, n) -> Reply`` for the ``n``-th request (from 0). A request past
    the script's end fails its step for good (``FatalError``). ``log=`` a file path:
    the record of requests is kept there (see the module's docstring). ``usage``
    counts words when not given: the prompt's for input, the reply's for output.

    Example:
        ``model = ScriptedModel(["Hello", tool_call("search", q="x"), {"category": "bug"}])``
    """

    def __init__(
        self,
        script: Sequence[Any] | Callable[[ModelRequest, int], Reply],
        *,
        name: str = "scripted",
        supports_prefill: bool = True,
        log: str | os.PathLike[str] | None = None,
    ) -> None:
        if not callable(script) and not isinstance(script, Sequence):
            raise InvalidArgument(
                f"ScriptedModel: the script is a {type(script).__name__}; give a list of "
                f"replies or a function (request, n) -> reply"
            )
        if not callable(script):
            for i, reply in enumerate(script):
                if not _is_reply(reply):
                    raise InvalidArgument(
                        f"ScriptedModel: script[{i}] is a {type(reply).__name__}; a reply is "
                        f"a str, dict, ToolCall, list of ToolCall, ModelResponse, Streamed or "
                        f"an exception"
                    )
        self._script: list[Reply] | Callable[[ModelRequest, int], Reply] = (
            script if callable(script) else list(script)
        )
        self._name = name
        self._prefill = supports_prefill
        self._log = Path(log) if log is not None else None
        self._calls: list[ScriptedCall] = []
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- the Model protocol --------------------------------------------------------

    async def complete(self, request: ModelRequest) -> ModelResponse:
        reply = self._take(request, stream=False, prefill="")
        if isinstance(reply, Streamed):
            if reply.error is not None:
                raise ConnectionError(reply.error)
            return self._response(request, "".join(reply.chunks))
        return self._as_response(request, reply)

    async def stream(self, request: ModelRequest, prefill: str = "") -> AsyncIterator[StreamItem]:
        reply = self._take(request, stream=True, prefill=prefill)
        if isinstance(reply, Streamed):
            for chunk in reply.chunks:
                yield chunk
            if reply.error is not None:
                raise ConnectionError(reply.error)
            yield self._response(request, prefill + "".join(reply.chunks))
            return
        response = self._as_response(request, reply)
        if not response.text.startswith(prefill):
            raise ValueError(
                f"ScriptedModel: the prefill {prefill!r} is not a prefix of the reply "
                f"{response.text!r}"
            )
        for chunk in tokenize(response.text[len(prefill) :]):
            yield chunk
        yield response

    # -- the record ------------------------------------------------------------------

    @property
    def calls(self) -> list[ScriptedCall]:
        """Every request so far (with ``log=``: by every process, read from the file)."""
        if self._log is None:
            with self._lock:
                return list(self._calls)
        if not self._log.exists():
            return []
        lines = self._log.read_bytes().splitlines()
        return [_calls.decode(line) for line in lines if line.strip()]

    @property
    def requests(self) -> list[ModelRequest]:
        """The requests of :attr:`calls`."""
        return [c.request for c in self.calls]

    # -- inside ------------------------------------------------------------------------

    def _take(self, request: ModelRequest, *, stream: bool, prefill: str) -> Reply:
        with self._lock:
            if self._log is None:
                n = len(self._calls)
                self._calls.append(self._call(request, stream, prefill, n))
            else:
                n = self._append(request, stream, prefill)
        if callable(self._script):
            reply = self._script(request, n)
        elif n < len(self._script):
            reply = self._script[n]
        else:
            raise FatalError(
                f"ScriptedModel {self._name!r}: request {n + 1} came, but the script has "
                f"{len(self._script)} replies"
            )
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def _call(self, request: ModelRequest, stream: bool, prefill: str, n: int) -> ScriptedCall:
        return ScriptedCall(
            request=request, stream=stream, prefill=prefill, index=n, pid=os.getpid()
        )

    def _append(self, request: ModelRequest, stream: bool, prefill: str) -> int:
        assert self._log is not None
        with open(self._log, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # one position per request, across processes
            try:
                f.seek(0)
                n = sum(1 for line in f.read().splitlines() if line.strip())
                f.write(_encode(self._call(request, stream, prefill, n)) + b"\n")
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        return n

    def _as_response(self, request: ModelRequest, reply: Reply) -> ModelResponse:
        if isinstance(reply, ModelResponse):
            return reply if reply.model else msgspec.structs.replace(reply, model=self._name)
        if isinstance(reply, str):
            return self._response(request, reply)
        if isinstance(reply, ToolCall):
            reply = [reply]
        if isinstance(reply, list) and all(isinstance(c, ToolCall) for c in reply):
            return ModelResponse(
                tool_calls=list(reply),
                usage=Usage(input_tokens=_words(request), output_tokens=len(reply)),
                model=self._name,
                finish_reason="tool_calls",
            )
        if isinstance(reply, dict):
            return self._response(request, _encode(reply).decode())
        raise FatalError(
            f"ScriptedModel {self._name!r}: a {type(reply).__name__} in the script is no "
            f"reply (a str, dict, ToolCall, list of ToolCall, ModelResponse, Streamed or "
            f"exception)"
        )

    def _response(self, request: ModelRequest, text: str) -> ModelResponse:
        return ModelResponse(
            text=text,
            usage=Usage(input_tokens=_words(request), output_tokens=len(text.split())),
            model=self._name,
        )


def _is_reply(reply: object) -> bool:
    if isinstance(reply, list):
        return all(isinstance(c, ToolCall) for c in reply)
    return isinstance(reply, str | dict | ToolCall | ModelResponse | Streamed | BaseException)


def _words(request: ModelRequest) -> int:
    total = 0
    for m in request.messages:
        total += len(getattr(m, "content", "").split())
    return total
