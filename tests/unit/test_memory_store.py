"""The in-memory store keeps the JetStream rules the unit tests rely on it for."""

from __future__ import annotations

import anyio
import pytest

from fusee.errors import Fenced
from tests.memory_store import MemoryStore


def test_an_append_lands_only_under_the_last_sequence_of_its_runs_journal() -> None:
    async def go() -> None:
        store = MemoryStore()
        first = await store.append("a", "k", b"1", fence=0, msg_id="a1")
        other = await store.append("b", "k", b"1", fence=0, msg_id="b1")  # another run's
        assert other == first + 1  # one stream sequence for every journal
        with pytest.raises(Fenced):
            await store.append("a", "k", b"x", fence=0, msg_id="a2")  # a stale writer
        assert await store.append("a", "k", b"2", fence=first, msg_id="a2") == other + 1
        with pytest.raises(Fenced):
            await store.append("a", "k", b"x", fence=first, msg_id="a3")
        assert [m.data for m in await store.read_journal("a")] == [b"1", b"2"]

    anyio.run(go)


def test_inbox_messages_share_the_stream_sequence_and_a_msg_id_dedupes() -> None:
    async def go() -> None:
        store = MemoryStore()
        seq = await store.append("a", "k", b"1", fence=0, msg_id="a1")
        sent = await store.send_inbox(0, "a", "signal", b"{}", msg_id="s1")
        assert sent == seq + 1
        assert await store.send_inbox(0, "a", "signal", b"{}", msg_id="s1") == sent
        assert [m.seq for m in await store.read_inbox(0, "a")] == [sent]

    anyio.run(go)


def test_index_and_state_writes_compare_and_set_their_revision() -> None:
    async def go() -> None:
        store = MemoryStore()
        rev = await store.put_index("a", b"{}", journal_seq=1, last=0)
        assert rev is not None
        assert await store.put_index("a", b"{}", journal_seq=2, last=0) is None
        assert await store.put_state("t", "k", b"{}", journal_seq=1, cursor=0, last=0)
        assert await store.put_state("t", "k", b"{}", journal_seq=1, cursor=0, last=0) is None

    anyio.run(go)
