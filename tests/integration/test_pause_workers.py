"""Pausing and resuming runs, against worker subprocesses and a real nats-server: a
step that runs out of attempts under ``on_exhausted="pause"`` pauses its run, which
stays paused through a restart of every worker and of nats-server, and ``resume()``
completes it once the provider is fixed (its failed attempts not counted against the
fresh budget, no finished step run again); a determinism pause resumes once matching
code is back; a journal-gap pause needs ``force``."""

from __future__ import annotations

import collections
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from fusee.adapters.jetstream.server import EmbeddedServer
from fusee.runtime.inbox import Resume, encode_message
from fusee.runtime.index import decode_info
from fusee.runtime.records import (
    RunCancelled,
    RunPaused,
    RunResumed,
    StepCompleted,
    WaitStarted,
)
from tests.helpers import forge_last, run_cli
from tests.workers.procs import assert_chained, owners, wait_until

PAUSING = Path(__file__).resolve().parent.parent / "workers" / "pausing.py"


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _counts(log: Path) -> collections.Counter[str]:
    return collections.Counter(line.split()[0] for line in _lines(log))


async def _status(run: fusee.Run) -> str:
    return (await run.describe()).status  # (a broken chain: paused, at once)


async def _paused(run: fusee.Run) -> bool:
    return await _status(run) == "paused"


async def test_a_paused_run_survives_restarts_and_resumes_once_the_provider_is_fixed(
    nats_server_private: EmbeddedServer, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    server = nats_server_private
    engine = await fusee.connect(server.url, namespace=namespace, partitions=2)
    try:
        workers = worker_procs(url=server.url, partitions=2)
        workers.module = PAUSING
        procs = [await workers.start(), await workers.start()]
        log, fixed = tmp_path / "effects.log", tmp_path / "fixed"
        arg = {"log": str(log), "fixed": str(fixed)}
        run = await engine.start("pz_provider", "support-42", arg)
        await wait_until(lambda: _paused(run), timeout=20, what="the run to pause")

        # the journal, describe(), runs show and runs list --status paused say why
        info = await run.describe()
        assert (info.status, info.step, info.error_type, info.attempts) == (
            "paused",
            "model",
            "ConnectionError",
            5,
        )
        assert info.message == "the provider is down (attempt 5)"
        journal = await run.journal()
        pauses = [r for _, r in journal if isinstance(r, RunPaused)]
        assert len(pauses) == 1
        assert (pauses[0].step, pauses[0].attempts, pauses[0].cause) == ("model", 5, "retries")
        assert isinstance(journal[-1][1], RunPaused)  # nothing after it
        assert _counts(log) == {"plan": 1, "model": 5}
        url = ["--nats", server.url, "--namespace", namespace]
        listed = await run_cli("runs", "list", "--status", "paused", *url)
        assert listed.returncode == 0, listed.stderr
        row = [line for line in listed.stdout.splitlines() if "support-42" in line]
        assert len(row) == 1
        assert "paused" in row[0]
        assert "step model ran out of attempts (5)" in row[0]
        assert "ConnectionError" in row[0]
        shown = await run_cli("runs", "show", "support-42", *url)
        assert shown.returncode == 0, shown.stderr
        assert "PAUSED" in shown.stdout
        assert "step      model, after 5 attempt(s): ConnectionError" in shown.stdout
        as_json = await run_cli("runs", "list", "--status", "paused", "--json", *url)
        (entry,) = [e for e in json.loads(as_json.stdout) if e["run_id"] == "support-42"]
        assert (entry["step"], entry["attempts"]) == ("model", 5)

        # every worker and the server restart while it is paused: still paused after
        for p in procs:
            p.kill()
        port = server.port
        server.kill()
        await anyio.to_thread.run_sync(server.restart)
        assert server.port == port
        procs = [await workers.start(), await workers.start()]

        async def owned() -> bool:  # every partition has an owner again
            return all(o is not None for o in (await owners(engine)).values())

        await wait_until(owned, timeout=30, what="the workers to own every partition")
        assert await _status(run) == "paused"
        assert await run.journal() == journal
        assert _counts(log) == {"plan": 1, "model": 5}

        # the provider is fixed: resume completes it. Asked again (a retry after a lost
        # reply): stored nothing new (deduplicated) or told the run is no longer paused;
        # a copy of the message that got past the deduplication is stale: resumed once
        fixed.touch()
        await run.resume()
        again: fusee.NotPausedError | None = None
        try:
            await run.resume()
        except fusee.NotPausedError as exc:
            again = exc
        assert again is None or again.status in ("running", "completed")
        copy = encode_message(Resume(paused=journal[-1][0]))
        await engine.store.send_unless_ended(run.partition, run.eid, "resume", copy, msg_id="dup")
        assert await run.result(timeout=30) == ["planned", "answered at attempt 6", "done"]
        after = await run.journal()
        assert_chained(after)
        assert sum(isinstance(r, RunResumed) for _, r in after) == 1
        assert [r.name for _, r in after if isinstance(r, StepCompleted)] == [
            "plan",
            "model",
            "after",
        ]
        assert _counts(log) == {"plan": 1, "model": 6, "after": 1}
        with pytest.raises(fusee.NotPausedError) as err:
            await run.resume()
        assert err.value.status == "completed"
        assert await run.journal() == after  # nothing stored
    finally:
        await engine.close()


async def test_the_fresh_budget_does_not_count_the_earlier_attempts(
    engine: fusee.Engine, tmp_path: Path, worker_procs: Any
) -> None:
    """The provider stays down after a resume: the step gets 5 more attempts (not 0,
    as it would if its first 5 counted), then pauses again; a second resume of the new
    pause completes it."""
    workers = worker_procs()
    workers.module = PAUSING
    worker = await workers.start()
    log, fixed = tmp_path / "effects.log", tmp_path / "fixed"
    run = await engine.start("pz_provider", "r-budget", {"log": str(log), "fixed": str(fixed)})
    await wait_until(lambda: _paused(run), timeout=20, what="the run to pause")
    first = await run.journal()
    await run.resume()

    async def paused_twice() -> bool:
        return sum(isinstance(r, RunPaused) for _, r in await run.journal()) == 2

    await wait_until(paused_twice, timeout=20, what="the run to pause again")
    assert _lines(log)[-1] == "model 10"  # the attempts go on counting: 6..10
    assert _counts(log) == {"plan": 1, "model": 10}
    info = await run.describe()
    assert (info.status, info.attempts, info.message) == (
        "paused",
        5,
        "the provider is down (attempt 10)",
    )
    assert len(await run.journal()) == len(first) + 1 + 4 + 1  # resumed, 4 retries, paused
    # woken again (a signal), the run reads the first pause's resume in its inbox: stale,
    # it must not resume the second pause
    journal = await run.journal()
    await run.signal("nudge")
    await worker.wait_for("run.resume_ignored", run_id="r-budget", timeout=20)
    assert await run.journal() == journal
    assert await _status(run) == "paused"
    fixed.touch()
    await run.resume()
    assert await run.result(timeout=20) == ["planned", "answered at attempt 11", "done"]


async def test_resuming_a_run_that_is_not_paused_is_an_error_and_stores_nothing(
    engine: fusee.Engine, tmp_path: Path, worker_procs: Any
) -> None:
    workers = worker_procs()
    workers.module = PAUSING
    log = tmp_path / "effects.log"
    run = await engine.start("pz_code", "r-waiting", {"log": str(log)})
    await workers.start()

    async def waiting() -> bool:
        return any(isinstance(r, WaitStarted) for _, r in await run.journal())

    await wait_until(waiting, timeout=20, what="the run to wait for its signal")
    before = await run.journal()
    inbox = await engine.store.read_inbox(run.partition, run.eid)
    with pytest.raises(fusee.NotPausedError, match="is not paused") as err:
        await run.resume()
    assert err.value.status in ("running", "waiting")
    assert await run.journal() == before
    assert await engine.store.read_inbox(run.partition, run.eid) == inbox
    with pytest.raises(fusee.RunNotFound):
        await engine.run("r-never").resume()
    with pytest.raises(fusee.InvalidArgument):
        await run.resume(force="yes")  # type: ignore[arg-type]
    cli = await run_cli(
        "runs", "resume", "r-waiting", "--nats", engine.url, "--namespace", engine.namespace
    )
    assert cli.returncode == 1
    assert "is not paused" in cli.stderr
    assert await engine.store.read_inbox(run.partition, run.eid) == inbox


async def test_a_determinism_pause_resumes_once_matching_code_is_back(
    engine: fusee.Engine, tmp_path: Path, worker_procs: Any
) -> None:
    workers = worker_procs()
    workers.module = PAUSING
    log = tmp_path / "effects.log"
    old = await workers.start()
    run = await engine.start("pz_code", "r-det", {"log": str(log)})

    async def waiting() -> bool:
        return any(isinstance(r, WaitStarted) for _, r in await run.journal())

    await wait_until(waiting, timeout=20, what="the run to wait for its signal")
    old.stop()
    new = await workers.start(extra_env={"FUSEE_TEST_CODE": "new"})
    await run.signal("go")
    await wait_until(lambda: _paused(run), timeout=20, what="the run to pause")
    assert "step 2 is 'two' in the journal" in ((await run.describe()).reason or "")
    # resumed where the code still does not match: paused again, nothing ran
    await run.resume()

    async def paused_twice() -> bool:
        return sum(isinstance(r, RunPaused) for _, r in await run.journal()) == 2

    await wait_until(paused_twice, timeout=20, what="the run to pause again")
    new.stop()
    await workers.start()  # the old code is back
    await run.resume()
    assert await run.result(timeout=20) == ["one", "two", "three"]
    assert _counts(log) == {"one": 1, "two": 1, "three": 1}


async def test_a_journal_gap_pause_needs_force(
    engine: fusee.Engine, tmp_path: Path, worker_procs: Any
) -> None:
    workers = worker_procs()
    workers.module = PAUSING
    log = tmp_path / "effects.log"
    await workers.start()
    run = await engine.start("pz_code", "r-gap", {"log": str(log)})

    async def waiting() -> bool:
        return any(isinstance(r, WaitStarted) for _, r in await run.journal())

    await wait_until(waiting, timeout=20, what="the run to wait for its signal")
    # a record replaced: one whose link names a predecessor the journal does not hold
    await forge_last(engine, run, WaitStarted, "forged")
    await run.signal("go")

    # describe() says paused as soon as the chain is broken; the worker lists the pause
    # once it met the break (what a bulk resume reads)
    async def listed() -> bool:
        pages = [p async for p in engine.store.listed_pages("paused", "pz_code", page=100)]
        return any(eid == run.eid for page in pages for eid, _, _ in page)

    await wait_until(listed, timeout=20, what="the worker to list the run paused on the gap")
    assert await _paused(run)
    inbox = await engine.store.read_inbox(run.partition, run.eid)
    with pytest.raises(fusee.NotPausedError, match="force=True") as err:
        await run.resume()
    assert err.value.status == "paused"
    assert await engine.store.read_inbox(run.partition, run.eid) == inbox
    with pytest.raises(fusee.NotPausedError, match="force=True"):
        await run.resume(dry_run=True)
    # a bulk resume fails it (it stays paused: an operator must see it), not "skipped",
    # and a dry run says so (it counted it done, as if it would be resumed)
    dry = await engine.bulk_resume(workflow="pz_code", dry_run=True)
    summary = await engine.bulk_resume(workflow="pz_code")
    assert (summary.done, summary.skipped, list(summary.failed)) == (0, 0, ["r-gap"])
    assert "force=True" in summary.failed["r-gap"]
    assert (dry.done, dry.skipped, dry.failed) == (0, 0, summary.failed)
    assert await engine.store.read_inbox(run.partition, run.eid) == inbox
    await run.resume(force=True)
    assert await run.result(timeout=20) == ["one", "two", "three"]
    assert _counts(log) == {"one": 1, "two": 1, "three": 1}
    assert any(isinstance(r, RunResumed) and r.force for _, r in await run.journal())


async def test_a_cancel_ends_a_run_paused_by_its_code_or_its_journal(
    engine: fusee.Engine, tmp_path: Path, worker_procs: Any
) -> None:
    """Neither can be replayed safely (the code does not match; records are missing),
    so neither runs code again: each ends ``cancelled`` at once, its compensations not
    run, instead of waiting for a resume that would only pause it again."""
    workers = worker_procs()
    workers.module = PAUSING
    log = tmp_path / "effects.log"
    old = await workers.start()
    det = await engine.start("pz_code", "r-det-cancel", {"log": str(log)})
    gap = await engine.start("pz_code", "r-gap-cancel", {"log": str(log)})

    async def waiting(run: fusee.Run) -> bool:
        return any(isinstance(r, WaitStarted) for _, r in await run.journal())

    async def both(check: Callable[[fusee.Run], Awaitable[bool]]) -> bool:
        return all([await check(det), await check(gap)])

    await wait_until(lambda: both(waiting), timeout=20, what="the runs to wait")
    old.stop()
    await workers.start(extra_env={"FUSEE_TEST_CODE": "new"})
    await forge_last(engine, gap, WaitStarted, "forged")
    for run in (det, gap):
        await run.signal("go")
    await wait_until(lambda: both(_paused), timeout=20, what="the runs to pause")
    for run in (det, gap):
        assert await run.cancel("given up")
    for run in (det, gap):
        with pytest.raises(fusee.RunCancelled, match="given up"):
            await run.result(timeout=20)
        assert (await run.describe()).status == "cancelled"
    assert _counts(log) == {"one": 2, "two": 2}  # no code ran again
    det_journal = [r for _, r in await det.journal()]
    assert [type(r) for r in det_journal[-2:]] == [RunPaused, RunCancelled]
    gap_journal = [r for _, r in await gap.journal()]
    assert isinstance(gap_journal[-1], RunCancelled)
    forced = gap_journal[-2]
    assert isinstance(forced, RunResumed)
    assert forced.force


async def test_a_forced_resume_gets_past_every_break_and_a_later_break_needs_another(
    engine: fusee.Engine, tmp_path: Path, worker_procs: Any
) -> None:
    """Two records replaced while the run waits: one ``resume(force=True)`` takes both
    (it does not pause again at the second); a break that comes after it pauses the run
    again, and a second force gets past that one too."""
    workers = worker_procs()
    workers.module = PAUSING
    log = tmp_path / "effects.log"
    await workers.start()
    run = await engine.start("pz_code", "r-two-gaps", {"log": str(log)})

    async def forced(n: int) -> bool:  # n forced resumes journaled, and waiting again
        journal = [r for _, r in await run.journal()]
        done = sum(isinstance(r, RunResumed) and r.force for r in journal)
        return done == n and await _status(run) == "waiting"

    async def parked() -> bool:  # (out of memory: the next message activates it afresh)
        indexed = await engine.store.get_index(run.eid)
        return indexed is not None and decode_info(indexed).status == "waiting"

    await wait_until(parked, timeout=20, what="the run to park")
    await forge_last(engine, run, WaitStarted, "forged-1")
    await forge_last(engine, run, WaitStarted, "forged-2")
    await run.signal("nudge")  # (not the one it waits for: it only brings it back)
    await wait_until(lambda: _paused(run), timeout=20, what="the run to pause on the gaps")
    await run.resume(force=True)
    await wait_until(lambda: forced(1), timeout=20, what="the forced resume")
    await wait_until(parked, timeout=20, what="the run to park again")
    # a new break, after the forced resume: a second force gets past it
    await forge_last(engine, run, WaitStarted, "forged-3")
    await run.signal("nudge")
    await wait_until(lambda: _paused(run), timeout=20, what="the run to pause on the new gap")
    await run.resume(force=True)
    await wait_until(lambda: forced(2), timeout=20, what="the second forced resume")
    await run.signal("go")
    assert await run.result(timeout=20) == ["one", "two", "three"]
    assert _counts(log) == {"one": 1, "two": 1, "three": 1}
