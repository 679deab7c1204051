"""A full group of ends commits as batches, none falling back to single publishes: the
group's cap (``runtime/commits.MAX_BATCH``) is the server's 1,000 messages a batch over
the most messages one record carries with its riders (issue 12's review: at 500 records
an end's three messages made 1,500, refused, and every batch fell back)."""

from __future__ import annotations

from typing import Any

import anyio

from fusee.adapters.jetstream.store import NatsStore
from fusee.runtime.commits import BATCH_MESSAGES, MAX_BATCH, RECORD_MESSAGES
from fusee.runtime.index import RunInfo, encode_info

ENDS = 1_000


async def test_a_full_group_of_ends_commits_with_no_fallback(
    nats_server: Any, namespace: str
) -> None:
    assert MAX_BATCH * RECORD_MESSAGES <= BATCH_MESSAGES
    store = await NatsStore.connect(nats_server.url, namespace)
    try:
        await store.ensure_layout()

        async def end(i: int) -> None:
            info = RunInfo(run_id=f"r{i}", workflow="w", status="completed", created_at=1.0)
            await store.end_run(0, f"r{i}", encode_info(info), journal_seq=1, fresh=True)

        async with anyio.create_task_group() as tg:
            for i in range(ENDS):
                tg.start_soon(end, i)
        committer = store.committer
        assert committer.batches > 0
        assert committer.fallbacks == 0
        assert committer.batched > MAX_BATCH  # more than one full group went out batched
        listed = 0
        async for page in store.listed_pages("completed", "w"):
            listed += len(page)
        assert listed == ENDS
    finally:
        await store.close()
