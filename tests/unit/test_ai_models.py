"""The provider models' construction: the SDK's retries are off whatever client they
use, and a bad argument is a ConfigError that names it."""

from __future__ import annotations

import re
from typing import Any

import anthropic
import openai
import pytest

from fusee.ai import Model, anthropic_model, openai_model
from fusee.errors import ConfigError


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
