"""SIGKILL the worker in the middle of a Pydantic AI agent (issue 14), 20 times, at points
a seeded RNG picks (``FUSEE_CHAOS_SEED``, default 13) among the hooks of the agent's two
tools (``tests/workers/pydantic_agents.py``: before or after each side effect), the
point right after the second model response came back journaled, and inside a model
step: the fake server SIGKILLs the worker whose request of turn ``t`` just arrived
(``request:<t>``, nothing answered yet) or whose streamed final answer it has sent two
tokens of (``stream:2``, a ``run_stream`` run; ``AgentFake.kill_at``). Two workers run
at a time; the one killed dies, the other takes over, and a new one is spawned while it
does.

Every run ends with the right output; the fake model server is asked once per turn (no
journaled response is asked for again; a request a kill cut short once more); each tool's side effect is applied once per
tool-call ID (its key, ``<step key>-<call id>``), executed at most twice (once more when
the kill cut it short after the effect).
"""

from __future__ import annotations

import collections
import os
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

import fusee
from fusee.runtime.records import StepCompleted
from tests.e2e.test_pydantic_ai_worker import FINAL, NAMES, deps, script
from tests.fakes.agent_openai import AgentFake
from tests.helpers import split_attempts
from tests.workers.procs import HERE, WorkerProc, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]  # 140 s seen at load 12

AGENTS = HERE / "pydantic_agents.py"
KILLS = 20
POINTS = (
    "lookup_order:before",
    "lookup_order:after",
    "model:refund",
    "refund:before",
    "refund:after",
    "request:0",
    "request:1",
    "request:2",
    "stream:2",
)
STREAM_NAMES = [n.replace("model.request", "model.request_stream") for n in NAMES]


async def test_sigkill_mid_agent(
    nats_server: Any, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    seed = int(os.environ.get("FUSEE_CHAOS_SEED") or 13)
    rng = random.Random(seed)
    print(f"FUSEE_CHAOS_SEED={seed}")
    with AgentFake(script, delay=0.0) as fake:
        env = {"FUSEE_TEST_OPENAI_URL": fake.base_url}
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
                arg = deps(here, f"refund o-1 (run {i})", kill_at=point)
                server_kill = point.startswith(("request:", "stream:"))
                cut_turn = int(point.split(":")[1]) if server_kill else None
                if cut_turn is not None:  # the fake server kills the worker in the step
                    arg["stream"] = point.startswith("stream:")
                    at = 0 if point.startswith("request:") else 2
                    fake.kill_at[(arg["prompt"], cut_turn)] = at
                context = f"seed {seed}, kill {i + 1} at {point}"
                run = await engine.start("pyd_support", f"chaos-{i}", arg)

                def dead() -> list[WorkerProc]:
                    return [w for w in live if not w.alive]

                killed = await wait_until(dead, timeout=30, what=f"the kill ({context})")
                if server_kill:
                    assert [k[:2] for k in fake.killed] == [(arg["prompt"], cut_turn)], context
                    fake.killed.clear()
                else:
                    assert Path(arg["killed"]).read_text().split()[0] == point, context
                for w in killed:
                    assert w.proc.returncode == -9, context
                    live.remove(w)
                live.append(workers.spawn(extra_env=env))

                assert await run.result(timeout=30) == FINAL, context
                names = [r.name for _, r in await run.journal() if isinstance(r, StepCompleted)]
                assert names == (STREAM_NAMES if arg.get("stream") else NAMES), context
                # the model: once per turn, none again for a journaled response (the
                # request the kill cut short once more)
                asked = [fake.asked[(arg["prompt"], t)] for t in range(3)]
                assert asked == [1 + (t == cut_turn) for t in range(3)], (context, asked)
                if arg.get("stream"):
                    # the killed attempt's text is dropped at the reset marker
                    events = [e async for e in run.stream_events(STREAM_NAMES[-1] + "/2")]
                    last = split_attempts(events)[-1]
                    assert "".join(e.text for e in last if e.kind == "token") == FINAL, context
                # side effects: once per key, whose tool-call ID is the key's tail
                store = {
                    p.name.rsplit("-", 1)[-1]: p.read_text() for p in Path(arg["store"]).iterdir()
                }
                assert store == {"c1": "looked up o-1", "c2": "refunded o-1 30"}, (context, store)
                lines = Path(arg["effects"]).read_text().split("\n")
                ran = collections.Counter(tuple(line.split()) for line in lines if line)
                assert all(1 <= n <= 2 for n in ran.values()), (context, ran)
                # the tool journaled before the kill ran once
                if point.startswith(("refund", "model", "request:1", "request:2", "stream")):
                    assert [n for (t, _), n in ran.items() if t == "lookup_order"] == [1], ran
            assert len(set(chosen)) > 1, chosen
            assert {p.split(":")[0] for p in chosen} >= {"request", "stream"}, chosen
        finally:
            await engine.close()
