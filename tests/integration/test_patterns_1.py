"""The agent patterns of ``examples/patterns/`` (issue 13), each run by a worker process
as ``fusee dev`` would run it, offline (each file's model is a ``ScriptedModel``).

One worker serves every pattern of this file (``tests/workers/patterns_1.py``) for the
whole module; each test starts the pattern's workflow in a namespace of the module's and
checks the journal (the step names as the seeds write them) and the result.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

import fusee
from fusee.runtime.objects import object_id
from fusee.runtime.records import RunStarted, StepCompleted
from tests.helpers import cli_env, run_cli
from tests.workers.patterns_1 import FILES, PATTERNS
from tests.workers.procs import HERE, WorkerProc, Workers, journal_calls, started, wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def namespace() -> str:
    """One namespace for the module: its worker serves it (tests use their own run IDs)."""
    return f"t{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
def worker(
    nats_server: Any, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProc]:
    """The worker process serving the patterns, started once for the module."""
    tmp = tmp_path_factory.mktemp("patterns")
    workers = Workers(nats_server.url, namespace, tmp, partitions=4)  # the engine fixture's
    workers.module = HERE / "patterns_1.py"
    try:
        proc = workers.spawn()
        started(proc, "worker.started")
        yield proc
    finally:
        workers.cleanup()


async def run_pattern(
    engine: fusee.Engine, workflow: str, run_id: str, arg: Any
) -> tuple[Any, list[tuple[str, str]]]:
    """Start the pattern's workflow, and return its result and its journal's calls."""
    run = await engine.start(workflow, run_id, arg)
    result = await run.result(timeout=30)
    return result, journal_calls(await run.journal())


async def child_steps(engine: fusee.Engine, run_id: str) -> tuple[str, list[str]]:
    """A child run's workflow and its steps' names."""
    journal = await engine.run(run_id).journal()
    workflow = next(r.workflow for _, r in journal if isinstance(r, RunStarted))
    return workflow, [name for kind, name in journal_calls(journal) if kind == "step"]


async def test_prompt_chaining_is_a_step_per_link(engine: fusee.Engine, worker: Any) -> None:
    result, calls = await run_pattern(engine, "prompt-chaining", "chain-1", "durable steps")
    assert calls == [("step", "outline"), ("step", "draft"), ("step", "edit")]
    assert result == (
        "Each step is journaled: a crash resumes at the running step, nothing runs twice."
    )


async def test_routing_classifies_then_hands_over_to_the_queues_workflow(
    engine: fusee.Engine, worker: Any
) -> None:
    result, calls = await run_pattern(engine, "routing", "route-1", "I was charged twice")
    assert calls == [("step", "route"), ("child", "route-1/handle")]
    assert result == {
        "queue": "billing",
        "reply": "[Billing team] We are on it: I was charged twice",
    }
    assert await child_steps(engine, "route-1/handle") == ("support.billing", ["answer"])
    result, _ = await run_pattern(engine, "routing", "route-2", "The app crashes on login")
    assert result["queue"] == "technical"
    assert await child_steps(engine, "route-2/handle") == ("support.technical", ["answer"])


async def test_parallelization_sections_and_votes(engine: fusee.Engine, worker: Any) -> None:
    text = "I was charged twice and nobody answers my emails."
    result, calls = await run_pattern(engine, "sectioning", "sections-1", text)
    assert calls == [("step", "safety"), ("step", "topic"), ("step", "sentiment")]
    assert result == {"safety": "safe", "topic": "billing", "sentiment": "negative"}

    result, calls = await run_pattern(engine, "voting", "votes-1", "Migrate? Answer yes or no.")
    assert calls == [("step", "vote-1"), ("step", "vote-2"), ("step", "vote-3")]
    assert result == {"answer": "yes", "votes": ["yes", "no", "yes"], "agreed": 2}


async def test_orchestrator_delegates_to_workflow_tools(engine: fusee.Engine, worker: Any) -> None:
    result, calls = await run_pattern(engine, "orchestrator", "orch-1", "cap the retry delay")
    search, pr_run = calls[1][1], calls[3][1]  # <run id>/<call id>-<16 hex>
    assert re.fullmatch(r"orch-1/call_search-[0-9a-f]{16}", search), search
    assert re.fullmatch(r"orch-1/call_pr-[0-9a-f]{16}", pr_run), pr_run
    assert calls == [
        ("step", "orchestrate/turn-0"),
        ("child", search),
        ("step", "orchestrate/turn-1"),
        ("child", pr_run),
        ("step", "orchestrate/turn-2"),
    ]
    assert re.fullmatch(
        r"Done: https://git\.example/pr/\d+ \(fusee/cap-the-retry-delay: Cap the retry delay\)",
        result,
    ), result
    assert await child_steps(engine, search) == ("repo.search", ["grep"])
    assert await child_steps(engine, pr_run) == ("repo.open-pr", ["branch", "open"])
    pr = await engine.run(pr_run).result(timeout=5)
    assert result == f"Done: {pr}"  # the worker's result is what the model was given


async def test_evaluator_optimizer_reasks_and_loops_until_the_judge_is_satisfied(
    engine: fusee.Engine, worker: Any
) -> None:
    doc = "fusee journals every step. " * 10  # 40 words and more: the first answer is too long
    result, calls = await run_pattern(engine, "evaluator-reask", "reask-1", doc)
    assert calls == [("step", "summary"), ("step", "summary#reask-1")]
    assert result == "fusee journals each step in NATS; after a crash, a replay resumes it."

    result, calls = await run_pattern(engine, "evaluator-loop", "refine-1", "fusee")
    assert calls == [
        (kind, f"refine/{what}-{i}" + ("-critique" if what == "tool" else ""))
        for i in range(3)
        for kind, what in (("step", "turn"), ("step", "tool"))
    ]
    assert result == {"tagline": "Crash-proof steps, journaled.", "rounds": 3, "stopped": True}


async def test_the_agent_loop_of_the_seed_names_its_steps_by_turn(
    engine: fusee.Engine, worker: Any
) -> None:
    result, calls = await run_pattern(engine, "agent", "agent-1", "Where is 1042?")
    assert calls == [
        ("step", "model-0"),
        ("step", "tool-0-lookup_order"),
        ("step", "model-1"),
        ("step", "tool-1-add_note"),
        ("step", "model-2"),
    ]
    assert result == "Order 1042 has shipped with DHL."


async def test_sessions_keep_one_conversation_per_key(engine: fusee.Engine, worker: Any) -> None:
    seven = fusee.ObjectKey("chat", "user-7", engine=engine)
    first = await seven.send("say", "Where is my order?")
    second = await seven.send("say", "It is order 1042.")
    other = await fusee.ObjectKey("chat", "user-8", engine=engine).call("say", "Hello")
    assert other == "You said 'Hello' (message 1 of this conversation)."
    assert await seven.result(first, timeout=30) == (
        "You said 'Where is my order?' (message 1 of this conversation)."
    )
    reply = "You said 'It is order 1042.' (message 2 of this conversation)."
    assert await seven.result(second, timeout=30) == reply
    # the reply's tokens are a stream of the turn, readable after it ended
    assert "".join([t async for t in seven.stream(second, "reply")]) == reply
    history = (await seven.state())["history"]
    assert [(m["role"], m["content"][:8]) for m in history] == [
        ("user", "Where is"),
        ("assistant", "You said"),
        ("user", "It is or"),
        ("assistant", "You said"),
    ]
    journal = await fusee.Run(engine, object_id("chat", "user-7")).journal()
    assert [r.name for _, r in journal if isinstance(r, StepCompleted)] == ["reply", "reply"]


async def _asked(worker: WorkerProc, order: str) -> str:
    """The completion token the pattern's stand-in Slack was given for ``order``."""
    pattern = re.compile(rf"\[slack\] Refund 40 EUR on order {order}\? \S+/v1/completions/(\S+)")

    def posted() -> str | None:
        found = pattern.search(worker.log_path.read_text(errors="replace"))
        return found.group(1) if found else None

    token: str = await wait_until(posted, timeout=30, what=f"the approval of order {order}")
    return token


async def test_approval_runs_the_tool_once_approved_and_tells_the_model_a_refusal(
    engine: fusee.Engine, worker: Any
) -> None:
    approved = await engine.start("approval", "approve-1", "Damaged parcel, 2001")
    refused = await engine.start("approval", "refuse-1", "Damaged parcel, 2002")
    assert await engine.complete(await _asked(worker, "2001"), True)
    refusal = {"approved": False, "reason": "over 30 EUR"}
    assert await engine.complete(await _asked(worker, "2002"), refusal)

    assert await approved.result(timeout=30) == "About your refund: refunded 40 EUR on order 2001."
    assert journal_calls(await approved.journal()) == [
        ("step", "agent/turn-0"),
        ("completion", "agent/approve-0-refund"),
        ("step", "ask/agent/approve-0-refund"),
        ("step", "agent/tool-0-refund"),
        ("step", "agent/turn-1"),
    ]
    assert await refused.result(timeout=30) == (
        "About your refund: the call was not approved, so it did not run: over 30 EUR."
    )
    assert journal_calls(await refused.journal()) == [  # the tool did not run
        ("step", "agent/turn-0"),
        ("completion", "agent/approve-0-refund"),
        ("step", "ask/agent/approve-0-refund"),
        ("step", "agent/turn-1"),
    ]


@pytest.mark.parametrize("stem", FILES)
async def test_fusee_dev_runs_the_pattern_file_offline(stem: str, nats_server: Any) -> None:
    """What the README says: ``fusee dev examples/patterns/<file>.py`` runs its ``main``,
    offline, and exits 0 (each ``main`` prints its results; all but the session's, the
    journals). On the session's server, in a namespace of its own."""
    env = {k: v for k, v in cli_env().items() if not k.startswith("OPENAI_")}
    path = str(PATTERNS / f"{stem}.py")
    ns = f"t{secrets.token_hex(4)}"
    done = await run_cli("dev", path, "--nats", nats_server.url, "--namespace", ns, env=env)
    assert done.returncode == 0, done.stderr
    if stem != "sessions":
        assert " run.completed " in done.stdout, done.stdout
        return
    # run again on the same store: its chats start over, under keys of their own
    again = await run_cli("dev", path, "--nats", nats_server.url, "--namespace", ns, env=env)
    assert again.returncode == 0, again.stderr
    shown = []
    for out in (done.stdout, again.stdout):
        assert "user-7's history holds 4 messages" in out, out
        assert "(message 1 of this conversation)" in out, out
        (key,) = re.findall(r"objects show chat (user-7-\S+)", out)
        shown.append(key)
    assert shown[0] != shown[1]
    async with await fusee.connect(nats_server.url, namespace=ns) as engine:
        held = await fusee.ObjectKey("chat", shown[1], engine=engine).state()
    assert len(held["history"]) == 4  # the hint names the chat the run held
