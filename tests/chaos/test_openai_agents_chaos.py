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


MODEL_POINTS = tuple(
    f"model:{turn}:{where}" for turn in (1, 2, 3) for where in ("start", "answered", "end")
)


async def test_sigkill_around_and_inside_the_model_steps_on_the_responses_api(
    nats_server: Any, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    """A kill before a model step, inside it (the server's answer read, not committed:
    the one request asked again), and after its commit before the turn's tools (turns
    1, 2 and 3), on the Responses API: every run ends right, only a cut model step is
    asked again, every tool call runs once."""
    seed = int(os.environ.get("FUSEE_CHAOS_SEED") or 13)
    print(f"FUSEE_CHAOS_SEED={seed}")
    points = list(MODEL_POINTS)
    random.Random(seed).shuffle(points)
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        workers = worker_procs(partitions=4)
        workers.module = MODULE
        live: list[WorkerProc] = [await workers.start(), await workers.start()]
        for i, point in enumerate(points):
            here = tmp_path / f"m{i}"
            here.mkdir()
            context = f"seed {seed}, kill {i + 1} at {point}"
            with AgentsFake(SCRIPT) as fake:
                arg = agent_arg(here, fake, "responses", kill_at=point)
                run = await engine.start("oa-support", f"model-chaos-{i}", arg)

                def dead() -> list[WorkerProc]:
                    return [w for w in live if not w.alive]

                killed = await wait_until(dead, timeout=30, what=f"the kill ({context})")
                assert Path(arg["killed"]).read_text().split()[0] == point, context
                for w in killed:
                    assert w.proc.returncode == -9, context
                    live.remove(w)
                live.append(workers.spawn())
                assert await run.result(timeout=30) == FINAL, context
                turn, where = int(point.split(":")[1]), point.split(":")[2]
                # a journaled response is never asked for again; a cut one once more
                again = [turn - 1] if where == "answered" else []
                assert fake.turns() == sorted([0, 1, 2, *again]), context
            ran = collections.Counter(
                (what, key.partition("-")[2])
                for what, key, _ in execution_lines(Path(arg["effects"]))
            )
            assert ran == {
                ("lookup:o-1", "c1"): 1,
                ("refund", "c2"): 1,
                ("lookup:o-2", "c3"): 1,
            }, (context, ran)
    finally:
        await engine.close()
