"""A run paused because its journal is gone is listed under ``paused`` (its marker and
the listing entry go in one write), so ``runs list --status paused`` and bulk resume
find it (issue 12, reviewer's repro)."""

import anyio

from fusee.runtime.index import RunInfo, decode_info, encode_info
from tests.memory_store import MemoryStore, run_actor
from tests.unit.test_ended_runs import _registry


class Recording(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.unmarks: list[bytes | None] = []

    async def clear_run_active(
        self, partition: int, eid: str, *, listed: bytes | None = None, seen: int | None = None
    ) -> bool:
        self.unmarks.append(listed)
        return await super().clear_run_active(partition, eid, listed=listed, seen=seen)


def test_a_paused_run_is_listed_as_paused() -> None:
    store = Recording()
    store.index["r"] = (encode_info(RunInfo(run_id="r", workflow="one", status="waiting")), 4, 7)
    store.run_markers[0, "r"] = b"{}"
    assert anyio.run(run_actor(store, _registry(), clock=lambda: 2.0).run) == "paused"
    assert decode_info(store.index["r"][0]).status == "paused"
    assert any(listed is not None for listed in store.unmarks), "paused, but never listed"
