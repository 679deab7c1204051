"""The run index's filters (status x workflow x start time x ID prefix, across pages) and
bulk cancel and resume, with worker subprocesses and the ``fusee`` CLI."""

from __future__ import annotations

import functools
import json
import re
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import fusee
from fusee._bulk import CONCURRENCY
from fusee.runtime.bulk import STATUSES
from fusee.runtime.records import RunCancelled, RunResumed
from tests.helpers import cli_cmd, cli_env
from tests.workers.procs import api_server, wait_until

MODES = {"done": "completed", "fail": "failed", "block": "running", "wait": "waiting"}
Made = dict[str, tuple[str, str, float]]  # run ID -> (workflow, expected status, start)


def _arg(tmp_path: Path, mode: str) -> dict[str, Any]:
    return {"mode": mode, "log": str(tmp_path / "calls.log"), "flag": str(tmp_path / "fixed")}


async def start_settled(
    engine: fusee.Engine, tmp_path: Path, wf: str, mode: str, ids: list[str]
) -> Made:
    """Start a run of ``wf`` in ``mode`` for each of ``ids``; wait until each is in its
    mode's status (``pause``: paused)."""
    made: Made = {}
    for run_id in ids:
        await engine.start(wf, run_id, _arg(tmp_path, mode))
        made[run_id] = (wf, MODES.get(mode, "paused"), time.time())
    await _settled(engine, made)
    return made


async def _status(engine: fusee.Engine, run_id: str) -> str:
    return (await engine.run(run_id).describe()).status


async def _listed(engine: fusee.Engine, **f: Any) -> set[str]:
    out: list[str] = []
    async for page in engine.runs(page=3, **f):
        assert len(page) <= 3 * 2  # a page of the index, never every run
        out += [i.run_id for i in page]
    assert len(out) == len(set(out)), "a run listed twice"
    return set(out)


async def _start_all(engine: fusee.Engine, tmp_path: Path, prefix: str, per: int) -> Made:
    """``per`` runs of each workflow in each mode: ID -> (workflow, expected status, start)."""
    made: Made = {}
    for wf in ("bk_a", "bk_b"):
        for mode in [*MODES, "pause", "cancel"]:
            for i in range(per):
                run_id = f"{prefix}-{wf}-{mode}-{i}"
                run = await engine.start(
                    wf, run_id, _arg(tmp_path, "block" if mode == "cancel" else mode)
                )
                status = {"pause": "paused", "cancel": "cancelled"}.get(mode) or MODES[mode]
                made[run_id] = (wf, status, time.time())
                if mode == "cancel":
                    await run.cancel("by the test")
    return made


async def _settled(engine: fusee.Engine, made: Made) -> None:
    for run_id, (_, status, _) in made.items():
        await wait_until(
            functools.partial(_status_is, engine, run_id, status),
            timeout=30,
            what=f"{run_id} {status}",
        )


async def _status_is(engine: fusee.Engine, run_id: str, status: str) -> bool:
    if status == "waiting":  # describe() says running for a parked run: ask the index
        return any(i.run_id == run_id for i in await engine.list_runs(status="waiting"))
    return await _status(engine, run_id) == status


async def test_the_index_lists_exactly_the_runs_each_filter_matches(
    engine: fusee.Engine, bulk_workers: Any, tmp_path: Path
) -> None:
    first = await _start_all(engine, tmp_path, "old", 2)
    middle = time.time()
    second = await _start_all(engine, tmp_path, "new", 2)
    made = {**first, **second}
    await _settled(engine, made)
    for status in STATUSES:
        for wf in (None, "bk_a", "bk_b"):
            want = {r for r, (w, s, _) in made.items() if s == status and wf in (None, w)}
            assert await _listed(engine, status=status, workflow=wf) == want, (status, wf)
            newer = {r for r in want if r in second}
            assert await _listed(engine, status=status, workflow=wf, since=middle) == newer
            assert await _listed(engine, status=status, workflow=wf, until=middle) == want - newer
            assert (
                await _listed(engine, status=status, workflow=wf, id_prefix="old-") == want - newer
            )
    assert await _listed(engine) == set(made)
    assert await _listed(engine, workflow="bk_b", since="1h") == {
        r for r, (w, _, _) in made.items() if w == "bk_b"
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--status", "sleeping"], "not a run status"),
        (["--since=-1h"], "must not be negative"),
        (["--since", "yesterday"], "since"),
        (["--since", "1h", "--until", "2h"], "is not after"),
    ],
)
async def test_bad_filters_are_refused_and_nothing_is_done(
    engine: fusee.Engine, nats_server: Any, namespace: str, args: list[str], message: str
) -> None:
    run = await engine.start("bk_a", "bad-1", {"mode": "block", "log": "-", "flag": "-"})
    done = await anyio.run_process(
        cli_cmd(
            "runs", "bulk", "cancel", "--nats", nats_server.url, "--namespace", namespace, *args
        ),
        check=False,
        env=cli_env(),
    )
    assert done.returncode != 0
    assert message in done.stderr.decode()
    assert [type(r).__name__ for _, r in await run.journal()] == ["RunStarted"]


async def _cli(
    nats_server: Any, namespace: str, *args: str, kill_after: int | None = None
) -> tuple[int, str]:
    """``fusee ARGS`` on the test's namespace: exit code, stdout and stderr. ``kill_after``:
    the CLI SIGKILLs itself once its bulk action has done that many runs
    (``tests/workers/bulk_cli.py``)."""
    cmd = cli_cmd(*args, "--nats", nats_server.url, "--namespace", namespace)
    if kill_after is not None:
        cmd[1:3] = ["-m", "tests.workers.bulk_cli", str(kill_after)]
    done = await anyio.run_process(cmd, check=False, env=cli_env())
    return done.returncode, done.stdout.decode() + done.stderr.decode()


async def _cancels(engine: fusee.Engine, run_id: str) -> int:
    return sum(isinstance(r, RunCancelled) for _, r in await engine.run(run_id).journal())


async def test_bulk_cancel_cancels_exactly_the_matching_runs_and_dry_run_nothing(
    engine: fusee.Engine, bulk_workers: Any, nats_server: Any, namespace: str, tmp_path: Path
) -> None:
    made: Made = {}
    for wf in ("bk_a", "bk_b"):
        for mode in ("block", "done"):
            ids = [f"{wf}-{mode}-{i}" for i in range(6)]
            made |= await start_settled(engine, tmp_path, wf, mode, ids)
    journals = {r: await engine.run(r).journal() for r in made}
    code, out = await _cli(
        nats_server, namespace, "runs", "bulk", "cancel", "--type", "bk_a",
        "--status", "running", "--since", "1h", "--reason", "bad deploy", "--dry-run",
    )  # fmt: skip
    assert code == 0, out
    assert out.count("would cancel bk_a-block-") == 6
    assert "6 done, 0 skipped, 0 failed" in out
    assert {r: await engine.run(r).journal() for r in made} == journals  # nothing changed
    code, out = await _cli(
        nats_server, namespace, "runs", "bulk", "cancel", "--workflow", "bk_a",
        "--status", "running", "--since", "1h", "--reason", "bad deploy",
    )  # fmt: skip
    assert code == 0, out
    assert "6 done, 0 skipped, 0 failed" in out
    cancelled = {r for r, (w, s, _) in made.items() if w == "bk_a" and s == "running"}
    for run_id in made:
        want = "cancelled" if run_id in cancelled else made[run_id][1]
        await wait_until(
            functools.partial(_status_is, engine, run_id, want), timeout=20, what=run_id
        )
        assert await _cancels(engine, run_id) == (run_id in cancelled)
    info = await engine.run("bk_a-block-0").describe()
    assert info.reason == "bad deploy"


async def test_bulk_cancel_killed_halfway_and_run_again_cancels_each_once(
    engine: fusee.Engine, bulk_workers: Any, nats_server: Any, namespace: str, tmp_path: Path
) -> None:
    made = await start_settled(engine, tmp_path, "bk_a", "block", [f"k-{i}" for i in range(40)])
    args = ("runs", "bulk", "cancel", "--workflow", "bk_a", "--reason", "halfway")
    code, out = await _cli(nats_server, namespace, *args, kill_after=15)
    assert code == -9, out  # SIGKILLed after 15 cancels

    async def cancelled_so_far() -> list[str]:
        # the 15 cancels were stored before the kill; their runs journal them soon after
        done = [r for r in made if await _cancels(engine, r)]
        return done if len(done) >= 15 else []

    await wait_until(cancelled_so_far, timeout=20, what="the first pass's 15 cancels")
    code, out = await _cli(nats_server, namespace, *args)
    assert code == 0, out
    for run_id in made:
        await wait_until(
            functools.partial(_status_is, engine, run_id, "cancelled"), timeout=20, what=run_id
        )
        assert await _cancels(engine, run_id) == 1
    code, out = await _cli(nats_server, namespace, *args)  # a third time: nothing to do
    assert code == 0, out
    assert "0 done, 0 skipped, 0 failed" in out


async def test_bulk_resume_dry_run_counts_against_the_index_total_and_sends_nothing(
    engine: fusee.Engine, bulk_workers: Any, nats_server: Any, namespace: str, tmp_path: Path
) -> None:
    made = await start_settled(engine, tmp_path, "bk_b", "pause", [f"d-{i}" for i in range(5)])
    await start_settled(engine, tmp_path, "bk_a", "pause", ["d-other"])
    inboxes = {
        r: await engine.store.read_inbox(engine.run(r).partition, engine.run(r).eid) for r in made
    }
    code, out = await _cli(
        nats_server, namespace, "runs", "bulk", "resume", "--workflow", "bk_b", "--dry-run",
        "--progress",
    )  # fmt: skip
    assert code == 0, out
    assert sorted(
        line.split()[2] for line in out.splitlines() if line.startswith("would resume ")
    ) == sorted(made)
    assert "would resume: 5 done, 0 skipped, 0 failed (done: resumes to send;" in out
    assert "5/5" in out  # the progress bar's total: the index counted the listings
    assert {
        r: await engine.store.read_inbox(engine.run(r).partition, engine.run(r).eid) for r in made
    } == inboxes
    code, out = await _cli(
        nats_server, namespace, "runs", "bulk", "resume", "--workflow", "bk_b", "--progress"
    )
    assert code == 0, out
    assert "resume: 5 done, 0 skipped, 0 failed (done: resumes sent;" in out
    assert "5/5" in out


async def test_a_bulk_resume_of_200_runs_shows_its_progress_and_json_its_summary(
    engine: fusee.Engine, bulk_workers: Any, nats_server: Any, namespace: str, tmp_path: Path
) -> None:
    made = await start_settled(engine, tmp_path, "bk_b", "pause", [f"g-{i}" for i in range(200)])
    where = ("--nats", nats_server.url, "--namespace", namespace)

    async def bulk(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        cmd = cli_cmd("runs", "bulk", "resume", "--workflow", "bk_b", *args, *where)
        done = await anyio.run_process(cmd, check=False, env={**cli_env(), **(env or {})})
        return done.returncode, done.stdout.decode(), done.stderr.decode()

    # --json: the summary as the HTTP API answers it, and no bar (nor without a terminal)
    code, out, err = await bulk("--dry-run", "--json", "--progress")
    assert code == 0, err
    assert json.loads(out) == {
        "action": "resume", "dry_run": True, "done": 200, "skipped": 0, "failed": {}
    }  # fmt: skip
    assert "200/200" not in err
    code, out, err = await bulk("--dry-run")
    assert (code, err) == (0, ""), err  # no terminal: no bar
    (tmp_path / "fixed").touch()
    # forced on ($FUSEE_PROGRESS, as --progress): drawn on stderr, to its last frame
    code, out, err = await bulk(env={"FUSEE_PROGRESS": "1"})
    assert code == 0, err
    assert "resume: 200 done, 0 skipped, 0 failed" in out
    assert "200/200" in err
    assert "done 200, skipped 0, failed 0" in err
    for run_id in made:
        assert await engine.run(run_id).result(timeout=60) == "answered"


async def _resumes(engine: fusee.Engine, run_id: str) -> int:
    return sum(isinstance(r, RunResumed) for _, r in await engine.run(run_id).journal())


async def test_bulk_resume_of_500_paused_runs_killed_halfway_resumes_each_once(
    engine: fusee.Engine, bulk_workers: Any, nats_server: Any, namespace: str, tmp_path: Path
) -> None:
    made = await start_settled(engine, tmp_path, "bk_b", "pause", [f"p-{i}" for i in range(500)])
    await start_settled(engine, tmp_path, "bk_a", "pause", ["other-paused"])  # another workflow
    assert len(await engine.list_runs(status="paused", workflow="bk_b")) == 500
    (tmp_path / "fixed").touch()  # the provider is back
    args = ("runs", "bulk", "resume", "--workflow", "bk_b")
    code, out = await _cli(nats_server, namespace, *args, kill_after=200)
    assert code == -9, out
    code, out = await _cli(nats_server, namespace, *args)
    assert code == 0, out
    for run_id in made:
        assert await engine.run(run_id).result(timeout=60) == "answered"
        assert await _resumes(engine, run_id) == 1
    # the resumes the first pass sent and had not counted when it was killed (at most
    # concurrency - 1 others in flight) are counted by neither pass: their runs are not
    # listed again (their marker is back)
    found = re.search(r"resume: (\d+) done", out)
    assert found, out
    assert 500 - 200 - (CONCURRENCY - 1) <= int(found.group(1)) <= 500 - 200, out
    assert await _status(engine, "other-paused") == "paused"
    calls = (tmp_path / "calls.log").read_text().split()
    assert all(calls.count(r) == 3 for r in made)  # 2 attempts, then 1 after the resume


async def test_http_bulk_cancel_takes_the_same_filters_and_answers_the_summary(
    engine: fusee.Engine, bulk_workers: Any, nats_server: Any, namespace: str, tmp_path: Path
) -> None:
    made: Made = {}
    for wf in ("bk_a", "bk_b"):
        made |= await start_settled(
            engine, tmp_path, wf, "block", [f"h-{wf}-{i}" for i in range(3)]
        )
    with api_server(nats_server.url, namespace, tmp_path) as server:
        url = (await server.wait_for("api.serving", timeout=20))["url"]
        async with httpx.AsyncClient(base_url=url, timeout=20) as http:
            bad = await http.post("/v1/runs/bulk/cancel", json={"status": "sleeping"})
            assert bad.status_code == 400
            assert "not a run status" in bad.json()["error"]["message"]
            bad = await http.post("/v1/runs/bulk/cancel", json={"since": "1h", "until": "2h"})
            assert bad.status_code == 400
            body = {"workflow": "bk_b", "status": "running", "since": "1h", "reason": "http"}
            dry = await http.post("/v1/runs/bulk/cancel", json={**body, "dry_run": True})
            assert dry.json() == {
                "action": "cancel", "dry_run": True, "done": 3, "skipped": 0, "failed": {}
            }  # fmt: skip
            done = await http.post("/v1/runs/bulk/cancel", json=body)
            assert done.status_code == 200, done.text
            assert (done.json()["done"], done.json()["failed"]) == (3, {})
            resumed = await http.post("/v1/runs/bulk/resume", json={"workflow": "bk_b"})
            assert resumed.json()["done"] == 0  # nothing paused
    for run_id, (wf, _, _) in made.items():
        want = "cancelled" if wf == "bk_b" else "running"
        await wait_until(
            functools.partial(_status_is, engine, run_id, want), timeout=20, what=run_id
        )
