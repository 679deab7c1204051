"""SIGKILL the worker in the middle of an OpenAI Agents SDK agent (issue 14): during the
second turn's two parallel tool calls, 20 times, at a point a seeded RNG picks
(before or after each side effect; ``tests/workers/openai_agents.py``). Two workers
run at a time; the one running the call kills itself, the other takes over, and a new
one is spawned while it does.

Every run ends with the right output; the fake server (the real ``openai`` client's
Chat Completions) is asked once per turn, never again for a journaled response; each
tool call's side effect is applied once per tool-call ID, and the first turn's call,
journaled before the kill, ran once.
"""

from __future__ import annotations

import collections
import os
import random
from pathlib import Path
from typing import Any

import pytest

import fusee
from tests.fakes.agents_server import AgentsFake
from tests.integration.test_openai_agents_workers import FINAL, MODULE, SCRIPT, agent_arg
from tests.workers.procs import WorkerProc, execution_lines, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

KILLS = 20
POINTS = ("refund:before", "refund:after", "lookup:o-2:before", "lookup:o-2:after")


async def test_sigkill_during_the_second_turns_tool_calls(
    nats_server: Any, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    seed = int(os.environ.get("FUSEE_CHAOS_SEED") or 13)
    rng = random.Random(seed)
    print(f"FUSEE_CHAOS_SEED={seed}")
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        workers = worker_procs(partitions=4)
        workers.module = MODULE
        live: list[WorkerProc] = [await workers.start(), await workers.start()]
        chosen: list[str] = []
        for i in range(KILLS):
            point = rng.choice(POINTS)
            chosen.append(point)
            here = tmp_path / f"i{i}"
            here.mkdir()
            context = f"seed {seed}, kill {i + 1} at {point}"
            with AgentsFake(SCRIPT) as fake:
                arg = agent_arg(here, fake, "chat", kill_at=point)
                run = await engine.start("oa-support", f"chaos-{i}", arg)

                def dead() -> list[WorkerProc]:
                    return [w for w in live if not w.alive]

                killed = await wait_until(dead, timeout=30, what=f"the kill ({context})")
                assert Path(arg["killed"]).read_text().split()[0] == point, context
                for w in killed:
                    assert w.proc.returncode == -9, context  # SIGKILL, by its own hook
                    live.remove(w)
                live.append(workers.spawn())  # joins while the other resumes
                assert await run.result(timeout=30) == FINAL, context
                # one request per turn: none again for a journaled response
                assert fake.turns() == [0, 1, 2], context

            ran = collections.Counter(
                (what, key.partition("-")[2])
                for what, key, _ in execution_lines(Path(arg["effects"]))
            )
            assert ran[("lookup:o-1", "c1")] == 1, (context, ran)  # journaled before
            # the calls of the turn the kill cut: once, or once more if it cut them short
            assert set(ran) == {("lookup:o-1", "c1"), ("refund", "c2"), ("lookup:o-2", "c3")}
            assert all(1 <= n <= 2 for n in ran.values()), (context, ran)
            # one key per call: a replay gave a re-run call its step (and key) again
            keys = {key for _, key, _ in execution_lines(Path(arg["effects"]))}
            assert len(keys) == 3, (context, keys)
            # the side effects: once per idempotency key
            store = {p.name.partition("-")[2]: p.read_text() for p in Path(arg["store"]).iterdir()}
            assert store == {
                "c1": "looked up o-1",
                "c2": "refunded 3 on o-1",
                "c3": "looked up o-2",
            }, (context, store)
        assert len(set(chosen)) > 1, chosen
    finally:
        await engine.close()
