"""The adapter's golden journal (``support.jsonl``, recorded by ``record.py`` with Pydantic
AI 2.68.0) replays through ``agents.py`` with the installed Pydantic AI: cut before its
``run.completed``, the replay makes exactly the journaled steps (their names pinned by
the journal), decodes every journaled model response and tool result, and writes the
recorded end first, byte for byte. An upgrade that renames a step pauses it with a
``DeterminismError``; one that cannot load a recorded payload fails it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

pytest.importorskip("pydantic_ai")

from fusee.actors.core import ActorCore
from fusee.actors.registry import Registry, Workflow
from fusee.actors.run_actor import RunActor
from fusee.ai.pydantic import FuseeDurability
from fusee.runtime.ids import escape
from fusee.runtime.records import AnyRecord, RunCompleted, RunPaused, decode_record
from tests.golden.pydantic_ai import agents
from tests.memory_store import Crash, MemoryStore, Stored

HERE = Path(__file__).parent


def _replay(name: str, registry: Registry) -> AnyRecord:
    lines = (HERE / f"{name}.jsonl").read_bytes().splitlines()
    upto = len(lines) - 1
    assert isinstance(decode_record(lines[upto]), RunCompleted)
    prevs = [decode_record(line).prev for line in lines]
    store = MemoryStore(crash_after_append=1)
    eid = escape(name)
    store.seed(eid, *[Stored(prevs[i + 1], lines[i]) for i in range(upto)])
    core = ActorCore(
        store=store, namespace="golden", eid=eid, run_id=name, partition=0,
        clock=lambda: 2_000_000_000.0,
    )  # fmt: skip
    actor = RunActor(registry=registry, core=core)

    async def go() -> None:
        with anyio.fail_after(10):
            try:
                await actor.run()
            except Crash:
                return
        pytest.fail(f"the replay of {name} appended nothing")

    anyio.run(go)
    appended = store.journal(eid)[upto:]
    assert len(appended) == 1
    return decode_record(appended[0].data)


def test_the_golden_agent_journal_replays_to_its_recorded_end() -> None:
    recorded = (HERE / "support.jsonl").read_bytes().splitlines()[-1]
    made = _replay("support", agents.REGISTRY)
    assert not isinstance(made, RunPaused), made.reason
    expected = decode_record(recorded)
    assert isinstance(made, RunCompleted), made
    assert isinstance(expected, RunCompleted)
    assert made.result == expected.result


def test_a_renamed_agent_replayed_over_the_golden_journal_pauses_naming_both_steps() -> None:
    renamed = agents.support.__class__(
        agents.support.model,
        name="helpdesk",
        tools=[agents.lookup_order, agents.refund],
        capabilities=[FuseeDurability()],
    )

    async def wf(ctx: object, question: str) -> str:
        from fusee.ai.pydantic import run

        return (await run(ctx, lambda: renamed.run(question))).output  # type: ignore[arg-type]

    registry = Registry()
    registry.add(Workflow("golden.pydantic_ai", wf, str, True))
    made = _replay("support", registry)
    assert isinstance(made, RunPaused)
    assert "'support__model.request' in the journal" in made.reason, made.reason
    assert "'helpdesk__model.request'" in made.reason, made.reason
