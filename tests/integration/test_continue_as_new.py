"""continue_as_new: a long conversation keeps its run ID and starts a fresh, short
history (a new generation) with a summary, as often as it needs to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import fusee
from fusee.runtime.records import RunCompleted as RunCompletedRecord
from fusee.runtime.records import RunContinued, RunStarted, StepCompleted, decode_record
from tests.workers import conversation
from tests.workers.procs import wait_until

TURNS = ["hi", "book-a-flight", "to-lisbon", "friday", "window-seat", "thanks", "bye"]
SUMMARY = "".join(f"|{t}>{t.upper()}" for t in TURNS)


def chat_input(log: Path, **extra: Any) -> dict[str, Any]:
    return {"log": str(log), "turns": TURNS, "limit": 3, **extra}


def calls(log: Path) -> list[tuple[str, str]]:
    """``(call, s.key)`` of every model call that returned, in order."""
    if not log.exists():
        return []
    return [(line.split()[0], line.split()[1]) for line in log.read_text().splitlines()]


async def test_a_long_conversation_continues_as_new_and_completes(
    engine: fusee.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.log"
    run = await engine.start(conversation.long_chat, "chat-long", chat_input(log))
    got: dict[str, Any] = {}
    # result() reads the journal's last record, then follows the journal from it: the
    # worker starts only once that read is done, so the waiter follows the whole chain
    asked = anyio.Event()
    first_read: list[Any] = []
    last_in_journal = engine.store.last_in_journal

    async def spied(eid: str) -> Any:
        found = await last_in_journal(eid)
        if eid == run.eid and not asked.is_set():
            first_read.append(found)
            asked.set()
        return found

    monkeypatch.setattr(engine.store, "last_in_journal", spied)

    async def wait_result() -> None:
        got["result"] = await run.result(timeout=30)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_result)  # asked before any generation ran: follows the chain
        with anyio.move_on_after(10):
            await asked.wait()
        if not asked.is_set():
            pytest.fail("run.result() no longer begins with store.last_in_journal: re-aim this")
        assert isinstance(decode_record(first_read[0].data), RunStarted)  # nothing ran yet
        async with engine.worker():
            with anyio.fail_after(30):
                while "result" not in got:
                    await anyio.sleep(0.05)
    assert got["result"] == {"summary": SUMMARY, "turns": 7}
    # one call per turn, in order, each once; each generation's steps get new keys
    assert [c for c, _ in calls(log)] == [f"model:{t}" for t in TURNS]
    assert len({k for _, k in calls(log)}) == 7
    journal = [r for _, r in await run.journal()]
    kinds = [type(r).__name__ for r in journal]
    # 3 turns per generation (journal_size: run.started + 3 steps > 3), then the rest
    assert kinds == [
        "RunStarted",
        *["StepCompleted"] * 3,
        "RunContinued",
        *["StepCompleted"] * 3,
        "RunContinued",
        "StepCompleted",
        "RunCompleted",
    ]
    continued = [r for r in journal if isinstance(r, RunContinued)]
    assert [c.generation for c in continued] == [2, 3]
    first = journal[0]
    assert isinstance(first, RunStarted)
    assert all(c.started_at == first.started_at for c in continued)
    assert msgspec.json.decode(bytes(continued[0].input)) == {
        **chat_input(log),
        "summary": "".join(f"|{t}>{t.upper()}" for t in TURNS[:3]),
        "done": 3,
    }
    # each generation's steps start again at position 1
    assert [r.pos for r in journal if isinstance(r, StepCompleted)] == [1, 2, 3, 1, 2, 3, 1]
    assert isinstance(journal[-1], RunCompletedRecord)
    info = await run.describe()
    assert (info.status, info.generation, info.steps) == ("completed", 3, 1)
    # asked after the end, and started again by ID: the same run, the same result
    assert await engine.run("chat-long").result(timeout=5) == got["result"]
    again = await engine.start(conversation.long_chat, "chat-long", chat_input(log))
    assert await again.result(timeout=5) == got["result"]


async def test_a_short_conversation_continues_once(engine: fusee.Engine, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    async with engine.worker():
        run = await engine.start(
            conversation.long_chat, "chat-fails", chat_input(log, turns=["a", "b", "c", "d"])
        )
        assert await run.result(timeout=30) == {
            "summary": "|a>A|b>B|c>C|d>D",
            "turns": 4,
        }
    info = await run.describe()
    assert info.generation == 2


async def test_a_crash_across_the_continue_resumes_the_next_generation(
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs()
    workers.module = Path(conversation.__file__)
    first = await workers.start()
    log = tmp_path / "calls.log"
    release = tmp_path / "release"  # the second generation's first call waits for it
    arg = chat_input(log, delay=0.05, hold={"turn": 3, "until": str(release)})
    run = await engine.start("long_chat", "chat-crash", arg)

    async def continued() -> bool:
        return any(isinstance(r, RunContinued) for _, r in await run.journal())

    await wait_until(continued, timeout=30, what="the first run.continued")
    # its log line too, before the kill: the line is written after the commit returns
    # (and an info line up to two loop turns later), and a SIGKILL loses what waits
    await first.wait_for("run.continued", run_id="chat-crash", timeout=10)
    first.kill()  # inside the second generation, before its first model call returned
    assert [c for c, _ in calls(log)] == [f"model:{t}" for t in TURNS[:3]]
    release.touch()
    second = await workers.start()
    result = await run.result(timeout=60)
    assert result == {"summary": SUMMARY, "turns": 7}
    # nothing finished ran again: one returned call per turn
    assert [c for c, _ in calls(log)] == [f"model:{t}" for t in TURNS]
    await second.wait_for("run.completed", run_id="chat-crash", timeout=10)


async def test_continue_as_new_inside_a_step_is_refused(engine: fusee.Engine) -> None:
    @fusee.workflow("can_in_step")
    async def bad(ctx: fusee.Context) -> None:
        await ctx.step("inner", lambda: ctx.continue_as_new(1))

    async with engine.worker():
        run = await engine.start(bad, "can-in-step")
        with pytest.raises(fusee.RunFailed, match="inside step"):
            await run.result(timeout=20)
