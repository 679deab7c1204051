"""The run routes of the HTTP API against a real ``fusee api`` process and a worker:
start (idempotent by ID), list (filters, cursor), journal (paged), signals, cancel, and
the request ID on every answer. Every documented status of these routes is reached."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

import fusee
from tests.helpers import assert_http_error
from tests.workers.procs import HERE, served_api, wait_until
from tests.workers.procs import ServedApi as Api

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def api(nats_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("http-runs")
    with served_api(nats_server.url, tmp, HERE / "http_runs.py") as api:
        yield api


def _rid(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


async def _status(client: httpx.AsyncClient, run: str, status: str) -> dict[str, Any]:
    async def check() -> Any:
        info = (await client.get(f"/v1/runs/{quote(run, safe='')}")).json()
        return info if info.get("status") == status else None

    info: dict[str, Any] = await wait_until(check, timeout=20, what=f"{run} {status}")
    return info


async def test_start_is_idempotent_by_id(client: httpx.AsyncClient) -> None:
    run = _rid("s/1")  # a "/" in the ID: the body carries it, no escaping
    body = {"workflow": "hr-echo", "id": run, "input": "hi", "timeout": "15m"}
    r = await client.post("/v1/runs", json=body)
    assert r.status_code == 201, r.text
    assert (r.json()["run_id"], r.json()["workflow"]) == (run, "hr-echo")
    again = await client.post("/v1/runs", json=body)  # a retried start: the same run
    assert (again.status_code, again.json()["run_id"]) == (200, run)
    r = await client.get(f"/v1/runs/{quote(run, safe='')}/result", params={"timeout": "15s"})
    assert r.json() == {"run_id": run, "status": "completed", "result": {"echo": "HI"}}

    for conflict in ({"input": "other"}, {"workflow": "hr-fail"}, {"timeout": "1h"}):
        r = await client.post("/v1/runs", json={**body, **conflict})
        assert "exists" in assert_http_error(r, 409, "run_exists")["message"]
    r = await client.post("/v1/runs", json={"workflow": "hr-echo", "id": "@obj/x"})
    assert_http_error(r, 400, "invalid_id")
    r = await client.post("/v1/runs", json={"workflow": "hr-echo", "id": "x", "timeout": "-1s"})
    assert_http_error(r, 400, "config_error")
    r = await client.post("/v1/runs", json={"workflow": "hr-echo"})
    assert "`id`" in assert_http_error(r, 400, "invalid_argument")["message"]


async def test_list_filters_and_pages_with_a_cursor(client: httpx.AsyncClient) -> None:
    tag = secrets.token_hex(3)
    runs = [f"ls-{tag}-{i}" for i in range(5)]
    for run in runs:
        await client.post("/v1/runs", json={"workflow": "hr-echo", "id": run, "input": "x"})
    for run in runs:
        await client.get(f"/v1/runs/{run}/result", params={"timeout": "15s"})
    await client.post("/v1/runs", json={"workflow": "hr-wait", "id": f"ls-{tag}-w"})

    async def pages(**params: Any) -> tuple[list[str], int]:
        seen: list[str] = []
        n = 0
        cursor = None
        while True:
            q = {**params, **({"cursor": cursor} if cursor else {})}
            r = await client.get("/v1/runs", params=q)
            assert r.status_code == 200, r.text
            n += 1
            seen += [i["run_id"] for i in r.json()["runs"]]
            cursor = r.json()["next_cursor"]
            if cursor is None:
                return seen, n

    async def listed() -> Any:
        seen, _ = await pages(id_prefix=f"ls-{tag}-", status="completed")
        return sorted(seen) == runs

    await wait_until(listed, timeout=20, what="the ended runs listed")
    # two index entries a page: the cursor takes the reader through every page
    seen, n = await pages(id_prefix=f"ls-{tag}-", status="completed", limit=2)
    assert sorted(seen) == runs
    assert n >= 3
    seen, _ = await pages(id_prefix=f"ls-{tag}-", workflow="hr-wait")
    assert seen == [f"ls-{tag}-w"]
    seen, _ = await pages(id_prefix=f"ls-{tag}-")  # every status
    assert sorted(seen) == sorted([*runs, f"ls-{tag}-w"])

    first = (await client.get("/v1/runs", params={"status": "completed", "limit": 1})).json()
    assert first["next_cursor"]
    # a cursor is for the filters it was made with
    r = await client.get("/v1/runs", params={"status": "failed", "cursor": first["next_cursor"]})
    assert "other filters" in assert_http_error(r, 400, "invalid_argument")["message"]
    r = await client.get("/v1/runs", params={"cursor": "garbage!"})
    assert_http_error(r, 400, "invalid_argument")
    r = await client.get("/v1/runs", params={"status": "sleeping"})
    assert_http_error(r, 400, "config_error")
    r = await client.get("/v1/runs", params={"limit": 0})
    assert_http_error(r, 400, "invalid_argument")


async def test_a_signal_finishes_a_waiting_run(client: httpx.AsyncClient) -> None:
    run = _rid("sig")
    await client.post("/v1/runs", json={"workflow": "hr-wait", "id": run})
    await _status(client, run, "waiting")
    url = f"/v1/runs/{run}/signals/go"
    r = await client.post(url, json={"ok": True}, headers={"Idempotency-Key": "k1"})
    assert (r.status_code, r.json()) == (202, {"run_id": run, "signal": "go"})
    r = await client.get(f"/v1/runs/{run}/result", params={"timeout": "15s"})
    assert r.json() == {"run_id": run, "status": "completed", "result": {"ok": True}}
    # the run has ended: a signal is refused, nothing stored
    assert_http_error(await client.post(url, json=1), 409, "run_ended")
    assert_http_error(await client.post("/v1/runs/none-such/signals/go"), 404, "run_not_found")
    assert_http_error(await client.post(f"/v1/runs/{run}/signals/a%01b"), 400, "invalid_id")


async def test_cancel_a_waiting_run(client: httpx.AsyncClient) -> None:
    run = _rid("cx")
    await client.post("/v1/runs", json={"workflow": "hr-wait", "id": run})
    await _status(client, run, "waiting")
    r = await client.post(f"/v1/runs/{run}/cancel", json={"reason": "not needed"})
    assert (r.status_code, r.json()) == (202, {"run_id": run, "status": "cancelling"})
    r = await client.get(f"/v1/runs/{run}/result", params={"timeout": "15s"})
    assert (r.json()["status"], r.json()["error"]["message"]) == ("cancelled", "not needed")
    assert_http_error(await client.post(f"/v1/runs/{run}/cancel"), 409, "run_ended")
    assert_http_error(await client.post("/v1/runs/none-such/cancel"), 404, "run_not_found")
    r = await client.post(f"/v1/runs/{run}/cancel", json={"why": 1})
    assert_http_error(r, 400, "invalid_argument")


async def test_the_journal_pages(client: httpx.AsyncClient, engine: fusee.Engine) -> None:
    run = _rid("j")
    await client.post("/v1/runs", json={"workflow": "hr-echo", "id": run, "input": "a"})
    await client.get(f"/v1/runs/{run}/result", params={"timeout": "15s"})
    whole = await engine.run(run).journal()
    got: list[int] = []
    after = 0
    while True:
        r = await client.get(f"/v1/runs/{run}/journal", params={"after": after, "limit": 1})
        assert r.status_code == 200, r.text
        page = r.json()
        got += [rec["seq"] for rec in page["records"]]
        assert len(page["records"]) <= 1
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert got == [seq for seq, _ in whole]
    first = (await client.get(f"/v1/runs/{run}/journal")).json()["records"][0]
    assert first["record"]["workflow"] == "hr-echo"
    assert_http_error(await client.get("/v1/runs/none-such/journal"), 404, "run_not_found")
    r = await client.get(f"/v1/runs/{run}/journal", params={"after": -1})
    assert_http_error(r, 400, "invalid_argument")


async def test_request_ids(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz", headers={"X-Request-ID": "trace-42"})
    assert r.headers["x-request-id"] == "trace-42"  # echoed
    r = await client.get("/v1/runs/none-such", headers={"X-Request-ID": "trace-43"})
    assert assert_http_error(r, 404, "run_not_found")["request_id"] == "trace-43"
    a, b = (await client.get("/healthz")).headers, (await client.get("/healthz")).headers
    assert a["x-request-id"] != b["x-request-id"]  # made when the client sends none
    r = await client.get("/healthz", headers={"X-Request-ID": "x" * 500})
    assert len(r.headers["x-request-id"]) < 100  # not usable: a new one
