"""``fusee runs list`` with a filter streams the index's pages: each page's rows are
printed before the next page is read (memory bounded by a page), as a table (the header
once) or as one JSON array written an item at a time (issue 12's review)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import fusee
from fusee.adapters.cli.options import GlobalOptions
from fusee.adapters.cli.runs import runs_list
from fusee.runtime.index import RunInfo, encode_info
from tests.helpers import run_cli

RUNS = 7
PAGE = 3


class _Recorder:
    """A stdout that notes, with each write, how many pages the listing had read."""

    def __init__(self, pages: list[int]) -> None:
        self.pages = pages
        self.writes: list[tuple[int, str]] = []

    def write(self, text: str) -> int:
        self.writes.append((len(self.pages), text))
        return len(text)

    def flush(self) -> None:
        pass

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.writes)


@pytest.fixture
async def failed_runs(nats_server: Any, namespace: str) -> list[str]:
    """``RUNS`` failed runs in the index (their final and listing entries)."""
    eng = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    ids = [f"f-{i}" for i in range(RUNS)]
    try:
        await eng.store.open_listings()  # as a worker does before it ends runs
        for n, run_id in enumerate(ids):
            info = RunInfo(run_id=run_id, workflow="w", status="failed", created_at=time.time() + n)
            await eng.store.end_run(0, run_id, encode_info(info), journal_seq=1, fresh=True)
    finally:
        await eng.close()
    return ids


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    """A stdout recorder; ``Engine.runs`` paged by ``PAGE``, each page read counted."""
    pages: list[int] = []
    runs = fusee.Engine.runs

    async def paged(self: fusee.Engine, **kwargs: Any) -> AsyncIterator[list[RunInfo]]:
        async for found in runs(self, **{**kwargs, "page": PAGE}):
            pages.append(len(found))
            yield found

    monkeypatch.setattr(fusee.Engine, "runs", paged)
    return _Recorder(pages)


Listing = Callable[..., Awaitable[int]]


@pytest.fixture
def listing(
    nats_server: Any, namespace: str, recorded: _Recorder, monkeypatch: pytest.MonkeyPatch
) -> Listing:
    """``fusee runs list`` (``runs_list``) on the test's namespace, its stdout recorded
    (put in place in the test itself: pytest's capture takes stdout back between the
    set-up and the test)."""
    opts = GlobalOptions(nats=nats_server.url, namespace=namespace)

    async def run(**args: Any) -> int:
        with monkeypatch.context() as m:
            m.setattr(sys, "stdout", recorded)
            return await runs_list(opts, **args)

    return run


async def test_a_filtered_list_prints_each_page_before_reading_the_next(
    failed_runs: list[str], recorded: _Recorder, listing: Listing
) -> None:
    assert await listing(status="failed", workflow="w", as_json=False) == 0
    rows = [w for w in recorded.writes if "f-" in w[1]]
    assert rows, recorded.writes
    assert rows[0][0] == 1, "the first rows were printed only after more pages were read"
    assert len(recorded.pages) >= RUNS // PAGE
    lines = recorded.text.splitlines()
    assert lines[0].split() == ["RUN", "ID", "WORKFLOW", "STATUS", "STEPS", "AGE", "DETAIL"]
    assert sorted(line.split()[0] for line in lines[1:]) == failed_runs  # each run once
    assert sum("RUN ID" in line for line in lines) == 1


async def test_a_filtered_json_list_is_one_array_written_an_item_at_a_time(
    failed_runs: list[str], recorded: _Recorder, listing: Listing
) -> None:
    assert await listing(status="failed", as_json=True, workflow=None) == 0
    items = [w for w in recorded.writes if '"run_id"' in w[1]]
    assert items, recorded.writes
    assert items[0][0] == 1, "the first items were written only after more pages were read"
    listed = json.loads(recorded.text)
    assert sorted(i["run_id"] for i in listed) == failed_runs
    # the same text json_text(list) printed before it streamed: an indented array
    assert recorded.text.startswith("[\n  {\n")
    assert recorded.text.endswith("\n]\n")


async def test_a_filtered_json_list_of_nothing_is_an_empty_array(
    recorded: _Recorder, listing: Listing
) -> None:
    assert await listing(status="completed", as_json=True, workflow=None) == 0
    assert json.loads(recorded.text) == []


async def test_a_list_of_nothing_prints_no_table_and_says_so(
    nats_server: Any, namespace: str, recorded: _Recorder, listing: Listing
) -> None:
    done = await run_cli("runs", "list", "--nats", nats_server.url, "--namespace", namespace)
    assert (done.returncode, done.stdout) == (0, "")
    assert f"No runs in namespace {namespace!r}." in done.stderr
    assert await listing(status="completed", as_json=False, workflow="w") == 0
    assert recorded.text == ""


async def test_a_jsonl_list_is_one_object_a_line_written_page_by_page(
    failed_runs: list[str], recorded: _Recorder, listing: Listing
) -> None:
    """``--jsonl``: what a reader that stops early (``| head``) has read is whole JSON,
    where ``--json``'s array is left unclosed."""
    assert await listing(status="failed", workflow=None, as_json=False, as_jsonl=True) == 0
    items = [w for w in recorded.writes if '"run_id"' in w[1]]
    assert items[0][0] == 1, "the first lines were written only after more pages were read"
    lines = recorded.text.splitlines()
    assert sorted(json.loads(line)["run_id"] for line in lines) == failed_runs
    assert all(line.startswith('{"run_id":') for line in lines), lines
    assert recorded.text.endswith("}\n")


async def test_json_and_jsonl_are_refused_together(nats_server: Any, namespace: str) -> None:
    done = await run_cli(
        "runs", "list", "--json", "--jsonl", "--nats", nats_server.url, "--namespace", namespace
    )
    assert done.returncode == 2
    assert json.loads(done.stderr)["error"] == {
        "code": "bad_input",
        "message": "--json and --jsonl: give one of them",
    }
