"""Structured output: an ``output=`` type made a JSON Schema, and a model's answer
parsed into it.

- a msgspec Struct, a dataclass, a TypedDict (or any type msgspec knows):
  ``msgspec.json.schema`` and ``msgspec.json.decode(text, type=...)``;
- a pydantic model (when pydantic is installed): ``model_json_schema`` and
  ``model_validate_json``;
- a JSON Schema dict: checked against its metaschema and validated with ``jsonschema``;
  the answer is the decoded JSON value.

Providers want an object at the schema's root (OpenAI's structured outputs, the input
of Anthropic's tool), so a type whose schema is not an object (``list[str]``, ``int``)
is wrapped as ``{"result": ...}`` and unwrapped after parsing.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import jsonschema
import msgspec

from fusee.ai.errors import OutputError
from fusee.ai.types import OutputSpec

__all__ = ("OutputType", "output_type", "Invalid")

T = TypeVar("T")

WRAP = "result"  # the property a non-object output is wrapped in


class Invalid(Exception):
    """The answer does not fit the output (the message says how; it is fed back)."""


@dataclasses.dataclass(frozen=True)
class OutputType(Generic[T]):
    """How one ``output=`` is asked for and read back."""

    spec: OutputSpec
    parse: Callable[[str], T]  # the answer's text -> the value; raises Invalid


def output_type(output: Any, *, where: str) -> OutputType[Any]:
    """The schema and parser of ``output``.

    Raises:
        OutputError: ``output`` cannot be made a JSON Schema (the message names it).
    """
    if isinstance(output, dict):
        return _schema_dict(output, where)
    generic = getattr(output, "__origin__", None) is not None  # list[str], Optional[T]
    if not isinstance(output, type | types.UnionType) and not generic:  # T | None
        raise OutputError(
            f"{where}: output={output!r} is not a type or a JSON Schema dict (give a "
            f"msgspec Struct, a pydantic model, a dataclass, a TypedDict or a schema)"
        )
    if _is_pydantic(output):
        return _pydantic(output, where)
    return _msgspec(output, where)


def _name(raw: object) -> str:
    """A name providers take (``^[A-Za-z0-9_-]{1,64}$``)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", raw if isinstance(raw, str) else "")[:64]
    return name or "output"


def _description(schema: dict[str, Any]) -> str:
    """The schema's own description (msgspec and pydantic take a class's docstring)."""
    text = schema.get("description")
    return " ".join(text.split())[:1000] if isinstance(text, str) else ""


def _rooted(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``schema`` with its root ``$ref`` inlined, and whether it had to be wrapped
    in an object."""
    ref = schema.get("$ref")
    defs = schema.get("$defs", {})
    if isinstance(ref, str) and ref.startswith("#/$defs/") and len(schema) <= 2:
        target = defs.get(ref.removeprefix("#/$defs/"))
        if isinstance(target, dict):
            rest = {k: v for k, v in defs.items() if k != ref.removeprefix("#/$defs/")}
            if ref.encode() in msgspec.json.encode([target, rest]):
                rest = defs  # referred to from inside: keep it
            schema = {**target, "$defs": rest} if rest else dict(target)
    if schema.get("type") == "object":
        return schema, False
    inner = {k: v for k, v in schema.items() if k != "$defs"}
    wrapped: dict[str, Any] = {
        "type": "object",
        "properties": {WRAP: inner},
        "required": [WRAP],
        "additionalProperties": False,
    }
    if "$defs" in schema:
        wrapped["$defs"] = schema["$defs"]
    return wrapped, True


def _decode_json(text: str) -> Any:
    try:
        return msgspec.json.decode(text.strip() or "null")
    except msgspec.DecodeError as e:
        raise Invalid(f"the answer is not JSON ({e}): {_clip(text)}") from None


def _clip(text: str, n: int = 200) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def _unwrap(value: Any) -> Any:
    if not isinstance(value, dict) or WRAP not in value:
        raise Invalid(f"the answer is not an object with the property {WRAP!r}")
    return value[WRAP]


def _msgspec(output: Any, where: str) -> OutputType[Any]:
    try:
        schema = msgspec.json.schema(output)
        decoder = msgspec.json.Decoder(output)
    except (TypeError, ValueError) as e:
        why = " ".join(str(e).split())
        raise OutputError(
            f"{where}: output={_show(output)} cannot be made a JSON Schema ({why}); give a "
            f"msgspec Struct, a pydantic model, a dataclass, a TypedDict or a schema dict"
        ) from None
    schema, wrapped = _rooted(schema)

    def parse(text: str) -> Any:
        if wrapped:
            try:
                return msgspec.convert(_unwrap(_decode_json(text)), output)
            except msgspec.ValidationError as e:
                raise Invalid(str(e).replace("`$`", f"`$.{WRAP}`")) from None
        try:
            return decoder.decode(text.strip())
        except msgspec.ValidationError as e:
            raise Invalid(str(e)) from None
        except msgspec.DecodeError as e:
            raise Invalid(f"the answer is not JSON ({e}): {_clip(text)}") from None

    spec = OutputSpec(
        schema=schema,
        name=_name(getattr(output, "__name__", None)),
        description=_description(schema),
    )
    return OutputType(spec, parse)


def _is_pydantic(output: Any) -> bool:
    pydantic = sys.modules.get("pydantic")  # never imported here: a class of it was
    return (
        pydantic is not None and isinstance(output, type) and issubclass(output, pydantic.BaseModel)
    )


def _pydantic(output: Any, where: str) -> OutputType[Any]:
    import pydantic

    try:
        schema = output.model_json_schema()
    except pydantic.PydanticUserError as e:
        raise OutputError(
            f"{where}: the pydantic model {_show(output)} cannot be made a JSON Schema ({e})"
        ) from None
    schema, wrapped = _rooted(schema)

    def parse(text: str) -> Any:
        try:
            if wrapped:  # a RootModel of a non-object
                return output.model_validate(_unwrap(_decode_json(text)))
            return output.model_validate_json(text.strip())
        except pydantic.ValidationError as e:
            if any(err.get("type") == "json_invalid" for err in e.errors()):
                raise Invalid(f"the answer is not JSON: {_clip(text)}") from None
            raise Invalid(_pydantic_errors(e)) from None

    spec = OutputSpec(
        schema=schema,
        name=_name(getattr(output, "__name__", None)),
        description=_description(schema),
    )
    return OutputType(spec, parse)


def _pydantic_errors(e: Any) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err.get("loc", ())) or "$"
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)


def _schema_dict(schema: dict[str, Any], where: str) -> OutputType[Any]:
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise OutputError(
            f"{where}: output= is not a valid JSON Schema: {e.message} "
            f"(at {'/'.join(str(p) for p in e.absolute_path) or 'the root'})"
        ) from None
    rooted, wrapped = _rooted(schema)
    validator = cls(schema)

    def parse(text: str) -> Any:
        value = _decode_json(text)
        if wrapped:
            value = _unwrap(value)
        errors = sorted(validator.iter_errors(value), key=lambda err: list(err.absolute_path))
        if errors:
            raise Invalid(
                "; ".join(
                    f"{'$' + ''.join(f'[{p!r}]' for p in err.absolute_path)}: {err.message}"
                    for err in errors[:5]
                )
            )
        return value

    spec = OutputSpec(
        schema=rooted, name=_name(schema.get("title")), description=_description(rooted)
    )
    return OutputType(spec, parse)


def _show(output: Any) -> str:
    return getattr(output, "__qualname__", None) or repr(output)
