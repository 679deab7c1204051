"""The provider models' construction: the SDK's retries are off whatever client they
use, and a bad argument is a ConfigError that names it."""

from __future__ import annotations

import re
from collections.abc import Coroutine
from typing import Any

import anthropic
import openai
import pytest

from fusee.ai import (
    AssistantMessage,
    Model,
    ModelRequest,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    anthropic_model,
    as_messages,
    generate,
    loop,
    model_step,
    openai_model,
)
from fusee.errors import ConfigError, InvalidArgument


def test_the_sdk_retries_are_off() -> None:
    own = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=5)
    for model in (
        openai_model("gpt-5", base_url="http://127.0.0.1:9/v1", api_key="k"),
        openai_model("gpt-5", client=own, api="responses"),
        anthropic_model("claude", base_url="http://127.0.0.1:9", api_key="k"),
        anthropic_model("claude", client=anthropic.AsyncAnthropic(api_key="k", max_retries=4)),
    ):
        assert isinstance(model, Model)
        assert model.client.max_retries == 0
    assert own.max_retries == 5, "the caller's client is copied, not changed"


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: openai_model("gpt-5", api="rest", api_key="k"), "api='rest'"),  # type: ignore[arg-type]
        (lambda: openai_model("", api_key="k"), "the model name '' is not"),
        (lambda: openai_model("m", api="responses", prefill=True, api_key="k"), "prefill=True"),
        (
            lambda: openai_model("m", client=openai.AsyncOpenAI(api_key="k"), api_key="k"),
            "give client= or base_url=/api_key=",
        ),
        (lambda: anthropic_model("c", output_mode="xml", api_key="k"), "output_mode='xml'"),  # type: ignore[arg-type]
        (lambda: anthropic_model(None, api_key="k"), "the model name None"),  # type: ignore[arg-type]
    ],
    ids=["api", "name", "prefill", "client", "output-mode", "anthropic-name"],
)
def test_bad_arguments_are_named(make: Any, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        make()


@pytest.mark.parametrize("call", ["generate", "model_step", "loop"])
async def test_a_model_that_is_not_one_is_refused_alike_by_each_call(call: str) -> None:
    """The check runs before ``ctx`` is used, so no run is needed."""
    ctx: Any = None
    model: Any = "gpt-5"
    asked: Coroutine[Any, Any, object]
    if call == "generate":
        asked = generate(ctx, "s", model=model, prompt="x")
    elif call == "model_step":
        asked = model_step(ctx, "s", model, ModelRequest(messages=[UserMessage("x")]))
    else:
        asked = loop(ctx, "s", model=model, prompt="x")
    with pytest.raises(InvalidArgument, match=r"model= is a str, not a fusee\.ai\.Model") as e:
        await asked
    assert "ScriptedModel([...]), or a class of your own with name, supports_prefill" in str(
        e.value
    )


def test_a_provider_model_s_repr_is_the_call_with_its_options_not_the_default() -> None:
    url, key = "http://127.0.0.1:9/v1", "k"
    assert repr(openai_model("gpt-5", base_url=url, api_key=key)) == "openai_model('gpt-5')"
    assert (
        repr(openai_model("gpt-5", base_url=url, api_key=key, api="responses"))
        == "openai_model('gpt-5', api='responses')"
    )
    assert repr(anthropic_model("c", base_url=url, api_key=key)) == "anthropic_model('c')"
    assert (
        repr(anthropic_model("c", base_url=url, api_key=key, output_mode="tool"))
        == "anthropic_model('c', output_mode='tool')"
    )
    assert (
        repr(openai_model("m", base_url=url, api_key=key, prefill=True))
        == "openai_model('m', prefill=True)"
    )


def test_openai_shaped_message_dicts_are_taken_as_pasted() -> None:
    """A conversation copied from OpenAI's Chat API: a developer message, text parts,
    an assistant turn with null content and nested tool calls, a tool result without
    its name."""
    pasted: list[dict[str, Any]] = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Where is "}, {"type": "text", "text": "order 7?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"order": 7}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "shipped"},
    ]  # fmt: skip
    assert as_messages(None, pasted, where="t") == [
        SystemMessage("Be brief."),
        UserMessage("Where is order 7?"),
        AssistantMessage(
            tool_calls=[ToolCall(id="call_1", name="lookup", arguments='{"order": 7}')]
        ),
        ToolResultMessage(tool_call_id="call_1", name="lookup", content="shipped"),
    ]


def test_an_openai_message_dump_with_null_tool_calls_is_taken() -> None:
    """``ChatCompletionMessage.model_dump()`` as OpenAI's SDK gives it: no calls are
    ``"tool_calls": None``, with its other fields."""
    dump: dict[str, Any] = {
        "content": "hi", "refusal": None, "role": "assistant", "annotations": [],
        "audio": None, "function_call": None, "tool_calls": None,
    }  # fmt: skip
    out = as_messages(None, [{"role": "user", "content": "q"}, dump], where="t")
    assert out == [UserMessage("q"), AssistantMessage(content="hi")]


def test_a_tool_result_dict_for_a_call_no_message_made_is_refused() -> None:
    orphan = {"role": "tool", "tool_call_id": "zz", "content": "r"}
    with pytest.raises(InvalidArgument, match=r"messages\[1\].*call 'zz', which no earlier"):
        as_messages(None, [{"role": "user", "content": "q"}, orphan], where="t")


def test_a_message_dict_with_a_part_that_is_not_text_is_refused() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://x/y.png"}}
    with pytest.raises(InvalidArgument, match=r"messages\[0\].*'image_url'.*only text parts"):
        as_messages(None, [{"role": "user", "content": [image]}], where="t")
