"""fusee.ai.pydantic and Pydantic AI's OpenTelemetry instrumentation: a step replayed from
the journal is not traced again (``replay_scope`` / ``record_durable_unit``, Pydantic AI
2.68+), so a run replayed after every step reports one span per model request and per
tool call, as a run that never stopped does."""

from __future__ import annotations

import collections

import anyio
import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent, durable_exec
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings

import fusee
from fusee.actors.worker import WorkerConfig
from fusee.ai.pydantic import FuseeDurability, run
from tests.integration.test_pydantic_ai import EXPECTED, lookup_order, refund, two_turns

SPANS = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(SPANS))

traced = Agent(
    FunctionModel(two_turns),
    name="traced",
    tools=[lookup_order, refund],
    capabilities=[
        Instrumentation(settings=InstrumentationSettings(tracer_provider=_provider)),
        FuseeDurability(),
    ],
)


@fusee.workflow("pyd_traced")
async def traced_wf(ctx: fusee.Context) -> str:
    return (await run(ctx, lambda: traced.run("refund A1"))).output


@pytest.mark.skipif(
    not hasattr(durable_exec, "replay_scope"), reason="Pydantic AI < 2.68 traces replays again"
)
async def test_replayed_steps_are_not_traced_again(engine: fusee.Engine) -> None:
    SPANS.clear()
    # replayed after every step: the first model request is replayed four times
    async with engine.worker(config=WorkerConfig(always_replay=True)):
        r = await engine.start("pyd_traced", "tr", None)
        with anyio.fail_after(20):
            assert await r.result() == EXPECTED
    names = collections.Counter(s.name for s in SPANS.get_finished_spans())
    assert names["chat function:two_turns:"] == 2, names  # one per model request
    assert names["execute_tool refund"] == 1, names
    # (each activation that ran a step reports its agent run span, ended by the eviction)
