"""``openai_model``: a :class:`fusee.ai.Model` over the official ``openai`` SDK.

Chat Completions by default, the protocol every OpenAI-compatible server speaks (vLLM,
llama.cpp, Ollama ... through ``base_url=``); ``api="responses"`` for the Responses
API. The SDK's own retries are off (``max_retries=0``): a failed request fails the
step's attempt, and the step's retry policy decides. Structured output is
``response_format`` (Chat) or ``text.format`` (Responses) of type ``json_schema``;
tools are function tools, and the model's calls come back as :class:`ToolCall`.

A stream that ends without its terminal event (a ``finish_reason`` in Chat,
``response.completed`` in Responses) raises :class:`TruncatedStream`: the raw client
ends such a stream quietly.

Needs the ``openai`` package: ``pip install 'fusee[openai]'``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar, Literal

from fusee.ai.errors import TruncatedStream
from fusee.ai.sdk_client import SDKModel, sdk_client
from fusee.ai.types import (
    AssistantMessage,
    Message,
    ModelRequest,
    ModelResponse,
    StreamItem,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from fusee.errors import ConfigError

__all__ = ("openai_model", "OpenAIModel")

Api = Literal["chat", "responses"]
FINISH = {"function_call": "tool_calls"}  # Chat's legacy name, normalized


def openai_model(
    name: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    api: Api = "chat",
    client: Any = None,
    settings: dict[str, Any] | None = None,
    prefill: bool = False,
) -> OpenAIModel:
    """The model ``name`` through the ``openai`` SDK.

    ``base_url`` and ``api_key`` default to the SDK's (``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY``); ``client`` is an ``openai.AsyncOpenAI`` of your own (used with
    ``max_retries=0``). ``settings`` are passed to every request (``temperature``,
    ``max_tokens`` ...). ``prefill=True`` says the server continues a trailing assistant
    message (Chat only; OpenAI itself does not, some compatible servers do), so a
    streamed call resumes from the stored text after a crash instead of starting over.

    Raises:
        ConfigError: ``openai`` is not installed, ``api`` is not ``"chat"`` or
            ``"responses"``, or ``prefill=True`` with the Responses API.

    Example:
        ``model = openai_model("gpt-5", base_url="http://localhost:8000/v1")``
    """
    try:
        import openai
    except ImportError:
        raise ConfigError(
            "openai_model needs the openai SDK: pip install 'fusee[openai]'"
        ) from None
    if api not in ("chat", "responses"):
        raise ConfigError(f"openai_model: api={api!r}, expected 'chat' or 'responses'")
    if prefill and api == "responses":
        raise ConfigError("openai_model: prefill=True is for api='chat' (servers that continue it)")
    client = sdk_client(
        openai.AsyncOpenAI,
        client,
        name=name,
        base_url=base_url,
        api_key=api_key,
        where="openai_model",
    )
    return OpenAIModel(name, client, api, dict(settings or {}), prefill)


class OpenAIModel(SDKModel):
    """A model served by the OpenAI API or an OpenAI-compatible server (see
    :func:`openai_model`)."""

    factory = "openai_model"
    defaults: ClassVar[dict[str, Any]] = {"api": "chat"}

    def __init__(
        self, name: str, client: Any, api: Api, settings: dict[str, Any], prefill: bool
    ) -> None:
        super().__init__(name, client, settings, prefill)
        self.api = api

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if self.api == "responses":
            response = await self.client.responses.create(**self._responses_args(request))
            return _from_response(response, self._name)
        completion = await self.client.chat.completions.create(**self._chat_args(request, ""))
        return _from_completion(completion, self._name)

    async def stream(self, request: ModelRequest, prefill: str = "") -> AsyncIterator[StreamItem]:
        if self.api == "responses":
            async for item in self._stream_responses(request):
                yield item
            return
        args = self._chat_args(request, prefill)
        stream = await self.client.chat.completions.create(
            **args, stream=True, stream_options={"include_usage": True}
        )
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        finish: str | None = None
        usage = Usage()
        model = self._name
        async with stream:
            async for chunk in stream:
                model = chunk.model or model
                if chunk.usage is not None:
                    usage = _chat_usage(chunk.usage)
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                delta = choice.delta
                if delta.content:
                    text.append(delta.content)
                    yield delta.content
                for tc in delta.tool_calls or ():
                    call = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    call["id"] = tc.id or call["id"]
                    if tc.function is not None:
                        call["name"] += tc.function.name or ""
                        call["arguments"] += tc.function.arguments or ""
                if choice.finish_reason is not None:
                    finish = choice.finish_reason
        if finish is None:
            raise TruncatedStream(
                f"{self._name}: the chat completion stream ended without a finish_reason"
            )
        yield ModelResponse(
            text=prefill + "".join(text),
            tool_calls=[
                ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"] or "{}")
                for _, c in sorted(calls.items())
            ],
            usage=usage,
            model=model,
            finish_reason=FINISH.get(finish, finish),
        )

    async def _stream_responses(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        stream = await self.client.responses.create(**self._responses_args(request), stream=True)
        final: Any = None
        async with stream:
            async for event in stream:
                kind = getattr(event, "type", "")
                if kind == "response.output_text.delta":
                    yield event.delta
                elif kind in ("response.completed", "response.incomplete"):
                    final = event.response
                elif kind == "response.failed":
                    error = getattr(event.response, "error", None)
                    raise ConnectionError(f"{self._name}: the response failed: {error}")
                elif kind == "error":
                    raise ConnectionError(f"{self._name}: {getattr(event, 'message', event)}")
        if final is None:
            raise TruncatedStream(
                f"{self._name}: the response stream ended without response.completed"
            )
        yield _from_response(final, self._name)

    # -- requests ------------------------------------------------------------------------

    def _chat_args(self, request: ModelRequest, prefill: str) -> dict[str, Any]:
        messages = [_chat_message(m) for m in request.messages]
        if prefill:
            messages.append({"role": "assistant", "content": prefill})
        args: dict[str, Any] = {**self.settings, "model": self._name, "messages": messages}
        if request.tools:
            args["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
        if request.output is not None:
            schema: dict[str, Any] = {
                "name": request.output.name,
                "schema": request.output.schema,
                "strict": False,
            }
            if request.output.description:
                schema["description"] = request.output.description
            args["response_format"] = {"type": "json_schema", "json_schema": schema}
        return args

    def _responses_args(self, request: ModelRequest) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        for m in request.messages:
            items.extend(_responses_items(m))
        args: dict[str, Any] = {**self.settings, "model": self._name, "input": items}
        if request.tools:
            args["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": False,
                }
                for t in request.tools
            ]
        if request.output is not None:
            fmt: dict[str, Any] = {
                "type": "json_schema",
                "name": request.output.name,
                "schema": request.output.schema,
                "strict": False,
            }
            if request.output.description:
                fmt["description"] = request.output.description
            args["text"] = {"format": fmt}
        return args


def _chat_message(m: Message) -> dict[str, Any]:
    if isinstance(m, SystemMessage | UserMessage):
        return {"role": m.role, "content": m.content}
    if isinstance(m, AssistantMessage):
        # null only beside tool calls: OpenAI refuses a null content without them (an
        # empty answer re-asked), and takes "" there
        content = m.content or (None if m.tool_calls else "")
        out: dict[str, Any] = {"role": "assistant", "content": content}
        if m.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in m.tool_calls
            ]
        return out
    assert isinstance(m, ToolResultMessage)
    return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}


def _responses_items(m: Message) -> list[dict[str, Any]]:
    if isinstance(m, SystemMessage | UserMessage):
        return [{"role": m.role, "content": m.content}]
    if isinstance(m, AssistantMessage):
        out: list[dict[str, Any]] = []
        if m.content:
            out.append({"role": "assistant", "content": m.content})
        out.extend(
            {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
            for c in m.tool_calls
        )
        return out
    assert isinstance(m, ToolResultMessage)
    return [{"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content}]


def _chat_usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    return Usage(
        input_tokens=int(usage.prompt_tokens or 0), output_tokens=int(usage.completion_tokens or 0)
    )


def _from_completion(completion: Any, name: str) -> ModelResponse:
    if not completion.choices:
        raise ConnectionError(f"{name}: the chat completion has no choices")
    choice = completion.choices[0]
    message = choice.message
    calls = [
        ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "{}")
        for c in message.tool_calls or ()
        if getattr(c, "function", None) is not None
    ]
    finish = choice.finish_reason or ("tool_calls" if calls else "stop")
    return ModelResponse(
        text=message.content or "",
        tool_calls=calls,
        usage=_chat_usage(completion.usage),
        model=completion.model or name,
        finish_reason=FINISH.get(finish, finish),
    )


def _from_response(response: Any, name: str) -> ModelResponse:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in response.output or ():
        if item.type == "message":
            for part in item.content or ():
                if part.type == "output_text":
                    texts.append(part.text)
        elif item.type == "function_call":
            calls.append(ToolCall(id=item.call_id, name=item.name, arguments=item.arguments))
    usage = response.usage
    finish = "tool_calls" if calls else "stop"
    if response.status == "incomplete":
        reason = getattr(response.incomplete_details, "reason", None)
        finish = "length" if reason == "max_output_tokens" else str(reason or "incomplete")
    return ModelResponse(
        text="".join(texts),
        tool_calls=calls,
        usage=Usage(
            input_tokens=int(getattr(usage, "input_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
        ),
        model=response.model or name,
        finish_reason=finish,
    )
