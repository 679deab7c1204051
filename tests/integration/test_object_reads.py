"""Once any caller was answered, every reader sees the change: ``state()`` and
``list_objects`` of any engine, also while the KV projection is behind the journal (it
is written after the reply, and a crash between the two leaves it behind)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

import fusee
from fusee.runtime.objects import encode_state, object_id
from fusee.runtime.records import ObjectDone
from tests.workers.objects import counters
from tests.workers.procs import wait_until

OBJECTS = Path(__file__).resolve().parent.parent / "workers" / "objects.py"

pytestmark = pytest.mark.timeout(120)


async def _dones(engine: fusee.Engine, key: str) -> list[tuple[int, ObjectDone]]:
    run = fusee.Run(engine, object_id("counter", key))
    return [(seq, r) for seq, r in await run.journal() if isinstance(r, ObjectDone)]


async def _three_calls(engine: fusee.Engine, worker_procs: Any, keys: list[str]) -> None:
    workers = worker_procs(partitions=4)
    workers.module = OBJECTS
    worker = await workers.start()
    for key in keys:
        for n in range(3):
            await counters.key(key, engine=engine).call("add", {"client": 0, "n": n})

    async def projected() -> bool:
        for key in keys:
            found = await engine.store.get_state("counter", key)
            if found is None or msgspec.json.decode(found[0]).get("count") != 3:
                return False
        return True

    await wait_until(projected, timeout=10, what="the projections to catch up")
    assert worker.stop() == 0  # nobody catches the projection up from here on


async def test_a_projection_left_behind_is_not_what_readers_see(
    nats_server: Any, namespace: str, engine: fusee.Engine, worker_procs: Any
) -> None:
    await _three_calls(engine, worker_procs, ["behind", "unprojected"])
    store = engine.store
    # What a worker that died after obj.done and before the KV write leaves: the
    # projection as of the first call, tagged with that call's record...
    (first_seq, _), *_ = await _dones(engine, "behind")
    current = await store.get_state("counter", "behind")
    assert current is not None
    stale = encode_state({"count": b"1", "seen": b'["0:0"]'})
    assert await store.put_state(
        "counter", "behind", stale, journal_seq=first_seq, cursor=0, last=current[2]
    )
    # ...and, for a key whose very first projection never landed, none at all.
    await store.objects.purge("counter.unprojected")

    other = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:  # an engine that was answered for none of the calls
        want = {"count": 3, "seen": ["0:0", "0:1", "0:2"]}
        assert await counters.key("behind", engine=other).state() == want
        assert await counters.key("unprojected", engine=other).state() == want
        assert await other.list_objects("counter") == [("behind", want), ("unprojected", want)]
    finally:
        await other.close()
