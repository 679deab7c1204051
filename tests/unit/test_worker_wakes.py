"""The worker hands a wake-up (an inbox message, a hint) to its running actor in the
inbox consumer's callback when nothing is queued before it, and queues it behind what
is: an actor's inbox must see its messages in stream order (it reads from the last
sequence it saw: a message handed over after a later one would be skipped). An actor to
start, or to hand over, is the wake loop's (its tasks copy the loop's context)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import anyio
from anyio import wait_all_tasks_blocked
from anyio.lowlevel import checkpoint

from fusee.actors.ports import ClusterStore, Stored
from fusee.actors.registry import Registry
from fusee.actors.worker import Worker
from fusee.adapters.jetstream.layout import StoredMsg


def _msg(seq: int) -> Stored:
    return StoredMsg(seq, "ns.in.0.r", b"{}", {})


@contextlib.contextmanager
def _worker() -> Iterator[tuple[Worker, list[int]]]:
    worker = Worker(
        store=cast(ClusterStore, object()),  # nothing here reaches the store
        registry=Registry(),
        namespace="ns",
        clock=lambda: 0.0,
    )
    handed: list[int] = []

    def wake(_p: int, _eid: str, msg: Stored | None) -> None:
        assert msg is not None
        handed.append(msg.seq)

    worker._wake = wake  # type: ignore[method-assign,assignment]
    with worker._wakes_in, worker._wakes_out:
        yield worker, handed


async def test_a_wake_up_overtakes_nothing_queued_before_it() -> None:
    with _worker() as (worker, handed):
        await _in_order(worker, handed)


async def _in_order(worker: Worker, handed: list[int]) -> None:
    running = cast(Any, object())  # (its slot: what _wake pokes, replaced here)
    # an actor to start: queued for the wake loop, which starts its task
    assert worker._wake_now(0, "r", _msg(1))
    assert handed == []
    worker.actors["r"] = running  # (it runs from now on)
    # the first is still queued: the next one waits behind it, not handed at once
    assert worker._wake_now(0, "r", _msg(2))
    assert handed == []
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker._wakes)
        await wait_all_tasks_blocked()
        assert handed == [1, 2]
        # nothing queued (the loop waits for the next one): handed over at once
        assert worker._wake_now(0, "r", _msg(3))
        assert handed == [1, 2, 3]
        # one given to the waiting loop and not handled yet counts as queued
        del worker.actors["r"]
        assert worker._wake_now(0, "r", _msg(4))
        worker.actors["r"] = running
        assert worker._wake_now(0, "r", _msg(5))
        assert handed == [1, 2, 3]
        await checkpoint()
        await wait_all_tasks_blocked()
        assert handed == [1, 2, 3, 4, 5]
        # an actor handed over to another worker: from the wake loop too
        worker.needs["r"] = (0, "workflow:w")
        assert worker._wake_now(0, "r", _msg(6))
        assert handed == [1, 2, 3, 4, 5]
        await wait_all_tasks_blocked()
        assert handed == [1, 2, 3, 4, 5, 6]
        tg.cancel_scope.cancel()


async def test_a_full_queue_drops_the_wake_up() -> None:
    with _worker() as (worker, handed):
        sent = 0
        while sent < 20_000 and worker._wake_now(0, "r", _msg(sent + 1)):  # all queued
            sent += 1
        assert sent == 10_000
        assert handed == []


async def test_a_message_to_another_worker_s_partition_takes_no_place_in_the_queue() -> None:
    """Every worker's inbox consumer sees every inbox of the namespace; those of the
    partitions other workers own must not fill its queue (a full queue makes every
    running actor read from the server and every parked inbox be looked at again)."""
    with _worker() as (worker, handed):
        worker.owned = {0: 1}  # (partition: its owner record's revision)
        for seq in range(1, 5):
            await worker._on_inbox(1, "theirs", _msg(seq))
        assert worker._queued == 0
        assert handed == []
        await worker._on_inbox(0, "mine", _msg(5))  # its own partition's: queued
        assert worker._queued == 1
