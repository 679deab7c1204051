"""The agent patterns of ``examples/patterns/`` (issue 13, part 2), each run by one
``fusee worker`` process serving every pattern file, as a user would serve them.

Each test does what the example's ``main`` does, through its own engine, and checks the
journal (the step names the seed shows) and the result: interrupt and regenerate,
parallel tool calls, racing models, a workflow as a tool, notify when ready, undo on
failure, long conversations, rate and cost limits, when the provider is down.
"""

from __future__ import annotations

import importlib.util
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import msgspec
import pytest

import fusee
from fusee.runtime.records import (
    CallCancelled,
    RunCancelled,
    RunCompleted,
    RunContinued,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    StepCompleted,
    StepRetrying,
)
from tests.helpers import cli_env, permit_requests, run_cli
from tests.workers.patterns_1 import PATTERNS
from tests.workers.patterns_2 import FILES, HELD_AFTER, asked, gate_open
from tests.workers.procs import HERE, Workers, journal_calls, started, wait_until

pytestmark = pytest.mark.timeout(60)

Journal = list[tuple[int, Any]]


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the test opens the gates of the served worker's held models."""
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def served(nats_server: Any, gate: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The worker process serving every pattern file (``tests/workers/patterns_2.py``),
    in a namespace of its own, its models held at the gates; yields the namespace."""
    namespace = f"t{secrets.token_hex(4)}"
    workers = Workers(nats_server.url, namespace, tmp_path_factory.mktemp("patterns-2"))
    workers.module = HERE / "patterns_2.py"
    try:
        started(workers.spawn(extra_env={"PATTERNS_GATE": str(gate)}), "worker.started")
        yield namespace
    finally:
        workers.cleanup()


@pytest.fixture
async def engine(nats_server: Any, served: str) -> AsyncIterator[fusee.Engine]:
    async with await fusee.connect(nats_server.url, namespace=served) as e:
        yield e


def decoded(raw: msgspec.Raw) -> Any:
    return msgspec.json.decode(raw)


def records(journal: Journal, kind: type, name: str | None = None) -> list[Any]:
    return [r for _, r in journal if isinstance(r, kind) and getattr(r, "name", name) == name]


def generations(journal: Journal) -> list[Journal]:
    """The journal cut at each ``run.continued`` (a generation's positions count from 1)."""
    out: list[Journal] = [[]]
    for seq, r in journal:
        if isinstance(r, RunContinued):
            out.append([])
        out[-1].append((seq, r))
    return out


def example(stem: str) -> ModuleType:
    """An example file imported as a module of its own (to reuse a class it defines)."""
    spec = importlib.util.spec_from_file_location(f"pattern_{stem}", PATTERNS / f"{stem}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_interrupt_then_regenerate_from_the_stopped_run(
    engine: fusee.Engine, gate: Path
) -> None:
    history = [{"role": "user", "content": "When does my refund arrive?"}]
    first = await engine.start("chat-turn", "chat-7/turn-3", history)
    seen = []
    async for token in first.stream("model"):  # the user reads the first words...
        seen.append(token)
        if len(seen) == HELD_AFTER:
            break
    assert "".join(seen) == "Refunds are"
    await first.cancel("interrupted")  # ...and presses stop, the model held at its third
    with pytest.raises(fusee.RunCancelled, match="interrupted"):
        await first.result(timeout=20)
    stopped = await first.journal()
    assert journal_calls(stopped) == [("step", "search")]  # the model call has no outcome
    assert isinstance(stopped[-1][1], RunCancelled)

    gate_open(gate, "interrupt")  # the model may answer in full now
    again = await engine.start("chat-turn", "chat-7/turn-3b", history, from_run="chat-7/turn-3")
    answer = await again.result(timeout=20)
    text = "Refunds are paid back within 3 days to the card that paid."
    assert answer == f"{text} Your refund should arrive by Friday."
    assert "".join([t async for t in again.stream("model")]) == answer
    journal = await again.journal()
    assert journal[0][1].from_run == "chat-7/turn-3"
    assert journal_calls(journal) == [("step", "search"), ("step", "model")]
    # the search is the stopped run's record, copied: not run again
    (old,), (new,) = (
        records(stopped, StepCompleted, "search"),
        records(journal, StepCompleted, "search"),
    )
    assert decoded(new.result) == decoded(old.result) == text
    assert new.duration_ms == old.duration_ms


async def test_parallel_tool_calls_each_a_step_and_a_retry_repeats_one(
    engine: fusee.Engine,
) -> None:
    answer = "Lisbon will be sunny (24 C); LH 1234 leaves on June 1st for 129 EUR."
    run = await engine.start("trip", "trip-1", "Lisbon")
    assert await run.result(timeout=20) == answer
    journal = await run.journal()
    assert journal_calls(journal) == [
        ("step", "tool:weather"),
        ("step", "tool:flights"),
        ("step", "model"),
    ]
    # the flaky flights call was retried alone: the weather call ran once
    assert [r.attempt for r in records(journal, StepRetrying, "tool:flights")] == [1]
    assert [r.attempt for r in records(journal, StepCompleted, "tool:flights")] == [2]
    assert len(records(journal, StepCompleted, "tool:weather")) == 1
    assert decoded(records(journal, StepCompleted, "tool:weather")[0].result)["forecast"] == "sunny"

    agent = await engine.start("trip-agent", "trip-agent-1", "A weekend in Lisbon on June 1st?")
    assert await agent.result(timeout=20) == answer
    journal = await agent.journal()
    assert journal_calls(journal) == [
        ("step", "agent/turn-0"),
        ("step", "agent/tool-0-weather"),  # both calls of turn 0, at once
        ("step", "agent/tool-0-flights"),
        ("step", "agent/turn-1"),
    ]
    assert [r.attempt for r in records(journal, StepRetrying, "agent/tool-0-flights")] == [1]
    turn = decoded(records(journal, StepCompleted, "agent/turn-0")[0].result)
    assert [c["name"] for c in turn["tool_calls"]] == ["weather", "flights"]


async def test_racing_models_the_first_answer_wins_and_the_other_is_cancelled(
    engine: fusee.Engine,
) -> None:
    run = await engine.start("race-answer", "race-1", "Capital of France?")
    assert await run.result(timeout=20) == {"model": "fast", "text": "Paris."}
    journal = await run.journal()
    assert journal_calls(journal) == [("step", "model:fast"), ("cancelled", "model:large")]
    (lost,) = records(journal, CallCancelled, "model:large")
    assert "lost ctx.race to 'model:fast'" in lost.reason


async def test_a_workflow_tool_is_a_child_run_named_by_the_tool_call(
    engine: fusee.Engine,
) -> None:
    run = await engine.start("research-agent", "ask-1", "What is durable execution?")
    summary = (
        "In short: A durable step's result is saved before the next step runs. "
        "After a crash, the run is replayed from its journal."
    )
    assert await run.result(timeout=20) == f"Here is what I found. {summary}"
    calls = journal_calls(await run.journal())
    assert re.fullmatch(r"ask-1/call_research_1-[0-9a-f]{16}", calls[1][1]), calls
    assert calls == [
        ("step", "agent/turn-0"),
        ("child", calls[1][1]),
        ("step", "agent/turn-1"),
    ]
    child = engine.run(calls[1][1])
    assert await child.result(timeout=10) == {
        "topic": "durable execution",
        "sources": 2,
        "summary": summary,
    }
    journal = await child.journal()
    assert journal_calls(journal) == [("step", "search"), ("step", "read"), ("step", "summarize")]
    started = records(journal, RunStarted)
    assert [(r.workflow, r.parent, decoded(r.input)) for r in started] == [
        ("research-topic", "ask-1", {"topic": "durable execution"})
    ]


async def test_notify_when_ready_posts_once_per_key_after_the_child(
    engine: fusee.Engine,
) -> None:
    receiver = example("notify_when_ready").Receiver()  # 503 first, then 200
    try:
        run = await engine.start(
            "notify-report", "report-1", {"topic": "our suppliers", "webhook": receiver.url}
        )
        report = await run.result(timeout=20)
    finally:
        receiver.close()
    assert report == (
        "Report on our suppliers: three suppliers, two of them late; order from the third."
    )
    # the retry after the 503 carried the same Idempotency-Key: a receiver deduping on
    # it acts once
    assert [body for _, body in receiver.deliveries] == [{"id": "report-1", "report": report}] * 2
    keys = {key for key, _ in receiver.deliveries}
    assert len(keys) == 1
    assert len(keys.pop()) == 32  # the step's key
    journal = await run.journal()
    assert journal_calls(journal) == [("child", "report-1/research"), ("step", "notify")]
    assert [r.attempt for r in records(journal, StepRetrying, "notify")] == [1]
    assert decoded(records(journal, StepCompleted, "notify")[0].result) == 200
    assert await engine.run("report-1/research").result(timeout=5) == report


async def test_undo_on_failure_runs_the_compensations_newest_first(
    engine: fusee.Engine,
) -> None:
    ok = await engine.start("book-trip", "trip-lisbon", "Three nights in Lisbon")
    booked = await ok.result(timeout=20)
    assert sorted(booked) == ["car", "hotel", "ticket"]
    assert [n for _, n in journal_calls(await ok.journal())] == [
        "model:plan",
        "tool:book-hotel",
        "tool:rent-car",
        "tool:buy-ticket",
    ]  # completed: nothing undone

    run = await engine.start("book-trip", "trip-atlantis", "Three nights in Atlantis")
    with pytest.raises(fusee.RunFailed) as failed:
        await run.result(timeout=20)
    assert (failed.value.error_type, failed.value.message) == (
        "undo_on_failure.SoldOut",
        "flight LH 99 is sold out",
    )
    journal = await run.journal()
    assert [n for _, n in journal_calls(journal)] == [
        "model:plan",
        "tool:book-hotel",
        "tool:rent-car",
        "tool:buy-ticket",
        "compensate:tool:cancel-car",
        "compensate:tool:cancel-hotel",
    ]
    hotel, car = (
        decoded(records(journal, StepCompleted, n)[0].result)
        for n in ("tool:book-hotel", "tool:rent-car")
    )
    undone = [
        decoded(records(journal, StepCompleted, f"compensate:tool:cancel-{n}")[0].result)
        for n in ("car", "hotel")
    ]
    assert undone == [f"cancelled {car}", f"cancelled {hotel}"]
    # each booking is named by its step's whole key (one booking per key)
    assert [hotel[:2], len(hotel), car[:2], len(car)] == ["H-", 34, "C-", 34]
    assert isinstance(journal[-1][1], RunFailed)
    assert journal[-1][1].step == "tool:buy-ticket"


async def test_a_long_conversation_continues_as_new_with_its_summary(
    engine: fusee.Engine,
) -> None:
    run = await engine.start("long-chat", "chat-long-1", {})
    for i in range(1, 8):
        await run.signal("message", f"question {i}")
    await run.signal("message", "bye")
    asked = "The user asked about: " + "; ".join(f"question {i}" for i in range(1, 7))
    assert await run.result(timeout=20) == {"turns": 7, "summary": asked}

    journal = await run.journal()
    gens = generations(journal)
    steps = [[n for kind, n in journal_calls(g) if kind == "step"] for g in gens]
    assert steps == [
        ["turn-0", "turn-1", "turn-2", "summarize"],
        ["turn-3", "turn-4", "turn-5", "summarize"],
        ["turn-6"],
    ]
    continued = records(journal, RunContinued)
    assert [(r.generation, decoded(r.input)) for r in continued] == [
        (2, {"summary": "The user asked about: question 1; question 2; question 3", "turn": 3}),
        (3, {"summary": asked, "turn": 6}),
    ]
    # a new generation's model sees the summary and its own turns, not the whole chat
    last = decoded(records(gens[2], StepCompleted, "turn-6")[0].result)
    assert last["text"] == "(2 messages in my context) Noted: question 7"
    assert all(len(g) <= 12 for g in gens)
    info = await run.describe()
    assert (info.status, info.generation) == ("completed", 3)


async def test_rate_and_cost_limits(engine: fusee.Engine) -> None:
    # the turns ask for a permit of "openai": with no such limit set, they fail
    early = await engine.start("limited-agent", "limited-early", {"tenant": "A", "question": "q"})
    with pytest.raises(fusee.RunFailed) as unknown:
        await early.result(timeout=20)
    assert unknown.value.error_type == "fusee.UnknownLimit"

    await engine.limit("openai", per_second=50, concurrent=2)
    asks = [{"tenant": t, "question": f"question {i} of {t}"} for i in range(2) for t in "AB"]
    runs = [
        await engine.start("limited-agent", f"limited-{i}", ask, timeout="15m")
        for i, ask in enumerate(asks)
    ]
    for run, ask in zip(runs, asks, strict=True):
        q = ask["question"]
        assert await run.result(timeout=20) == f"Answer to {q!r}: 3 pages about {q} (1)"
        assert journal_calls(await run.journal()) == [
            ("step", "agent/turn-0"),
            ("step", "agent/tool-0-search"),
            ("step", "agent/turn-1"),
        ]
    (info,) = [i for i in await engine.limits() if i.name == "openai"]
    assert (info.per_second, info.concurrent, info.holders, info.waiters) == (50, 2, 0, {})

    # an agent that never stops calling tools is stopped by the workflow's step budget
    runaway = await engine.start(
        "limited-agent", "limited-runaway", {"tenant": "A", "question": "research forever"}
    )
    with pytest.raises(fusee.RunFailed) as budget:
        await runaway.result(timeout=20)
    assert budget.value.error_type == "fusee.StepBudgetExceeded"
    assert "'agent/turn-6' would be step 13" in budget.value.message
    assert "max_steps=12" in budget.value.message
    names = [n for _, n in journal_calls(await runaway.journal())]
    assert len(names) == 12
    assert names[:3] == ["agent/turn-0", "agent/tool-0-search", "agent/turn-1"]


async def test_rate_limits_serve_tenants_in_turn(engine: fusee.Engine, gate: Path) -> None:
    """Under ``concurrent=1``, tenant A's first run holds the permit (its model held at
    the gate) while A's second and third and then B's first queue at the limit; once
    it lets go, ``fairness_key=`` the tenant serves B before A's third (first come,
    first served would not). After the rate test: it sets the limit that one expects
    unset."""
    await engine.limit("openai", concurrent=1)
    before = len(asked(gate))  # the questions of the tests before
    ask = {"tenant": "A", "question": "hold: question 1 of A"}
    runs = [await engine.start("limited-agent", "fair-a1", ask)]
    await wait_until(lambda: asked(gate)[before:], timeout=20, what="A's first turn")
    for run_id, tenant, question in [
        ("fair-a2", "A", "question 2 of A"),
        ("fair-a3", "A", "question 3 of A"),
        ("fair-b1", "B", "question 1 of B"),
    ]:
        runs.append(
            await engine.start("limited-agent", run_id, {"tenant": tenant, "question": question})
        )

        async def queued(run_id: str = run_id) -> bool:
            return any(m.run == run_id for m in await permit_requests(engine, "openai"))

        await wait_until(queued, timeout=20, what=f"{run_id}'s permit request at the limit")
    assert asked(gate)[before:] == [ask["question"]]  # the others wait for the permit
    gate_open(gate, "limits")
    for run in runs:
        assert (await run.result(timeout=20)).startswith("Answer to ")
    first_asked = list(dict.fromkeys(asked(gate)[before:]))  # each one's first turn, in order
    assert first_asked.index("question 1 of B") < first_asked.index("question 3 of A"), first_asked


async def test_when_the_provider_is_down_the_run_pauses_then_resumes(
    engine: fusee.Engine,
) -> None:
    run = await engine.start("steady-support", "support-down-1", "Where is 1042?")

    async def paused() -> Any:  # listed paused: what bulk_resume reads (the index)
        return await engine.list_runs(status="paused", workflow="steady-support")

    (listed,) = await wait_until(paused, timeout=20, what="the run to be listed paused")
    info = await run.describe()
    assert (listed.run_id, listed.step, info.status) == ("support-down-1", "model", "paused")
    assert (info.step, info.attempts, info.error_type) == ("model", 3, "ConnectionError")
    assert info.message == "api.example.com: 503 Service Unavailable"
    journal = await run.journal()
    assert [r.attempt for r in records(journal, StepRetrying, "model")] == [1, 2]
    assert isinstance(journal[-1][1], RunPaused)

    summary = await engine.bulk_resume(workflow="steady-support", status="paused")
    assert (summary.done, summary.failed) == (1, {})
    assert await run.result(timeout=20) == "Your order 1042 ships on Thursday."
    journal = await run.journal()
    assert journal_calls(journal) == [("step", "tool:lookup_order"), ("step", "model")]
    assert len(records(journal, StepCompleted, "tool:lookup_order")) == 1  # not done again
    assert [r.attempt for r in records(journal, StepCompleted, "model")] == [4]
    kinds = [type(r) for _, r in journal]
    assert kinds.index(RunPaused) < kinds.index(RunResumed) < kinds.index(RunCompleted)


MAINS = {
    "interrupt_regenerate": "regenerate -> Refunds are paid back within 3 days",
    "parallel_tools": "trip-agent: Lisbon will be sunny (24 C)",
    "racing_models": "{'model': 'fast', 'text': 'Paris.'}",
    "workflow_tool": "Here is what I found. In short: A durable step's result",
    "notify_when_ready": "2 deliveries, 1 key: notified once",
    "undo_on_failure": "Atlantis: failed, undo_on_failure.SoldOut: flight LH 99 is sold out",
    "long_conversations": "3 generations under the one run ID",
    "rate_limits": "runaway: fusee.StepBudgetExceeded",
    "provider_down": "-> Your order 1042 ships on Thursday.",
}


async def test_fusee_dev_runs_each_pattern_file_offline(nats_server: Any) -> None:
    """What the README says: ``fusee dev examples/patterns/<file>.py`` runs its ``main``,
    offline, and exits 0, printing its answer. As ``test_patterns_1`` does, a subprocess
    a file on the session's server in a namespace each (a fresh process: the provider
    of ``provider_down.py`` is down for its first requests); three at a time, so the
    nine take about a third of their time one after the other."""
    assert sorted(MAINS) == sorted(FILES)
    env = {k: v for k, v in cli_env().items() if not k.startswith("OPENAI_")}
    failed: dict[str, str] = {}
    limiter = anyio.CapacityLimiter(3)

    async def dev(stem: str) -> None:
        ns = f"t{secrets.token_hex(4)}"
        async with limiter:
            done = await run_cli(
                "dev",
                str(PATTERNS / f"{stem}.py"),
                "--nats",
                nats_server.url,
                "--namespace",
                ns,
                env=env,
                timeout=45,
            )
        if done.returncode != 0 or MAINS[stem] not in done.stdout:
            failed[stem] = f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-2000:]}"

    async with anyio.create_task_group() as tg:
        for stem in FILES:
            tg.start_soon(dev, stem)
    assert not failed, "\n\n".join(f"{stem}: {why}" for stem, why in failed.items())
