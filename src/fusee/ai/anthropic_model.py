"""``anthropic_model``: a :class:`fusee.ai.Model` over the official ``anthropic`` SDK.

The Messages API: system messages go to ``system``, tool calls are ``tool_use``
blocks and their results ``tool_result`` blocks in the next user message. Structured
output is the API's JSON output (``output_config.format`` of type ``json_schema``), or,
with ``output_mode="tool"`` (older models, compatible servers), a tool of the output's
name and schema that the model is made to call; its input is the answer's JSON text.
The SDK's own retries are off (``max_retries=0``): the step's retry policy applies.

A stream that ends without ``message_stop`` raises :class:`TruncatedStream`.

Needs the ``anthropic`` package: ``pip install 'fusee[anthropic]'``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Literal

from fusee.ai.errors import TruncatedStream
from fusee.ai.sdk_client import SDKModel, sdk_client
from fusee.ai.types import (
    AssistantMessage,
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

__all__ = ("anthropic_model", "AnthropicModel")

OutputMode = Literal["json_schema", "tool"]
MAX_TOKENS = 4096  # the Messages API requires max_tokens; settings= overrides it
STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}


def anthropic_model(
    name: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    client: Any = None,
    settings: dict[str, Any] | None = None,
    output_mode: OutputMode = "json_schema",
    prefill: bool = False,
) -> AnthropicModel:
    """The model ``name`` through the ``anthropic`` SDK.

    ``base_url`` and ``api_key`` default to the SDK's (``ANTHROPIC_BASE_URL``,
    ``ANTHROPIC_API_KEY``); ``client`` is an ``anthropic.AsyncAnthropic`` of your own
    (used with ``max_retries=0``). ``settings`` are passed to every request
    (``max_tokens`` is 4096 unless given). ``prefill=True``: the model continues a
    trailing assistant message (older Claude models do; newer ones refuse), so a
    streamed call resumes from the stored text after a crash; not with
    ``output_mode="tool"``, whose answer is a tool's input, which no prefill continues.

    Raises:
        ConfigError: ``anthropic`` is not installed, or an argument is not valid.

    Example:
        ``model = anthropic_model("claude-opus-4-8")``
    """
    try:
        import anthropic
    except ImportError:
        raise ConfigError(
            "anthropic_model needs the anthropic SDK: pip install 'fusee[anthropic]'"
        ) from None
    if output_mode not in ("json_schema", "tool"):
        raise ConfigError(
            f"anthropic_model: output_mode={output_mode!r}, expected 'json_schema' or 'tool'"
        )
    if prefill and output_mode == "tool":
        raise ConfigError(
            "anthropic_model: prefill=True with output_mode='tool': a resumed stream of the "
            "output tool would be the stored partial JSON, then a whole new tool input (the "
            "model cannot continue a tool's input); give one of them"
        )
    client = sdk_client(
        anthropic.AsyncAnthropic,
        client,
        name=name,
        base_url=base_url,
        api_key=api_key,
        where="anthropic_model",
    )
    return AnthropicModel(name, client, dict(settings or {}), output_mode, prefill)


class AnthropicModel(SDKModel):
    """A Claude model through the Messages API (see :func:`anthropic_model`)."""

    factory = "anthropic_model"
    defaults: ClassVar[dict[str, Any]] = {"output_mode": "json_schema"}

    def __init__(
        self,
        name: str,
        client: Any,
        settings: dict[str, Any],
        output_mode: OutputMode,
        prefill: bool,
    ) -> None:
        super().__init__(name, client, settings, prefill)
        self.output_mode = output_mode

    async def complete(self, request: ModelRequest) -> ModelResponse:
        message = await self.client.messages.create(**self._args(request, ""))
        text: list[str] = []
        calls: list[ToolCall] = []
        output = self._output_tool(request)
        for block in message.content:
            if block.type == "text":
                text.append(block.text)
            elif block.type == "tool_use":
                args = json.dumps(block.input, ensure_ascii=False)
                if block.name == output:
                    text.append(args)
                else:
                    calls.append(ToolCall(id=block.id, name=block.name, arguments=args))
        return ModelResponse(
            text="".join(text),
            tool_calls=calls,
            usage=_usage(message.usage),
            model=message.model or self._name,
            finish_reason=_stop(message.stop_reason, calls, output),
        )

    async def stream(self, request: ModelRequest, prefill: str = "") -> AsyncIterator[StreamItem]:
        sent = prefill.rstrip()  # the API refuses a prefill that ends in whitespace
        cut = prefill[len(sent) :]
        output = self._output_tool(request)
        stream = await self.client.messages.create(**self._args(request, sent), stream=True)
        blocks: dict[int, dict[str, Any]] = {}
        usage_in = usage_out = 0
        model = self._name
        stop: str | None = None
        ended = False
        got: list[str] = []
        async with stream:
            async for event in stream:
                kind = event.type
                if kind == "message_start":
                    model = event.message.model or model
                    usage_in = int(event.message.usage.input_tokens or 0)
                    usage_out = int(event.message.usage.output_tokens or 0)
                elif kind == "content_block_start":
                    block = event.content_block
                    blocks[event.index] = {
                        "type": block.type,
                        "id": getattr(block, "id", ""),
                        "name": getattr(block, "name", ""),
                        "json": "",
                    }
                elif kind == "content_block_delta":
                    delta = event.delta
                    info = blocks.get(event.index, {})
                    piece = ""
                    if delta.type == "text_delta":
                        piece = delta.text
                    elif delta.type == "input_json_delta":
                        info["json"] = info.get("json", "") + delta.partial_json
                        if info.get("name") == output:
                            piece = delta.partial_json  # the structured answer's text
                    if piece and cut:  # the whitespace the prefill lost comes back first
                        piece = piece[len(cut) :] if piece.startswith(cut) else piece
                        cut = ""
                    if piece:
                        got.append(piece)
                        yield piece
                elif kind == "message_delta":
                    stop = event.delta.stop_reason or stop
                    if event.usage is not None:
                        usage_out = int(event.usage.output_tokens or usage_out)
                elif kind == "message_stop":
                    ended = True
        if not ended:
            raise TruncatedStream(f"{self._name}: the message stream ended without message_stop")
        calls = [
            ToolCall(id=b["id"], name=b["name"], arguments=b["json"] or "{}")
            for _, b in sorted(blocks.items())
            if b["type"] == "tool_use" and b["name"] != output
        ]
        yield ModelResponse(
            text=prefill + "".join(got),
            tool_calls=calls,
            usage=Usage(input_tokens=usage_in, output_tokens=usage_out),
            model=model,
            finish_reason=_stop(stop, calls, output),
        )

    # -- requests ------------------------------------------------------------------------

    def _output_tool(self, request: ModelRequest) -> str | None:
        if request.output is None or self.output_mode != "tool":
            return None
        return request.output.name

    def _args(self, request: ModelRequest, prefill: str) -> dict[str, Any]:
        system: list[str] = []
        messages: list[dict[str, Any]] = []

        def add(role: str, blocks: list[dict[str, Any]]) -> None:
            if messages and messages[-1]["role"] == role:  # the API wants roles to alternate
                messages[-1]["content"].extend(blocks)
            else:
                messages.append({"role": role, "content": blocks})

        for m in request.messages:
            if isinstance(m, SystemMessage):
                system.append(m.content)
            elif isinstance(m, UserMessage):
                add("user", [{"type": "text", "text": m.content}])
            elif isinstance(m, AssistantMessage):
                blocks: list[dict[str, Any]] = []
                if m.content:
                    blocks.append({"type": "text", "text": m.content})
                for c in m.tool_calls:
                    try:
                        given = json.loads(c.arguments or "{}")
                    except ValueError:
                        given = {"_raw": c.arguments}  # the model's own bad JSON, kept
                    blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": given})
                if blocks:
                    add("assistant", blocks)
            else:
                assert isinstance(m, ToolResultMessage)
                result: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id,
                    "content": m.content,
                }
                if m.is_error:
                    result["is_error"] = True
                add("user", [result])
        if prefill:
            add("assistant", [{"type": "text", "text": prefill}])
        args: dict[str, Any] = {"max_tokens": MAX_TOKENS, **self.settings, "model": self._name}
        args["messages"] = messages
        if system:
            args["system"] = "\n\n".join(system)
        tools = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in request.tools
        ]
        if request.output is not None:
            if self.output_mode == "tool":
                tools.append(
                    {
                        "name": request.output.name,
                        "description": request.output.description
                        or "Give the answer with this tool.",
                        "input_schema": request.output.schema,
                    }
                )
                if not request.tools:
                    args["tool_choice"] = {"type": "tool", "name": request.output.name}
            else:
                args["output_config"] = {
                    "format": {"type": "json_schema", "schema": request.output.schema}
                }
        if tools:
            args["tools"] = tools
        return args


def _usage(usage: Any) -> Usage:
    return Usage(
        input_tokens=int(getattr(usage, "input_tokens", 0) or 0),
        output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
    )


def _stop(reason: str | None, calls: list[ToolCall], output: str | None) -> str:
    if reason == "tool_use" and not calls and output is not None:
        return "stop"  # it called the output tool: that is the answer
    return STOP.get(reason or "end_turn", reason or "stop")
