"""``fusee.ai.generate`` with the scripted model (real nats-server, in-process worker):
structured output for every kind of ``output=``, the durable re-ask (one step per
re-ask, the error fed back), a clear error when re-asks run out or the answer is not
JSON, a clear error at the call for an ``output`` that is no schema, and streaming.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, TypedDict

import msgspec
import pydantic
import pytest

import fusee
from fusee.ai import Generation, Model, UserMessage, generate
from fusee.runtime.records import RunFailed, StepCompleted
from fusee.testing import ScriptedModel, Streamed

MODELS: dict[str, Model] = {}  # run ID -> the model its workflow asks
OUTPUTS: dict[str, Any] = {}  # run ID -> its output=
FAST = fusee.Retry(attempts=3, initial=0.01, max=0.02)


class Triage(msgspec.Struct):
    """A ticket's category and priority."""

    category: str
    priority: Literal["low", "high"]


@dataclasses.dataclass
class TriageDC:
    category: str
    priority: Literal["low", "high"]


class TriageTD(TypedDict):
    category: str
    priority: Literal["low", "high"]


class TriageP(pydantic.BaseModel):
    category: str
    priority: Literal["low", "high"]


TRIAGE_SCHEMA = {
    "type": "object",
    "properties": {"category": {"type": "string"}, "priority": {"enum": ["low", "high"]}},
    "required": ["category", "priority"],
}


def not_empty(t: Any) -> str | None:
    category = t["category"] if isinstance(t, dict) else t.category
    return None if category else "category is empty"


@fusee.workflow("gen_ticket")
async def ticket(ctx: fusee.Context, subject: str) -> dict[str, Any]:
    model = MODELS[ctx.run_id]
    triage = await generate(
        ctx,
        "classify",
        model=model,
        prompt=f"Classify: {subject}",
        output=OUTPUTS.get(ctx.run_id, Triage),
        validate=not_empty,
        reask=2,
        retry=FAST,
    )
    reply = await generate(ctx, "draft-reply", model=model, prompt="Reply", retry=FAST)
    out = triage.output
    if isinstance(out, pydantic.BaseModel):
        as_dict = out.model_dump()
    else:
        as_dict = out if isinstance(out, dict) else msgspec.to_builtins(out)
    return {
        "triage": as_dict,
        "type": type(out).__name__,
        "reasks": triage.reasks,
        "usage": [triage.usage.input_tokens, triage.usage.output_tokens],
        "model": triage.model,
        "reply": reply.text,
    }


@fusee.workflow("gen_strict")
async def strict(ctx: fusee.Context, reask: int) -> Any:
    g = await generate(
        ctx, "classify", model=MODELS[ctx.run_id], prompt="Classify", output=Triage, reask=reask
    )
    return g.text


@fusee.workflow("gen_bad_output")
async def bad_output(ctx: fusee.Context) -> Any:
    await generate(
        ctx, "classify", model=MODELS[ctx.run_id], prompt="x", output=OUTPUTS[ctx.run_id]
    )


@fusee.workflow("gen_stream")
async def streamed(ctx: fusee.Context) -> dict[str, Any]:
    g: Generation[None] = await generate(
        ctx, "answer", model=MODELS[ctx.run_id], prompt="Tell me", stream=True, retry=FAST
    )
    return {"text": g.text, "usage": g.usage.output_tokens}


async def journal_steps(engine: fusee.Engine, run_id: str) -> list[tuple[str, Any]]:
    return [
        (r.name, msgspec.json.decode(bytes(r.result)))
        for _, r in await engine.run(run_id).journal()
        if isinstance(r, StepCompleted)
    ]


GOOD = {"category": "billing", "priority": "high"}


@pytest.mark.parametrize(
    "output",
    [Triage, TriageDC, TriageTD, TriageP, TRIAGE_SCHEMA],
    ids=lambda o: getattr(o, "__name__", "schema"),
)
async def test_structured_output_of_each_kind(engine: fusee.Engine, output: Any) -> None:
    run_id = f"kind-{getattr(output, '__name__', 'schema')}"
    model = ScriptedModel([GOOD, "Thanks, we are on it."])
    MODELS[run_id], OUTPUTS[run_id] = model, output
    async with engine.worker():
        run = await engine.start("gen_ticket", run_id, "my invoice is wrong")
        result = await run.result(timeout=10)
    assert result["triage"] == GOOD
    plain = isinstance(output, dict) or output is TriageTD  # a TypedDict's value is a dict
    assert result["type"] == ("dict" if plain else output.__name__)
    assert result["reasks"] == 0
    assert result["reply"] == "Thanks, we are on it."
    assert result["model"] == "scripted"
    # the model was asked for that schema, as an object at the root
    first = model.requests[0]
    assert first.output is not None
    assert first.output.schema["type"] == "object"
    assert set(first.output.schema["properties"]) == {"category", "priority"}
    assert first.messages == [UserMessage("Classify: my invoice is wrong")]
    assert model.requests[1].output is None
    assert [n for n, _ in await journal_steps(engine, run_id)] == ["classify", "draft-reply"]


async def test_a_bad_answer_is_reasked_with_the_error_fed_back(engine: fusee.Engine) -> None:
    model = ScriptedModel(
        [
            "Sure! It is billing.",  # not JSON
            {"category": "", "priority": "high"},  # refused by validate
            GOOD,
            "Reply text",
        ]
    )
    MODELS["reask"] = model
    async with engine.worker():
        result = await (await engine.start("gen_ticket", "reask", "x")).result(timeout=10)
    assert result["triage"] == GOOD
    assert result["reasks"] == 2
    steps = await journal_steps(engine, "reask")
    assert [n for n, _ in steps] == [
        "classify",
        "classify#reask-1",
        "classify#reask-2",
        "draft-reply",
    ]
    assert steps[0][1]["text"] == "Sure! It is billing."
    # each re-ask carries the conversation so far and the error
    second, third = model.requests[1], model.requests[2]
    assert [m.role for m in second.messages] == ["user", "assistant", "user"]
    feedback = second.messages[-1]
    assert isinstance(feedback, UserMessage)
    assert "not JSON" in feedback.content
    assert "Sure! It is billing." in feedback.content
    last = third.messages[-1]
    assert isinstance(last, UserMessage)
    assert "category is empty" in last.content
    assert len(third.messages) == 5
    # the usage adds up the three steps
    assert result["usage"][0] == sum(s[1]["usage"]["input_tokens"] for s in steps[:3])


async def test_reasks_used_up_fail_the_run_naming_the_step_and_error(engine: fusee.Engine) -> None:
    MODELS["used-up"] = ScriptedModel([{"category": "a", "priority": "urgent"}] * 2)
    async with engine.worker():
        run = await engine.start("gen_strict", "used-up", 1)
        with pytest.raises(fusee.RunFailed) as err:
            await run.result(timeout=10)
    assert err.value.error_type == "fusee.OutputInvalid"
    assert "'classify#reask-1'" in err.value.message
    assert "after 1 re-ask(s)" in err.value.message
    assert "priority" in err.value.message  # the last validation message
    assert [n for n, _ in await journal_steps(engine, "used-up")] == [
        "classify",
        "classify#reask-1",
    ]


async def test_an_answer_that_is_not_json_with_no_reask_is_a_clear_error(
    engine: fusee.Engine,
) -> None:
    MODELS["not-json"] = ScriptedModel(["I think it is billing"])
    async with engine.worker():
        run = await engine.start("gen_strict", "not-json", 0)
        with pytest.raises(fusee.RunFailed) as err:
            await run.result(timeout=10)
    assert err.value.error_type == "fusee.OutputInvalid"
    assert "'classify'" in err.value.message
    assert "not JSON" in err.value.message
    assert "I think it is billing" in err.value.message
    journal = [r for _, r in await engine.run("not-json").journal()]
    # the answer is journaled (a replay does not ask again), then the failure
    assert [r.name for r in journal if isinstance(r, StepCompleted)] == ["classify"]
    assert [r.error_type for r in journal if isinstance(r, RunFailed)] == ["fusee.OutputInvalid"]


class NoSchema:
    def __init__(self, x: int) -> None:
        self.x = x


@pytest.mark.parametrize(
    ("output", "says"),
    [
        (NoSchema, "NoSchema cannot be made a JSON Schema"),
        ({"type": "objekt"}, "not a valid JSON Schema"),
        (42, "not a type or a JSON Schema dict"),
    ],
    ids=["class", "schema", "value"],
)
async def test_an_output_that_is_no_schema_fails_at_the_call(
    engine: fusee.Engine, output: Any, says: str
) -> None:
    run_id = f"no-schema-{type(output).__name__}"
    model = ScriptedModel([GOOD])
    MODELS[run_id], OUTPUTS[run_id] = model, output
    async with engine.worker():
        run = await engine.start("gen_bad_output", run_id)
        with pytest.raises(fusee.RunFailed) as err:
            await run.result(timeout=10)
    assert err.value.error_type == "fusee.OutputError"
    assert "generate 'classify'" in err.value.message
    assert says in err.value.message
    assert model.requests == [], "the model was not asked"
    assert await journal_steps(engine, run_id) == [], "no step was journaled"


async def test_stream_makes_the_call_a_token_stream(engine: fusee.Engine) -> None:
    text = "Durable tokens arrive once, in order."
    # the first attempt breaks after three chunks; the retry continues the stored text
    model = ScriptedModel([Streamed(["Durable", " tokens", " arrive"], error="cut"), text])
    MODELS["stream"] = model
    async with engine.worker():
        run = await engine.start("gen_stream", "stream")
        result = await run.result(timeout=10)
        tokens = [t async for t in engine.run("stream").stream("answer")]
    assert result["text"] == text
    assert "".join(tokens) == text
    assert [c.prefill for c in model.calls] == ["", "Durable tokens arrive"]
    assert all(c.stream for c in model.calls)
    steps = await journal_steps(engine, "stream")
    assert [n for n, _ in steps] == ["answer"]
    assert steps[0][1]["text"] == text
    assert result["usage"] == len(text.split())


BAD_CALLS: dict[str, tuple[dict[str, Any], str]] = {
    "both": ({"prompt": "x", "messages": [UserMessage("x")]}, "give prompt= or messages="),
    "neither": ({}, "give prompt= or messages="),
    "reask": ({"prompt": "x", "reask": -1}, "reask=-1, expected an int >= 0"),
    "model": ({"prompt": "x", "model": "gpt-5"}, "model= is a str, not a fusee.ai.Model"),
    "message": ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0] is not a message"),
    "validate": ({"prompt": "x", "validate": "yes"}, "validate='yes' is not callable"),
}


@fusee.workflow("gen_bad_call")
async def bad_call(ctx: fusee.Context, case: str) -> Any:
    kwargs: dict[str, Any] = {"model": MODELS[ctx.run_id], **BAD_CALLS[case][0]}
    await generate(ctx, "classify", **kwargs)


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
async def test_a_bad_call_is_a_clear_error_and_nothing_is_asked(
    engine: fusee.Engine, case: str
) -> None:
    run_id = f"bad-call-{case}"
    model = ScriptedModel(["never"])
    MODELS[run_id] = model
    async with engine.worker():
        with pytest.raises(fusee.RunFailed) as err:
            await (await engine.start("gen_bad_call", run_id, case)).result(timeout=10)
    assert err.value.error_type == "fusee.InvalidArgument"
    assert "generate 'classify'" in err.value.message
    assert BAD_CALLS[case][1] in err.value.message
    assert model.requests == []
    assert await journal_steps(engine, run_id) == []


@fusee.workflow("gen_limited")
async def limited(ctx: fusee.Context, limit: str) -> str:
    g = await generate(ctx, "ask", model=MODELS[ctx.run_id], prompt="x", limit=limit,
                       fairness_key="tenant-1")  # fmt: skip
    return g.text


async def test_limit_applies_to_the_step(engine: fusee.Engine) -> None:
    """limit= reaches the step: a limit that exists lets it through, one that does not
    fails it (fusee.UnknownLimit) before the model is asked."""
    await engine.limit("llm", concurrent=1)
    known, unknown = ScriptedModel(["fine"]), ScriptedModel(["never"])
    MODELS["limited"], MODELS["unlimited"] = known, unknown
    async with engine.worker():
        assert (
            await (await engine.start("gen_limited", "limited", "llm")).result(timeout=10) == "fine"
        )
        with pytest.raises(fusee.RunFailed) as err:
            await (await engine.start("gen_limited", "unlimited", "nope")).result(timeout=10)
    assert err.value.error_type == "fusee.UnknownLimit"
    assert unknown.requests == []
    assert len(known.requests) == 1
