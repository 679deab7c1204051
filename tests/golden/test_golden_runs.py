"""Recorded runs replay through their workflow code (like Temporal's replayer tests).

Each journal in ``runs/`` was recorded by the real engine on a real nats-server
(``record_runs.py``) from the code in ``workflows.py``. Cut just before each of its end
records (a run's end, a generation's ``run.continued``, an invocation's ``obj.done``),
it is replayed by the real actor over the in-memory store: every call the code makes
must be the journaled one (no ``DeterminismError``, nothing executed again), and the
first thing the replay writes must be the recorded end record, byte for byte but for
what the replaying worker's clock says. A changed workflow replayed over a recorded
journal must pause with a ``DeterminismError`` naming both calls.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import fusee
from fusee.actors.core import ActorCore
from fusee.actors.object_actor import ObjectActor
from fusee.actors.registry import Registry, Workflow
from fusee.actors.run_actor import RunActor
from fusee.runtime.ids import escape
from fusee.runtime.objects import object_id
from fusee.runtime.records import (
    AnyRecord,
    ObjectDone,
    RunCancelled,
    RunCompleted,
    RunContinued,
    RunFailed,
    RunPaused,
    StepFailed,
    WaitStarted,
    decode_record,
    encode_record,
    kind_of,
)
from tests.golden import workflows
from tests.memory_store import Crash, MemoryStore, Stored

RUNS = Path(__file__).parent / "runs"
ENDS = (RunCompleted, RunFailed, RunCancelled, RunContinued, ObjectDone)
CLOCK_FIELDS = ("continued_at", "duration_ms")  # the replaying worker's clock, not the code's
NOW = 2_000_000_000.0  # after every recording: nothing the replay does may depend on it


def _lines(name: str) -> list[bytes]:
    return (RUNS / f"{name}.jsonl").read_bytes().splitlines()


def _stored(lines: list[bytes], upto: int) -> list[Stored]:
    """The first ``upto`` records at their stream sequences: each record names its
    predecessor's (``prev``), so the journal file needs no sequences of its own."""
    prevs = [decode_record(line).prev for line in lines]
    return [Stored(prevs[i + 1], lines[i]) for i in range(upto)]


def _actor(name: str, store: MemoryStore, registry: Registry) -> tuple[str, RunActor | ObjectActor]:
    def core(actor_id: str) -> ActorCore:
        return ActorCore(
            store=store,
            namespace="golden",
            eid=escape(actor_id),
            run_id=actor_id,
            partition=0,
            clock=lambda: NOW,
        )

    if name in workflows.OBJECTS:
        obj, key, _ = workflows.OBJECTS[name]
        actor_id = object_id(obj.name, key)
        actor = ObjectActor(object_type=obj.name, key=key, registry=registry, core=core(actor_id))
        return escape(actor_id), actor
    return escape(name), RunActor(registry=registry, core=core(name))


def _replay(name: str, upto: int, registry: Registry = workflows.REGISTRY) -> AnyRecord:
    """Replay the first ``upto`` records of journal ``name``; what the replay appends
    first (the actor stops there, as if its process died)."""
    lines = _lines(name)
    store = MemoryStore(crash_after_append=1)
    eid, actor = _actor(name, store, registry)
    store.seed(eid, *_stored(lines, upto))

    async def go() -> None:
        with anyio.fail_after(10):  # a replay that waits for something never ends
            try:
                outcome = await actor.run()
            except Crash:
                return
        pytest.fail(f"the replay of {name} left ({outcome}) without appending anything")

    anyio.run(go)
    appended = store.journal(eid)[upto:]
    assert len(appended) == 1
    return decode_record(appended[0].data)


def _cases() -> list[Any]:
    cases = []
    for path in sorted(RUNS.glob("*.jsonl")):
        for i, line in enumerate(path.read_bytes().splitlines()):
            record = decode_record(line)
            if isinstance(record, ENDS):
                cases.append(
                    pytest.param(path.stem, i, id=f"{path.stem}:{i + 1}:{kind_of(record)}")
                )
    return cases


@pytest.mark.parametrize(("name", "upto"), _cases())
def test_a_golden_journal_replays_to_its_recorded_end(name: str, upto: int) -> None:
    recorded = _lines(name)[upto]
    made = _replay(name, upto)
    assert not isinstance(made, RunPaused), made.reason
    expected = decode_record(recorded)
    assert kind_of(made) == kind_of(expected), f"the replay wrote {made}, not {expected}"
    clock = {f: getattr(expected, f) for f in CLOCK_FIELDS if hasattr(expected, f)}
    assert encode_record(msgspec.structs.replace(made, **clock)).decode() == recorded.decode()


def test_every_golden_journal_is_replayed_and_every_run_of_the_set_was_recorded() -> None:
    names = {path.stem for path in RUNS.glob("*.jsonl")}
    assert names == set(workflows.RUNS) | set(workflows.OBJECTS)
    assert {name for name, _ in (c.values for c in _cases())} == names


def test_the_golden_journals_use_every_call() -> None:
    records = [decode_record(line) for path in RUNS.glob("*.jsonl") for line in _lines(path.stem)]
    kinds = {kind_of(r) for r in records}
    assert kinds >= {
        "run.started",
        "step.completed",
        "step.retrying",
        "step.failed",
        "wait.started",
        "wait.done",
        "call.cancelled",
        "run.continued",
        "run.completed",
        "run.failed",
        "obj.started",
        "obj.done",
    }, kinds
    waits = {r.wait for r in records if isinstance(r, WaitStarted)}
    assert waits == {"sleep", "signal", "completion", "child"}
    assert {v.kind for r in records if isinstance(r.values, list) for v in r.values} == {
        "now",
        "random",
        "uuid",
    }
    assert any(r.name.startswith("compensate:") for r in records if hasattr(r, "name"))
    assert any(isinstance(r, StepFailed) for r in records)


# -- a changed workflow -------------------------------------------------------------------


async def _steps_renamed(ctx: fusee.Context, arg: str) -> str:
    """``workflows.steps`` as someone might edit it: its second step renamed."""
    await ctx.step("flaky", lambda: f"{arg} on attempt 2")
    await ctx.step("broken-v2", lambda: None)
    return "unreachable"


def test_a_changed_workflow_replayed_over_a_golden_journal_pauses_naming_both_calls() -> None:
    registry = Registry()
    registry.add(Workflow("golden.steps", _steps_renamed, str, True))
    lines = _lines("steps")
    made = _replay("steps", len(lines) - 1, registry)
    assert isinstance(made, RunPaused)
    assert re.search(
        r"step 2 is 'broken' in the journal, but the code now calls 'broken-v2' "
        r"at .*test_golden_runs\.py:\d+",
        made.reason,
    ), made.reason
