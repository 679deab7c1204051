"""A frozen worker (SIGSTOP) is replaced; when it wakes, its write is refused (fenced)."""

from __future__ import annotations

import time
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


async def test_a_frozen_owner_is_replaced_after_one_ping_not_one_per_partition(
    nats_server: Any, namespace: str, worker_procs: Any
) -> None:
    """A worker frozen (SIGSTOP) while it owns half of 16 partitions: its peer takes
    all of them once its ping goes unanswered, asking it once (each ping it waits out is
    ``ping_timeout``: one more per partition made a frozen owner of n partitions n+1
    pings to replace)."""
    partitions = 16
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=partitions)
    pings: list[str] = []

    async def on_ping(msg: Any) -> None:
        pings.append(msg.subject)  # (the test does not answer: the worker is frozen)

    try:
        by_id = await start_balanced(worker_procs(partitions=partitions), engine, 2)
        frozen_id = next(iter(by_id))
        frozen, other_id = by_id[frozen_id], next(w for w in by_id if w != frozen_id)
        held = [p for p, w in (await owners(engine)).items() if w == frozen_id]
        assert len(held) >= 2, held  # (rendezvous hashing: 16 partitions over 2 workers)
        sub = await engine.store.nc.subscribe(engine.store.layout.ping(frozen_id), cb=on_ping)
        frozen.freeze()
        began = time.monotonic()
        try:

            async def all_taken() -> bool:
                return set((await owners(engine)).values()) == {other_id}

            await wait_until(all_taken, timeout=30, what=f"the {len(held)} partitions taken")
            took = time.monotonic() - began
            print(f"\na frozen owner of {len(held)} partitions replaced in {took:.1f} s")
        finally:
            frozen.thaw()
            await sub.unsubscribe()
        assert len(pings) == 1, (
            f"{len(pings)} pings to the frozen owner of {len(held)} partitions before they "
            "were taken"
        )
    finally:
        await engine.close()


async def test_a_worker_joining_while_the_only_owner_is_frozen_pings_it_once(
    nats_server: Any, namespace: str, worker_procs: Any
) -> None:
    """The owner of all 16 partitions frozen (SIGSTOP), then a second worker starts: it
    has never heard the frozen one, finds it in the owner records, pings it once (its
    discovery) and takes the 16 partitions before it says it has started (one ping
    per partition, 2 s each, made that 35 s)."""
    partitions = 16
    engine = await fusee.connect(nats_server.url, namespace=namespace, partitions=partitions)
    pings: list[str] = []

    async def on_ping(msg: Any) -> None:
        pings.append(msg.subject)

    try:
        workers = worker_procs(partitions=partitions)
        first = await start_balanced(workers, engine, 1)
        [(frozen_id, frozen)] = first.items()
        sub = await engine.store.nc.subscribe(engine.store.layout.ping(frozen_id), cb=on_ping)
        frozen.freeze()
        try:
            joined = await workers.start()
            joined_id = joined.find("worker.started")[0]["worker"]
            assert set((await owners(engine)).values()) == {joined_id}
        finally:
            frozen.thaw()
            await sub.unsubscribe()
        assert len(pings) == 1, f"{len(pings)} pings to the frozen owner of {partitions}"
    finally:
        await engine.close()
