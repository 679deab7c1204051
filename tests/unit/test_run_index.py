"""project_index over the MemoryStore (an ended run's entry kept apart, revision 0, as
the real store keeps it in the journal stream): every path ends."""

from __future__ import annotations

import pytest

from fusee.actors.run_index import MAX_REFUSALS, project_index
from fusee.errors import FuseeError
from fusee.runtime.index import RunInfo, Status, decode_info, encode_info
from tests.memory_store import MemoryStore


def _info(status: Status) -> RunInfo:
    return RunInfo(run_id="r", workflow="w", status=status)


class Counting(MemoryStore):
    """Counts compare-and-sets; one that loops for ever is cut short."""

    puts: int = 0
    refuse: bool = False

    async def put_index(self, eid: str, value: bytes, *, journal_seq: int, last: int) -> int | None:
        self.puts += 1
        if self.puts > MAX_REFUSALS + 1:
            raise AssertionError("project_index spins")
        if self.refuse:
            return None
        return await super().put_index(eid, value, journal_seq=journal_seq, last=last)


@pytest.mark.parametrize("final", [b"\xffnot json", b'{"run_id":"r"}', b'{"status":"x"}'])
async def test_an_unreadable_ended_entry_and_a_bucket_entry_do_not_spin(final: bytes) -> None:
    store = Counting()
    store.index["r"] = (encode_info(_info("waiting")), 3, 5)  # a parked run's, in the bucket
    store.ended["r"] = (final, 7)  # another SDK's, or corrupt
    store.run_markers[0, "r"] = b"{}"
    assert not await project_index(store, "r", _info("waiting"), 9, unmark=0)
    assert store.puts == 0  # the final entry stands: nothing compared against it
    assert (0, "r") not in store.run_markers  # and the marker it was asked to remove is gone
    assert store.ended["r"] == (final, 7)
    assert await project_index(store, "r", _info("completed"), 9)  # an end replaces it
    entry = await store.get_index_entry("r")
    assert entry is not None
    assert decode_info(entry[0]).status == "completed"


async def test_a_readable_ended_entry_is_not_compared_against() -> None:
    store = Counting()
    store.index["r"] = (encode_info(_info("waiting")), 3, 5)
    store.ended["r"] = (encode_info(_info("completed")), 7)
    assert not await project_index(store, "r", _info("waiting"), 9)
    assert store.puts == 0


async def test_a_compare_and_set_refused_for_ever_ends_with_an_error() -> None:
    store = Counting()
    store.refuse = True
    store.index["r"] = (encode_info(_info("waiting")), 3, 5)
    with pytest.raises(FuseeError, match="refused 100 times"):
        await project_index(store, "r", _info("paused"), 9)
    assert store.puts == MAX_REFUSALS


async def test_an_unreadable_bucket_entry_is_replaced() -> None:
    store = Counting()
    store.index["r"] = (b"\xff", 3, 5)
    assert await project_index(store, "r", _info("waiting"), 9)
    assert store.puts == 1
    assert decode_info(store.index["r"][0]).status == "waiting"
