"""Reviewer's check (issue 12): a final entry an earlier version wrote (no listing entry) is found
by an ended-status filter once config.listed_from bounds it."""

from __future__ import annotations

import time
from typing import Any

import fusee
from fusee.adapters.jetstream.store import LISTED_FROM
from fusee.runtime.index import RunInfo, encode_info


async def test_an_old_final_entry_is_listed_by_status(nats_server: Any, namespace: str) -> None:
    eng = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        store = eng.store
        store._listed = lambda *a: None  # type: ignore[method-assign]  # an earlier version: no listing entry
        info = RunInfo(run_id="old-1", workflow="w", status="failed", created_at=time.time())
        await store.end_run(0, "old-1", encode_info(info), journal_seq=1, fresh=True)
        await store.work.delete(LISTED_FROM)  # as if this version never opened it
        await store.work.purge(LISTED_FROM)
    finally:
        await eng.close()
    eng = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        failed = [i.run_id for i in await eng.list_runs(status="failed")]
        by_wf = [i.run_id for i in await eng.list_runs(status="failed", workflow="w")]
        other = [i.run_id for i in await eng.list_runs(status="failed", workflow="x")]
        allr = [i.run_id for i in await eng.list_runs(since="1h")]
        assert failed == ["old-1"]
        assert by_wf == ["old-1"]
        assert other == []
        assert allr == ["old-1"]
    finally:
        await eng.close()
