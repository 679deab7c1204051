"""Review repro (fix/cluster, issue 16): Direct Gets the R3 fix left on followers.

The fix checks journal reads against the leader's tail. Two other reads that a worker
*decides* on are still answered by whichever replica is local:

- ``read_inbox`` (journal stream, inbox subject): ``Worker._park`` and
  ``Worker._recheck_parked`` read it once (``limit=1``) to decide whether a parked run
  has news; a miss leaves a run parked with an acknowledged signal in its inbox.
- ``get_value`` (values stream): a step result stored out of line, read on replay; a
  miss raises ``JournalGap`` -> ``Unreplayable`` (the run pauses).

Each test writes through a client connected to the stream's leader and reads at once
through clients connected to the followers, like
``tests/integration/test_r3.py::test_reads_after_an_append_see_it_on_every_node`` does
for journals. Each stops at its first stale read (then fails), or passes after
BUDGET seconds without one. Run:

    cd /work/wt-rev-cluster && PYTHONPATH=$PWD/src:$PWD /work/main/.venv/bin/python -m \
        pytest -q -p no:xdist -p no:cacheprovider review/rev-cluster/test_stale_reads.py
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from tests.cluster import LoopbackCluster, stream_leader

import fusee
from fusee.adapters.jetstream.store import NatsStore
from fusee.errors import JournalGap

pytestmark = [pytest.mark.nats, pytest.mark.cluster, pytest.mark.timeout(90)]

# each test writes and reads until a stale read or this many seconds (a miss is a few
# in a thousand reads on 2 busy cores: 1-16 in 1,200 measured here)
BUDGET = 25.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LoopbackCluster]:
    c = LoopbackCluster.start(tmp_path / "cluster")
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
async def ns(cluster: LoopbackCluster) -> str:
    name = f"rev{os.urandom(4).hex()}"
    eng = await fusee.connect(cluster.urls, namespace=name, replicas=3, partitions=4)
    await eng.close()
    return name


async def _split(
    cluster: LoopbackCluster, ns: str, stream: str
) -> tuple[list[NatsStore], list[NatsStore]]:
    leader = await stream_leader(cluster, stream)
    writers = [await NatsStore.connect([leader.url], ns) for _ in range(4)]
    readers = [await NatsStore.connect([n.url], ns) for n in cluster.nodes if n is not leader]
    return writers, readers


async def test_an_inbox_message_just_acknowledged_is_seen_by_every_node(
    cluster: LoopbackCluster, ns: str
) -> None:
    """What ``_park`` does: ``read_inbox(p, eid, seen, limit=1)`` right after a sender
    was acknowledged. An empty answer parks the run with the message unread."""
    probe = await NatsStore.connect(cluster.urls, ns)
    stream = probe.layout.stream
    await probe.close()
    writers, readers = await _split(cluster, ns, stream)
    missed: list[tuple[str, int]] = []
    deadline = time.monotonic() + BUDGET

    async def write(k: int, writer: NatsStore) -> None:
        for i in itertools.count():
            if missed or time.monotonic() > deadline:
                return
            eid = f"inbox-{k}-{i}"
            # a step's record, then a signal to the run (the load a worker makes)
            await writer.append(eid, "run.started", b"x" * 200, fence=0, msg_id=eid)
            seq = await writer.send_inbox(0, eid, "signal", b'{"kind":"signal"}')
            for reader in readers:
                news = await reader.read_inbox(0, eid, 0, limit=1)
                if not news:
                    missed.append((eid, seq))

    try:
        async with anyio.create_task_group() as tg:
            for k, w in enumerate(writers):
                tg.start_soon(write, k, w)
    finally:
        for s in (*writers, *readers):
            await s.close()
    assert not missed, f"inbox reads missed an acknowledged message: {missed[:3]}"


async def test_a_value_just_stored_is_readable_on_every_node(
    cluster: LoopbackCluster, ns: str
) -> None:
    """A step result stored out of line (``put_value``), then read on a replay
    (``get_value``): a follower without it yet raises JournalGap (the run pauses as
    Unreplayable), though the value and the record naming it were acknowledged."""
    probe = await NatsStore.connect(cluster.urls, ns)
    stream = probe.layout.values_stream
    await probe.close()
    writers, readers = await _split(cluster, ns, stream)
    gaps: list[str] = []
    deadline = time.monotonic() + BUDGET

    async def write(k: int, writer: NatsStore) -> None:
        for i in itertools.count():
            if gaps or time.monotonic() > deadline:
                return
            eid = f"val-{k}-{i}"
            ref = await writer.put_value(eid, f"{k}-{i}-".encode() * 50)
            # the record naming it, as a step commit writes it after the value
            await writer.append(eid, "run.started", b"x" * 200, fence=0, msg_id=eid)
            for reader in readers:
                try:
                    await reader.get_value(ref)
                except JournalGap as exc:
                    gaps.append(str(exc))

    try:
        async with anyio.create_task_group() as tg:
            for k, w in enumerate(writers):
                tg.start_soon(write, k, w)
    finally:
        for s in (*writers, *readers):
            await s.close()
    assert not gaps, f"a value read raised JournalGap: {gaps[:1]}"
