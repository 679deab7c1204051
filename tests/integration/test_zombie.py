"""A frozen worker (SIGSTOP) is replaced; when it wakes, its write is refused (fenced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fusee
from fusee.runtime.ids import partition_of
from fusee.runtime.records import StepCompleted
from tests.workers.procs import (
    assert_chained,
    chain_input,
    chain_result,
    completed_keys,
    execution_lines,
    executions,
    owners,
    start_balanced,
    wait_until,
)

PARTITIONS = 4


async def test_zombie_owner_is_fenced_out(
    nats_server: Any, namespace: str, tmp_path: Path, worker_procs: Any
) -> None:
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=PARTITIONS)
    try:
        by_id = await start_balanced(worker_procs(partitions=PARTITIONS), engine, 2)
        log = tmp_path / "effects.log"
        release = tmp_path / "release-s2"  # step 2 cannot end before this file exists
        arg = chain_input(log, steps=4, delay=0.05, tag="zombie")
        arg["hold"] = {"step": "s2", "until": str(release)}
        run = await engine.start("chain", "r-zombie", arg)
        owner_id = (await owners(engine))[partition_of("r-zombie", PARTITIONS)]
        assert owner_id in by_id
        zombie = by_id[owner_id]
        other = next(p for p in by_id.values() if p is not zombie)

        # Freeze the owner in the middle of step 2 (held open: it cannot have ended).
        await zombie.wait_for("step.started", run_id="r-zombie", pos=2, timeout=10)
        zombie.freeze()
        release.touch()  # for the other worker's run of step 2; the zombie is frozen
        try:

            async def taken_over() -> bool:
                journal = await run.journal()
                return any(isinstance(r, StepCompleted) and r.pos == 2 for _, r in journal)

            await wait_until(taken_over, timeout=15, what="the other worker to complete step 2")
            await other.wait_for("step.completed", run_id="r-zombie", pos=2, timeout=5)
        finally:
            zombie.thaw()

        # The zombie's step 2 ends now. Its commit must be refused (``actor.fenced``); or,
        # if its periodic check of the owner records runs first, it drops the partition
        # and cancels the actor before it appends (``partition.lost``). Either way it
        # must never commit step 2.
        partition = partition_of("r-zombie", PARTITIONS)

        def zombie_outcome() -> list[dict[str, Any]]:
            return (
                zombie.find("actor.fenced", run_id="r-zombie")
                + zombie.find("step.completed", run_id="r-zombie", pos=2)
                + zombie.find("partition.lost", partition=partition)
            )

        await wait_until(zombie_outcome, timeout=10, what="the zombie to be shut out")
        assert not zombie.find("step.completed", run_id="r-zombie", pos=2), (
            "the zombie's commit of step 2 was accepted after another worker committed it"
        )
        shut_out = zombie.find("actor.fenced", run_id="r-zombie") or zombie.find(
            "partition.lost", partition=partition
        )
        assert shut_out[0]["level"] == "warning"
        assert await run.result(timeout=20) == chain_result(arg)
        # checked again once all is over: a commit that raced the shutdown shows by now
        assert not zombie.find("step.completed", run_id="r-zombie", pos=2), (
            "the zombie's commit of step 2 was accepted after another worker committed it"
        )

        journal = await run.journal()
        assert_chained(journal)
        keys = completed_keys(journal)  # fails if a position completed twice
        assert sorted(keys) == [1, 2, 3, 4]
        counts = executions(log)
        assert sorted(counts) == sorted(keys.values())
        # only the step the zombie was frozen in ran twice, with the same key
        assert counts[keys[2]] == 2
        assert all(counts[keys[p]] == 1 for p in (1, 3, 4)), execution_lines(log)
    finally:
        await engine.close()
