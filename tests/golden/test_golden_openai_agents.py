"""The recorded journal of an OpenAI Agents SDK run (``agents_runs/``, recorded by
``openai_agents_workflows.py``) replays through the same code with the installed SDK.

Cut just before its end, the journal is replayed by the real actor over the in-memory
store: every step the adapter makes must be the journaled one (name and position), no
model is asked and no tool runs again, and the first thing the replay writes is the
recorded ``run.completed``, byte for byte. An SDK upgrade that renames the steps,
reorders them, or cannot read the payloads the adapter journaled fails here.
"""

from __future__ import annotations

import anyio
import msgspec
import pytest
from agents.items import ModelResponse
from pydantic import TypeAdapter

from fusee.actors.core import ActorCore
from fusee.actors.run_actor import RunActor
from fusee.runtime.ids import escape
from fusee.runtime.records import (
    RunCompleted,
    RunPaused,
    StepCompleted,
    decode_record,
    encode_record,
)
from tests.golden.openai_agents_workflows import REGISTRY, RUN_ID, RUNS
from tests.memory_store import Crash, MemoryStore, Stored

NOW = 2_000_000_000.0  # after the recording: nothing the replay does may depend on it

# The step names a run of the golden agent journals, in position order: pinned.
STEPS = [
    "guardrail:on_topic",
    "model",
    "tool:lookup_order",
    "model",
    "tool:refund",
    "tool:lookup_order",
    "model",  # the handoff's call
    "model",  # the agent handed off to
]


def _lines() -> list[bytes]:
    return (RUNS / f"{RUN_ID}.jsonl").read_bytes().splitlines()


def test_the_golden_journal_has_the_pinned_steps_and_sdk_payloads() -> None:
    records = [decode_record(line) for line in _lines()]
    steps = sorted((r for r in records if isinstance(r, StepCompleted)), key=lambda r: r.pos)
    assert [s.name for s in steps] == STEPS
    responses = TypeAdapter(ModelResponse)
    for s in steps:
        if s.name == "model":  # the SDK of today reads what the adapter journaled
            response = responses.validate_python(msgspec.json.decode(bytes(s.result)))
            assert response.output


def test_the_golden_journal_replays_to_its_recorded_end() -> None:
    lines = _lines()
    upto = next(i for i, line in enumerate(lines) if isinstance(decode_record(line), RunCompleted))
    prevs = [decode_record(line).prev for line in lines]
    store = MemoryStore(crash_after_append=1)
    eid = escape(RUN_ID)
    store.seed(eid, *[Stored(prevs[i + 1], lines[i]) for i in range(upto)])
    core = ActorCore(
        store=store, namespace="golden", eid=eid, run_id=RUN_ID, partition=0, clock=lambda: NOW
    )
    actor = RunActor(registry=REGISTRY, core=core)

    async def go() -> None:
        with anyio.fail_after(10):
            try:
                await actor.run()
            except Crash:
                return
        pytest.fail("the replay left without appending anything")

    anyio.run(go)
    appended = store.journal(eid)[upto:]
    assert len(appended) == 1
    made = decode_record(appended[0].data)
    assert not isinstance(made, RunPaused), made.reason
    assert encode_record(made).decode() == lines[upto].decode()
