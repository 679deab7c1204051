"""``output=`` made a JSON Schema with an object at its root, and answers parsed into
it (``fusee.ai.output``); the scripted model's record across instances and pickling."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Optional

import msgspec
import pydantic
import pytest

from fusee.ai import ModelRequest, OutputError, UserMessage
from fusee.ai.output import Invalid, output_type
from fusee.errors import FatalError
from fusee.testing import ScriptedModel, tool_call


class Node(msgspec.Struct):
    """A tree."""

    name: str
    children: list[Node] = []


def test_a_struct_s_root_ref_is_inlined_and_a_recursive_one_keeps_its_defs() -> None:
    spec = output_type(Node, where="t").spec
    assert spec.schema["type"] == "object"
    assert spec.schema["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert "Node" in spec.schema["$defs"]  # still referred to from inside
    assert spec.name == "Node"
    assert spec.description == "A tree."


@pytest.mark.parametrize(
    ("output", "text", "value"),
    [
        (list[str], '{"result": ["a", "b"]}', ["a", "b"]),
        (int, '{"result": 3}', 3),
        (pydantic.RootModel[list[int]], '{"result": [1, 2]}', [1, 2]),
        ({"type": "array", "items": {"type": "integer"}}, '{"result": [1]}', [1]),
    ],
    ids=["list", "int", "root-model", "schema"],
)
def test_a_non_object_output_is_wrapped_in_result(output: Any, text: str, value: Any) -> None:
    shape = output_type(output, where="t")
    assert shape.spec.schema["type"] == "object"
    assert shape.spec.schema["required"] == ["result"]
    got = shape.parse(text)
    assert (got.root if isinstance(got, pydantic.RootModel) else got) == value
    with pytest.raises(Invalid, match="'result'"):
        shape.parse('["a"]')


@pytest.mark.parametrize("output", [Node | None, Optional[Node]], ids=["union-type", "optional"])  # noqa: UP045
def test_an_optional_struct_is_an_output_either_way_it_is_written(output: Any) -> None:
    """``T | None`` (a ``types.UnionType``) is taken as ``Optional[T]`` is."""
    shape = output_type(output, where="t")
    assert shape.spec.schema["required"] == ["result"]
    assert shape.parse('{"result": null}') is None
    assert shape.parse('{"result": {"name": "a"}}') == Node(name="a")


def test_errors_name_the_field() -> None:
    shape = output_type(Node, where="t")
    with pytest.raises(Invalid, match=r"\$.children"):
        shape.parse('{"name": "a", "children": 3}')
    with pytest.raises(Invalid, match="not JSON"):
        shape.parse("Sure! Here it is")


@pytest.mark.parametrize("output", [object, 42, lambda: 1, {"type": "objekt"}])
def test_an_output_that_is_no_schema_is_refused(output: Any) -> None:
    with pytest.raises(OutputError, match="generate 'x'"):
        output_type(output, where="generate 'x'")


REQUEST = ModelRequest(messages=[UserMessage("hello there")])


async def test_the_scripted_model_s_log_is_one_record_across_instances(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    script = ["one", tool_call("search", "c1", q="x"), {"a": 1}]
    first = ScriptedModel(script, log=log)
    assert (await first.complete(REQUEST)).text == "one"
    again = pickle.loads(pickle.dumps(first))  # as a worker process would build it
    reply = await again.complete(REQUEST)
    assert reply.finish_reason == "tool_calls"
    assert reply.tool_calls[0].args() == {"q": "x"}
    third = ScriptedModel(script, log=log)
    assert (await third.complete(REQUEST)).text == '{"a":1}'
    assert [c.index for c in first.calls] == [0, 1, 2]
    assert first.requests == [REQUEST] * 3
    with pytest.raises(FatalError, match="request 4 came, but the script has 3 replies"):
        await third.complete(REQUEST)
