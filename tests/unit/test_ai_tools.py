"""The tools of ``fusee.ai.loop``: schemas from signatures and docstrings, the
validation of the model's arguments, and how an approval's value is read."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import pydantic
import pytest

import fusee
from fusee.ai import Tool, ToolInputError, WorkflowTool, tool, workflow_tool
from fusee.ai.loop import approval_verdict
from fusee.ai.tools import as_tool


def search(query: str, limit: int = 5, *, s: fusee.StepInfo) -> list[str]:
    """Search the knowledge base.

    Args:
        query: the words to look for.
        limit: how many hits at most.
    """
    return []


class Order(pydantic.BaseModel):
    order: str
    amount: int


def refund(req: Order, speed: Literal["slow", "fast"] = "slow") -> str:
    """Refund an order."""
    return "ok"


class Query(msgspec.Struct):
    order: str


@fusee.workflow("unit-tools-lookup")
async def lookup(ctx: fusee.Context, q: Query) -> str:
    """Look an order up."""
    return q.order


@fusee.workflow("unit-tools-echo")
async def echo(ctx: fusee.Context, text: str) -> str:
    return text


def test_a_functions_schema_comes_from_its_signature_and_docstring() -> None:
    made = as_tool("search", search)
    assert isinstance(made, Tool)
    spec = made.spec("search")
    assert spec.description == "Search the knowledge base."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "the words to look for."},
            "limit": {"type": "integer", "description": "how many hits at most.", "default": 5},
        },
        "required": ["query"],
        "additionalProperties": False,
    }  # the StepInfo parameter is not an argument
    assert made.info_param == "s"
    assert made.arguments.parse("search", '{"query": "x", "limit": "3"}') == {
        "query": "x",
        "limit": 3,
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"limit": 3}', "Object missing required field `query`"),
        ('{"query": 1}', "Expected `str`, got `int` - at `$.query`"),
        ('{"query": "x", "other": 1}', "Object contains unknown field `other`"),
        ("[1]", "Expected `object`, got `array`"),
        ("{nope", "are not JSON"),
    ],
)
def test_arguments_that_do_not_match_say_what_is_wrong(text: str, says: str) -> None:
    made = as_tool("search", search)
    with pytest.raises(ToolInputError) as bad:
        made.arguments.parse("search", text)
    assert says in str(bad.value)
    assert "'search'" in str(bad.value)


def test_a_pydantic_parameter_makes_a_pydantic_schema() -> None:
    made = as_tool("refund", refund)
    params = made.spec("refund").parameters
    assert params["required"] == ["req"]
    assert params["properties"]["speed"]["enum"] == ["slow", "fast"]
    assert "Order" in params["$defs"]
    parsed = made.arguments.parse("refund", '{"req": {"order": "o-1", "amount": 3}}')
    assert parsed == {"req": Order(order="o-1", amount=3), "speed": "slow"}
    with pytest.raises(ToolInputError) as bad:
        made.arguments.parse("refund", '{"req": {"order": "o-1", "amount": "x"}}')
    assert "req.amount: Input should be a valid integer" in str(bad.value)


def test_a_function_that_cannot_be_a_tool_is_refused() -> None:
    def spread(*words: str) -> str:
        return ""

    with pytest.raises(fusee.ConfigError, match=r"\*words has no schema"):
        tool(spread)
    with pytest.raises(fusee.ConfigError, match="approve must be an ask function"):
        tool(search, approve="yes")  # type: ignore[arg-type]
    with pytest.raises(fusee.ConfigError, match="not a function"):
        as_tool("x", 42)


def test_a_workflow_tool_takes_its_input_types_schema() -> None:
    made = workflow_tool(lookup)
    assert made.spec("lookup").parameters == {
        "type": "object",
        "properties": {"order": {"type": "string"}},
        "required": ["order"],
    }
    assert made.description == "Look an order up."
    assert made.arguments.parse("lookup", '{"order": "o-1"}') == {"order": "o-1"}
    scalar = workflow_tool(echo)
    assert scalar.spec("echo").parameters["properties"] == {"input": {"type": "string"}}
    assert scalar.arguments.parse("echo", '{"input": "hi"}') == "hi"
    assert isinstance(as_tool("lookup", lookup), WorkflowTool)  # a workflow as it is
    with pytest.raises(fusee.ConfigError, match="needs parameters="):
        workflow_tool("other-app.lookup")


@pytest.mark.parametrize(
    ("value", "verdict"),
    [
        (True, (True, None)),
        ({"approved": True}, (True, None)),
        (False, (False, None)),
        ({"approved": False, "reason": "too much"}, (False, "too much")),
    ],
)
def test_an_approvals_value(value: Any, verdict: tuple[bool, str | None]) -> None:
    assert approval_verdict(value) == verdict


def test_an_approval_value_of_another_shape_refuses_and_says_so() -> None:
    ok, reason = approval_verdict("yes")
    assert ok is False
    assert reason is not None
    assert '"yes"' in reason


@fusee.workflow("unit-tools-ping")
async def ping(ctx: fusee.Context) -> str:
    """Ping the service."""
    return "pong"


def _ask(cb: Any) -> None:
    """An ask that needs no call."""


def test_a_workflow_behind_an_approval() -> None:
    """``tool(workflow, approve=...)`` makes a workflow tool, as ``tool(workflow_tool(wf))``;
    ``workflow_tool`` takes ``approve_timeout=`` itself."""
    made = tool(lookup, approve=_ask, approve_timeout="5m")
    assert isinstance(made, WorkflowTool)
    assert (made.workflow, made.approve, made.approve_timeout) == ("unit-tools-lookup", _ask, 300)
    assert made.description == "Look an order up."
    direct = workflow_tool(lookup, approve=_ask, approve_timeout=60)
    assert (direct.approve, direct.approve_timeout) == (_ask, 60)


def test_a_no_input_workflow_tool_refuses_arguments() -> None:
    made = workflow_tool(ping)
    assert made.spec("ping").parameters["additionalProperties"] is False
    assert made.arguments.parse("ping", "{}") is None
    assert made.arguments.parse("ping", "") is None
    with pytest.raises(ToolInputError, match=r"the tool takes no arguments; give \{\}"):
        made.arguments.parse("ping", '{"host": "a"}')


def test_an_ask_gets_the_call_only_from_a_second_positional_parameter_without_default() -> None:
    from fusee.ai import ToolCall
    from fusee.ai.tools import ask_for

    call = ToolCall(id="c-1", name="refund", arguments="{}")
    got: list[Any] = []

    def with_call(cb: Any, c: ToolCall) -> None:
        got.append(c)

    def with_channel(cb: Any, channel: str = "#ops") -> None:
        got.append(channel)

    def with_args(*args: Any) -> None:
        got.append(args[1])

    for ask in (with_call, with_channel, with_args):
        ask_for(ask, call)("cb")  # type: ignore[arg-type]
    assert got == [call, "#ops", call]


def test_a_functions_tool_is_made_once_while_the_function_lives() -> None:
    """A loop reads its tools= on every call (every run, every replay): a function's
    schema is made once, a closure made per run is not kept."""
    import gc

    from fusee.ai import tools as tools_module

    first, again = as_tool("search", search), as_tool("other-name", search)
    assert isinstance(first, Tool)
    assert isinstance(again, Tool)
    assert again.fn is search
    assert again.arguments is first.arguments  # the schema not made again

    def per_run(query: str) -> str:
        """A closure of one run."""
        return query

    made = as_tool("per_run", per_run)
    assert isinstance(made, Tool)
    assert tools_module._MADE[per_run][1] is made.arguments
    del per_run, made
    gc.collect()
    assert all(getattr(f, "__name__", "") != "per_run" for f in tools_module._MADE)
