"""The model layer's types: messages, tool specs, a request, a response, the ``Model``
protocol.

Every type here is a frozen msgspec Struct, so a :class:`ModelResponse` is a step's
result as it is: journaled as JSON, decoded into the same Struct on replay. Messages are
a tagged union on ``role`` (``system``, ``user``, ``assistant``, ``tool``), the chat
shape, with flat tool calls (``{"id", "name", "arguments"}``); each provider model
turns them into its own wire shape. :func:`as_messages` also takes message dicts in
OpenAI's Chat shape, as a user pastes them.

A model is anything with the :class:`Model` methods: :func:`fusee.ai.openai_model`,
:func:`fusee.ai.anthropic_model`, :class:`fusee.testing.ScriptedModel`, or a user's own.

Example:
    ``reply = await model.complete(ModelRequest(messages=[UserMessage("Hi")]))``
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, TypeAlias, runtime_checkable

import msgspec

from fusee.errors import InvalidArgument

__all__ = (
    "SystemMessage",
    "UserMessage",
    "AssistantMessage",
    "ToolResultMessage",
    "Message",
    "ToolCall",
    "ToolSpec",
    "OutputSpec",
    "Usage",
    "ModelRequest",
    "ModelResponse",
    "StreamItem",
    "Model",
    "NamedModel",
    "as_messages",
    "check_model",
)


class _Message(msgspec.Struct, frozen=True, tag_field="role"):
    @property
    def role(self) -> str:
        """``"system"``, ``"user"``, ``"assistant"`` or ``"tool"`` (the union's tag)."""
        return str(self.__struct_config__.tag)


class SystemMessage(_Message, frozen=True, tag="system"):
    """Instructions for the model."""

    content: str


class UserMessage(_Message, frozen=True, tag="user"):
    """What the user said."""

    content: str


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call the model asked for.

    ``id`` is the provider's tool-call ID (stable on replay: it is journaled with the
    turn); ``arguments`` is the JSON text of the arguments as the model wrote it (it may
    be invalid JSON: :meth:`args` raises then)."""

    id: str
    name: str
    arguments: str = "{}"

    def args(self) -> Any:
        """The arguments decoded from JSON.

        Raises:
            msgspec.DecodeError: the model's arguments are not JSON.
        """
        return msgspec.json.decode(self.arguments or "{}")


class AssistantMessage(_Message, frozen=True, kw_only=True, omit_defaults=True, tag="assistant"):
    """What the model said: text, tool calls, or both."""

    content: str = ""
    tool_calls: list[ToolCall] = []


class ToolResultMessage(_Message, frozen=True, kw_only=True, omit_defaults=True, tag="tool"):
    """The result of tool call ``tool_call_id`` given back to the model (its text, as a
    provider takes it; ``is_error``: the tool failed and ``content`` says how)."""

    tool_call_id: str
    name: str
    content: str
    is_error: bool = False


Message: TypeAlias = SystemMessage | UserMessage | AssistantMessage | ToolResultMessage
"""One message of a conversation (a tagged union on ``role``)."""


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A tool as the model sees it: its name, what it does, its arguments' JSON Schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


class OutputSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Structured output: the model answers with JSON text matching ``schema`` (a JSON
    Schema whose root is an object). ``name`` names it for providers that want one
    (OpenAI's ``json_schema.name``, the tool Anthropic answers through)."""

    schema: dict[str, Any]
    name: str = "output"
    description: str = ""


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens a call used (``input_tokens`` prompt, ``output_tokens`` completion);
    ``a + b`` adds two."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a model is asked: the conversation, the tools it may call, and the shape
    of the answer when structured (``output``)."""

    messages: list[Message]
    tools: list[ToolSpec] = []
    output: OutputSpec | None = None


class ModelResponse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A model's answer, as journaled.

    ``text`` is the whole text (for structured output, the JSON text of the answer);
    ``finish_reason`` is normalized to ``"stop"``, ``"tool_calls"``, ``"length"`` or
    ``"content_filter"`` (another provider value is kept as it is)."""

    text: str = ""
    tool_calls: list[ToolCall] = []
    usage: Usage = Usage()
    model: str = ""
    finish_reason: str = "stop"

    def message(self) -> AssistantMessage:
        """This answer as the assistant message of a history."""
        return AssistantMessage(content=self.text, tool_calls=list(self.tool_calls))


StreamItem: TypeAlias = str | ModelResponse
"""What :meth:`Model.stream` yields: text chunks, then one final :class:`ModelResponse`."""


@runtime_checkable
class Model(Protocol):
    """A model fusee can call. ``complete`` and ``stream`` are called inside a step's
    attempt: they may raise (the step's retry policy decides), and must not retry on
    their own (an SDK's ``max_retries`` is 0).

    ``stream(request, prefill)`` yields the text chunks that follow ``prefill`` (the
    text an earlier attempt already streamed; ``""`` on a first attempt), then exactly
    one :class:`ModelResponse` whose ``text`` is ``prefill`` plus the chunks, with the
    usage and finish reason. A provider stream that ends without its terminal event must
    raise, not return: a stream with no final response is a truncated attempt.
    ``prefill`` is only ever non-empty when ``supports_prefill`` is true.
    """

    @property
    def name(self) -> str:
        """The model's name (``"gpt-5"``), for logs and results."""
        ...

    @property
    def supports_prefill(self) -> bool:
        """Whether ``stream`` can continue an earlier attempt's text."""
        ...

    async def complete(self, request: ModelRequest) -> ModelResponse: ...

    def stream(self, request: ModelRequest, prefill: str = "") -> AsyncIterator[StreamItem]: ...


class NamedModel:
    """The two properties every :class:`Model` has, for a class to inherit: ``name``
    and ``supports_prefill``, from ``_name`` and ``_prefill``."""

    _name: str
    _prefill: bool

    @property
    def name(self) -> str:
        """The model's name, as given."""
        return self._name

    @property
    def supports_prefill(self) -> bool:
        """Whether ``stream`` continues an earlier attempt's text."""
        return self._prefill


def as_messages(
    prompt: str | None, messages: list[Message] | list[dict[str, Any]] | None, *, where: str
) -> list[Message]:
    """The conversation of a call given ``prompt=`` (one user message) or
    ``messages=`` (:data:`Message` Structs, or dicts of the same shape:
    ``{"role": "user", "content": "Hi"}``), exactly one of them.

    A dict may be in OpenAI's Chat shape too: tool calls as ``{"id", "type":
    "function", "function": {"name", "arguments"}}``, ``content`` ``None`` or a list of
    text parts, the role ``developer`` (a system message), a tool result without its
    ``name`` (taken from the call it answers, which an earlier assistant message must
    have made), ``"tool_calls": None`` (no calls, as ``ChatCompletionMessage.model_dump()``
    gives).

    Raises:
        InvalidArgument: both or neither were given, or a message is not a message.
    """
    if (prompt is None) == (messages is None):
        raise InvalidArgument(f"{where}: give prompt= or messages=, exactly one of them")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise InvalidArgument(f"{where}: prompt= is a {type(prompt).__name__}, not a str")
        return [UserMessage(prompt)]
    assert messages is not None
    if not isinstance(messages, list | tuple) or not messages:
        raise InvalidArgument(f"{where}: messages= must be a non-empty list of messages")
    kinds = (SystemMessage, UserMessage, AssistantMessage, ToolResultMessage)
    out: list[Message] = []
    names: dict[str, str] = {}  # tool call ID -> its tool's name, for OpenAI's tool results
    for i, m in enumerate(messages):
        if isinstance(m, kinds):
            out.append(m)
        else:
            try:
                out.append(msgspec.convert(_chat_dict(m, names), Message))
            except (msgspec.ValidationError, _NotAMessage) as e:
                raise InvalidArgument(
                    f"{where}: messages[{i}] is not a message ({e}); a message is a "
                    f"SystemMessage, UserMessage, AssistantMessage, ToolResultMessage or a "
                    f"dict of that shape (or OpenAI's) with its 'role'"
                ) from None
        if isinstance(out[-1], AssistantMessage):
            names.update((c.id, c.name) for c in out[-1].tool_calls)
    return out


class _NotAMessage(ValueError):
    pass


def _chat_dict(m: Any, names: dict[str, str]) -> Any:
    """``m`` with OpenAI's Chat shapes made this module's (anything else as it is)."""
    if not isinstance(m, dict):
        return m
    m = dict(m)
    if m.get("role") == "developer":
        m["role"] = "system"
    content = m.get("content")
    if content is None and m.get("role") == "assistant":
        m["content"] = ""
    elif isinstance(content, list):
        m["content"] = "".join(_text_part(p) for p in content)
    calls = m.get("tool_calls")
    if calls is None and "tool_calls" in m:
        m["tool_calls"] = []  # OpenAI's ChatCompletionMessage.model_dump(): no calls
    elif isinstance(calls, list):
        m["tool_calls"] = [_flat_call(c) for c in calls]
    if m.get("role") == "tool" and "name" not in m:
        call_id = m.get("tool_call_id")
        if isinstance(call_id, str):
            if call_id not in names:
                raise _NotAMessage(
                    f"a tool result for call {call_id!r}, which no earlier assistant "
                    f"message made (its tool's name comes from that call)"
                )
            m["name"] = names[call_id]
    return m


def _text_part(part: Any) -> str:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    raise _NotAMessage(f"a content part of type {kind!r}: only text parts are taken")


def _flat_call(call: Any) -> Any:
    if isinstance(call, dict) and isinstance(call.get("function"), dict):
        fn = call["function"]
        return {
            "id": call.get("id"),
            "name": fn.get("name"),
            "arguments": fn.get("arguments") or "{}",
        }
    return call


def check_model(model: object, *, where: str) -> Model:
    """``model`` if it is a :class:`Model` (what ``generate``, ``model_step`` and
    ``loop`` check their ``model=`` with).

    Raises:
        InvalidArgument: it is not one (the message names its type and what is).
    """
    if not isinstance(model, Model):
        raise InvalidArgument(
            f"{where}: model= is a {type(model).__name__}, not a fusee.ai.Model "
            f"(openai_model(...), anthropic_model(...), ScriptedModel([...]), or a class of "
            f"your own with name, supports_prefill, complete and stream)"
        )
    return model
