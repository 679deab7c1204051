"""A paused run's listing entry stays when the run is resumed; while the resumed run is
active (its marker back, its entry still ``paused`` until it parks or ends) it is not
listed as paused (issue 12's review: ``_still_paused``'s marker check)."""

from __future__ import annotations

import time
from typing import Any

import fusee
from fusee.runtime.index import RunInfo, encode_info


async def test_a_resumed_run_still_active_is_not_listed_paused(
    nats_server: Any, namespace: str
) -> None:
    eng = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        store = eng.store
        info = RunInfo(
            run_id="p-1", workflow="w", status="paused", created_at=time.time(), partition=0
        )
        raw = encode_info(info)
        assert await store.put_index("p-1", raw, journal_seq=1, last=0) is not None
        await store.mark_run_active(0, "p-1", raw)
        await store.clear_run_active(0, "p-1", listed=raw)  # paused: listed
        assert [i.run_id for i in await eng.list_runs(status="paused")] == ["p-1"]
        await store.mark_run_active(0, "p-1", raw)  # resumed: active again
        assert [i.run_id for i in await eng.list_runs(status="paused")] == []
    finally:
        await eng.close()
