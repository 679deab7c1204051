"""The run index's filters (status x workflow x start time x ID prefix, across pages) and
bulk cancel and resume, with worker subprocesses and the ``fusee`` CLI."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import fusee
from fusee.runtime.bulk import STATUSES
from tests.helpers import cli_cmd, cli_env
from tests.workers.procs import HERE, wait_until

BULK = HERE / "bulk.py"
MODES = {"done": "completed", "fail": "failed", "block": "running", "wait": "waiting"}


def _arg(tmp_path: Path, mode: str) -> dict[str, Any]:
    return {"mode": mode, "log": str(tmp_path / "calls.log"), "flag": str(tmp_path / "fixed")}


async def _status(engine: fusee.Engine, run_id: str) -> str:
    return (await engine.run(run_id).describe()).status


async def _listed(engine: fusee.Engine, **f: Any) -> set[str]:
    out: list[str] = []
    async for page in engine.runs(page=3, **f):
        assert len(page) <= 3 * 2  # a page of the index, never every run
        out += [i.run_id for i in page]
    assert len(out) == len(set(out)), "a run listed twice"
    return set(out)


async def _start_all(
    engine: fusee.Engine, tmp_path: Path, prefix: str, per: int
) -> dict[str, tuple[str, str, float]]:
    """``per`` runs of each workflow in each mode: ID -> (workflow, expected status, start)."""
    made: dict[str, tuple[str, str, float]] = {}
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


async def _settled(engine: fusee.Engine, made: dict[str, tuple[str, str, float]]) -> None:
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
    engine: fusee.Engine, worker_procs: Any, tmp_path: Path
) -> None:
    workers = worker_procs()
    workers.module = BULK
    await workers.start()
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
