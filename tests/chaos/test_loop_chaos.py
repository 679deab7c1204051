"""SIGKILL the worker in the middle of an agent loop (issue 13): during the third turn's
tool calls, 20 times, at points a seeded RNG picks among the hooks of those calls
(``tests/workers/agents.py``: before or after each side effect, in a function tool and
in a workflow tool's child run). Two workers run at a time; the one running the call
(the loop's run, or the child's) kills itself at the point, the other takes over, and
a new one is spawned while it does.

Every run ends with the right answer; the model is asked once per turn (its request
log is a file, written by whichever worker asked); each tool call's side effect is
applied once per tool-call ID, and the calls journaled before the kill ran once.
"""

from __future__ import annotations

import collections
import os
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

import fusee
from fusee.ai.types import AssistantMessage
from fusee.runtime.records import RunStarted
from fusee.testing import ScriptedModel
from tests.workers.procs import HERE, WorkerProc, execution_lines, journal_calls, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

AGENTS = HERE / "agents.py"
KILLS = 20
POINTS = (
    "charge:before",
    "charge:after",
    "notify:before",
    "notify:after",
    "lookup:o-2:before",
    "lookup:o-2:after",
)
FINAL = "Refunded 30 EUR on o-1; ana was told."
SCRIPT: list[dict[str, Any]] = [
    {"calls": [{"name": "search_kb", "id": "c0", "args": {"query": "refund policy"}}]},
    {"calls": [{"name": "lookup_order", "id": "c1", "args": {"order": "o-1"}}]},
    {
        "calls": [
            {"name": "charge", "id": "c2a", "args": {"order": "o-1", "amount": 30}},
            {"name": "notify", "id": "c2b", "args": {"who": "ana"}},
            {"name": "lookup_order", "id": "c2c", "args": {"order": "o-2"}},
        ]
    },
    {"text": FINAL},
]


async def test_sigkill_during_the_third_turns_tool_calls(
    nats_server: Any, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    seed = int(os.environ.get("FUSEE_CHAOS_SEED") or 13)
    rng = random.Random(seed)
    print(f"FUSEE_CHAOS_SEED={seed}")
    env = {"FUSEE_TEST_AGENT_DIR": str(tmp_path)}
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        workers = worker_procs(partitions=4)
        workers.module = AGENTS
        live: list[WorkerProc] = [await workers.start(extra_env=env)]
        live.append(await workers.start(extra_env=env))
        chosen: list[str] = []
        for i in range(KILLS):
            point = rng.choice(POINTS)
            chosen.append(point)
            here = tmp_path / f"i{i}"
            here.mkdir()
            arg: dict[str, Any] = {
                "prompt": "Refund o-1 and tell ana",
                "script": SCRIPT,
                "model_log": str(here / "model.jsonl"),
                "effects": str(here / "effects.log"),
                "store": str(here / "store"),
                "killed": str(here / "killed"),
                "kill_at": point,
            }
            # what the workflow tool's child reads (it gets only the model's arguments)
            (tmp_path / "child-arg.json").write_bytes(msgspec.json.encode(arg))
            context = f"seed {seed}, kill {i + 1} at {point}"
            run_id = f"chaos-{i}"
            run = await engine.start("agent", run_id, arg)

            def dead() -> list[WorkerProc]:
                return [w for w in live if not w.alive]

            killed = await wait_until(dead, timeout=30, what=f"the kill ({context})")
            assert Path(arg["killed"]).read_text().split()[0] == point, context
            for w in killed:
                assert w.proc.returncode == -9, context  # SIGKILL, by its own hook
                live.remove(w)
            live.append(workers.spawn(extra_env=env))  # joins while the other resumes

            result = await run.result(timeout=30)
            assert result["text"] == FINAL, context
            assert result["iterations"] == 4, context
            contents = {
                m["tool_call_id"]: m["content"] for m in result["messages"] if m["role"] == "tool"
            }
            assert contents == {
                "c0": "kb: refund policy -> refunds take 3 days",
                "c1": '{"order":"o-1","status":"shipped"}',
                "c2a": '{"order":"o-1","charged":30}',
                "c2b": "notified ana",
                "c2c": '{"order":"o-2","status":"shipped"}',
            }, context

            # the model: one request per turn, none again for a journaled turn
            requests = ScriptedModel([], log=arg["model_log"]).requests
            turns = [sum(isinstance(m, AssistantMessage) for m in r.messages) for r in requests]
            assert turns == [0, 1, 2, 3], (context, turns)

            # each call's side effect once per key (``<step key>-<tool-call ID>``, or the
            # child's step key); the tool-call ID is the key's part after the step key
            lines = execution_lines(Path(arg["effects"]))
            ran = collections.Counter((name, _call_of(key)) for name, key, _ in lines)
            store = {_call_of(p.name): p.read_text() for p in Path(arg["store"]).iterdir()}
            assert store.get("c2a") == "charged o-1 30", (context, store)
            assert store.get("c2b") == "notified ana", (context, store)
            looked = sorted(v for v in store.values() if v.startswith("looked up"))
            assert looked == ["looked up o-1", "looked up o-2"], (context, store)
            assert len(store) == 4, (context, store)
            # the calls of turns 0 and 1 were journaled before the kill: they ran once
            assert ran[("search_kb", "c0")] == 1, (context, lines)
            assert [n for (name, _), n in ran.items() if name == "lookup:o-1"] == [1], lines
            # those of turn 2 at most twice (once more if the kill cut them short)
            assert all(1 <= n <= 2 for n in ran.values()), (context, lines)
            # each workflow tool call one child (<run id>/<call id>-<16 hex>), started once
            journal = await run.journal()
            children = [c for kind, c in journal_calls(journal) if kind == "child"]
            assert [c.rsplit("-", 1)[0] for c in children] == [f"{run_id}/c1", f"{run_id}/c2c"]
            for child_id in children:
                child = engine.run(child_id)
                started = [r for _, r in await child.journal() if isinstance(r, RunStarted)]
                assert len(started) == 1, (context, child_id)
        assert len(set(chosen)) > 1, chosen
    finally:
        await engine.close()


def _call_of(key: str) -> str:
    """The tool-call ID in a loop tool's ``s.key`` (``<32 hex>-<call ID>``), else the key."""
    _, dash, call_id = key.partition("-")
    return call_id if dash else key
