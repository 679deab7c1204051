"""Interrupt and regenerate: the user pressed "stop", then "regenerate". The turn is
cancelled mid model call, and a new run starts from its history
(``engine.start(..., from_run=)``): what finished is reused, not run again."""

from __future__ import annotations

import collections
import time
from datetime import UTC, datetime
from typing import Any

import anyio
import msgspec
import pytest

import fusee
from fusee.runtime.codec import canonical
from fusee.runtime.history import History
from fusee.runtime.ids import escape, partition_of
from fusee.runtime.records import (
    RunCancelled,
    RunResumed,
    RunStarted,
    StepCompleted,
    encode_record,
    kind_of,
)
from tests.workers.procs import wait_until

effects: collections.Counter[str] = collections.Counter()
release = {"model": False}
HISTORY = [{"role": "user", "content": "Plan a weekend in Lisbon"}]


@fusee.workflow("regen_turn")
async def turn(ctx: fusee.Context, history: list[dict[str, str]]) -> dict[str, Any]:
    def search() -> list[str]:
        effects["tool:search"] += 1
        return ["tram 28", "pasteis"]

    docs = await ctx.step("tool:search", search)
    asked_at = ctx.now().isoformat()

    def plan() -> str:
        effects["tool:plan"] += 1
        return "day 1, day 2"

    outline = await ctx.step("tool:plan", plan)

    async def model(s: fusee.StepInfo) -> str:
        effects["model"] += 1
        while not release["model"]:
            await anyio.sleep(0.02)  # a slow model call; a cancel stops it here
        return f"{outline} with {', '.join(docs)}"

    answer = await ctx.step("model", model)
    return {"answer": answer, "asked_at": asked_at, "turns": len(history)}


@pytest.fixture(autouse=True)
def _reset() -> None:
    effects.clear()
    release["model"] = False


async def _interrupted(engine: fusee.Engine, run_id: str) -> fusee.Run:
    run = await engine.start(turn, run_id, HISTORY)
    await wait_until(lambda: effects["model"] >= 1, timeout=20, what="the model call")
    assert await engine.run(run_id).cancel("interrupted") is True
    with pytest.raises(fusee.RunCancelled, match="interrupted"):
        await run.result(timeout=20)
    return run


async def test_regenerate_reuses_what_finished_and_runs_the_rest(engine: fusee.Engine) -> None:
    async with engine.worker():
        old = await _interrupted(engine, "chat-7/turn-3")
        release["model"] = True
        new = await engine.start(turn, "chat-7/turn-3b", HISTORY, from_run="chat-7/turn-3")
        result = await new.result(timeout=20)
    assert result["answer"] == "day 1, day 2 with tram 28, pasteis"
    # the tools ran once (in the old run); the interrupted model call ran again
    assert effects == {"tool:search": 1, "tool:plan": 1, "model": 2}
    old_journal = [r for _, r in await old.journal()]
    new_journal = [r for _, r in await new.journal()]
    started = new_journal[0]
    assert isinstance(started, RunStarted)
    assert started.from_run == "chat-7/turn-3"
    old_steps = [
        (r.pos, r.name, bytes(r.result)) for r in old_journal if isinstance(r, StepCompleted)
    ]
    new_steps = [
        (r.pos, r.name, bytes(r.result)) for r in new_journal if isinstance(r, StepCompleted)
    ]
    assert new_steps[:2] == old_steps == old_steps[:2]
    assert [name for _, name, _ in new_steps] == ["tool:search", "tool:plan", "model"]
    # ctx.now() replays the old run's value too
    old_values = [v for r in old_journal if isinstance(r.values, list) for v in r.values]
    assert result["asked_at"] == datetime.fromtimestamp(float(old_values[0].value), UTC).isoformat()
    # the old run stays as it was
    assert (await old.describe()).status == "cancelled"
    assert (await new.describe()).status == "completed"


async def test_regenerate_up_to_a_call_runs_the_later_ones_again(engine: fusee.Engine) -> None:
    async with engine.worker():
        await _interrupted(engine, "chat-8/turn-1")
        release["model"] = True
        new = await engine.start(turn, "chat-8/turn-1b", HISTORY, from_run="chat-8/turn-1", upto=1)
        await new.result(timeout=20)
    assert effects == {"tool:search": 1, "tool:plan": 2, "model": 2}


async def test_regenerate_from_a_run_that_cannot_serve(engine: fusee.Engine) -> None:
    with pytest.raises(fusee.RunNotFound):
        await engine.start(turn, "chat-9/b", HISTORY, from_run="chat-9/missing")
    await engine.start(turn, "chat-9/a", HISTORY)  # no worker: it has not ended
    with pytest.raises(fusee.InvalidArgument, match="has not ended"):
        await engine.start(turn, "chat-9/b", HISTORY, from_run="chat-9/a")
    await engine.run("chat-9/a").cancel("interrupted")
    async with engine.worker():
        with pytest.raises(fusee.RunCancelled):
            await engine.run("chat-9/a").result(timeout=20)
    with pytest.raises(fusee.InvalidArgument, match="workflow"):
        await engine.start("other_workflow", "chat-9/b", HISTORY, from_run="chat-9/a")


async def test_a_retried_start_finishes_the_copy_of_a_starter_that_died(
    engine: fusee.Engine,
) -> None:
    async with engine.worker():
        await _interrupted(engine, "chat-10/turn-1")
    release["model"] = True
    # the starter died after run.started and the first copy: no index, no active marker
    reused = await engine._reusable("regen_turn", "chat-10/turn-1", None)
    assert len(reused) == 2
    eid = escape("chat-10/turn-1b")
    data = canonical(HISTORY, "")
    record = RunStarted(
        workflow="regen_turn",
        input=msgspec.Raw(data),
        started_at=time.time(),
        partition=partition_of("chat-10/turn-1b", engine.partitions),
        from_run="chat-10/turn-1",
    )
    seq = await engine.store.append(
        eid, "run.started", encode_record(record), fence=0, msg_id=f"{eid}:start:test"
    )
    history = History("chat-10/turn-1b")
    history.feed(seq, encode_record(record))
    await engine._append_copies(eid, history, reused[:1], 0)
    async with engine.worker():
        run = await engine.start(turn, "chat-10/turn-1b", HISTORY, from_run="chat-10/turn-1")
        assert (await run.result(timeout=20))["answer"].startswith("day 1")
    assert effects == {"tool:search": 1, "tool:plan": 1, "model": 2}
    names = [r.name for _, r in await run.journal() if isinstance(r, StepCompleted)]
    assert names == ["tool:search", "tool:plan", "model"]


async def _append_linked(engine: fusee.Engine, eid: str, history: History, record: Any) -> int:
    """Append ``record`` linked to what ``history`` read last, as a writer does."""
    prev, prev_hash = history.link()
    linked = msgspec.structs.replace(record, prev=prev, prev_hash=prev_hash)
    data = encode_record(linked)
    last = await engine.store.last_in_journal(eid)
    assert last is not None
    seq = await engine.store.append(
        eid, kind_of(linked), data, fence=last.seq, msg_id=f"{eid}:hand:{last.seq}"
    )
    history.add(seq, linked, data)
    return seq


async def test_regenerate_reads_the_old_journal_as_every_reader_does(
    engine: fusee.Engine,
) -> None:
    """A journal with an unreadable record that a forced resume accepted is read past
    it (the record skipped), as the run's own reader does; a break no forced resume
    accepted is refused, naming it, and nothing is started."""
    old = await engine.start(turn, "chat-9/turn-1", HISTORY)  # (no worker: written by hand)
    history = History(old.run_id)
    first = await engine.store.read_journal(old.eid)
    history.feed(first[0].seq, first[0].data)
    search = StepCompleted(pos=1, name="tool:search", result=msgspec.Raw(b'["tram 28"]'))
    await _append_linked(engine, old.eid, history, search)
    last = await engine.store.last_in_journal(old.eid)
    assert last is not None
    garbage = await engine.store.append(
        old.eid, "step.completed", b"\xffnot a record", fence=last.seq, msg_id="garbage"
    )
    await _append_linked(engine, old.eid, history, RunResumed(force=True, gap=garbage))
    await _append_linked(engine, old.eid, history, RunCancelled(reason="stopped"))
    new = await engine.start(turn, "chat-9/turn-1b", HISTORY, from_run="chat-9/turn-1")
    copied = [r for _, r in await new.journal()]
    assert [type(r) for r in copied] == [RunStarted, StepCompleted]
    assert isinstance(copied[1], StepCompleted)
    assert (copied[1].name, bytes(copied[1].result)) == ("tool:search", b'["tram 28"]')

    # a break nobody accepted: refused, nothing started
    broken = await engine.start(turn, "chat-9/turn-2", HISTORY)
    forged = StepCompleted(pos=1, name="tool:search", result=msgspec.Raw(b"1"), prev=9)
    last = await engine.store.last_in_journal(broken.eid)
    assert last is not None
    await engine.store.append(
        broken.eid, "step.completed", encode_record(forged), fence=last.seq, msg_id="forged"
    )
    with pytest.raises(fusee.InvalidArgument, match="chain is broken"):
        await engine.start(turn, "chat-9/turn-2b", HISTORY, from_run="chat-9/turn-2")
    assert list(await engine.store.read_journal(escape("chat-9/turn-2b"))) == []
