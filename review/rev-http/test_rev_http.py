"""Repros of review rev-http (branch fix/http, issue 15): each test FAILS on fix/http
and passes once its defect is fixed. A real ``fusee api`` process and worker
(tests/workers/http_runs.py), httpx.

    PYTHONPATH=$PWD/src:$PWD /work/main/.venv/bin/python -m pytest -q -p no:xdist \
        review/rev-http/test_rev_http.py
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
import pytest
from tests.helpers import assert_http_error
from tests.workers.procs import HERE, served_api, wait_until
from tests.workers.procs import ServedApi as Api

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def api(nats_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("rev-http")
    with served_api(nats_server.url, tmp, HERE / "http_runs.py") as api:
        yield api


def _rid(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


async def _signalled_run(client: httpx.AsyncClient, payload: bytes) -> str:
    """An hr-wait run given signal ``go`` with ``payload``, once it completed."""
    run = _rid("rv-wait")
    r = await client.post("/v1/runs", json={"workflow": "hr-wait", "id": run})
    assert r.status_code == 201, r.text

    async def parked() -> Any:
        return (await client.get(f"/v1/runs/{run}")).json()["status"] == "waiting" or None

    await wait_until(parked, timeout=20, what=f"{run} waiting")
    r = await client.post(
        f"/v1/runs/{run}/signals/go", content=payload, headers={"content-type": "application/json"}
    )
    assert r.status_code == 202, r.text
    r = await client.get(f"/v1/runs/{run}/result", params={"timeout": "15s"})
    assert r.status_code == 200, r.text
    return run


# 1. GET /v1/runs/{id}/journal: paging drops records. A record that carries a wait's
# end (``waited``) is unfolded into two records with the SAME seq (runtime/records.py
# unfold); a page that ends between them gives next_after=S, and the next page takes
# seq > S: the second record is never served.
async def test_journal_pages_serve_every_record(client: httpx.AsyncClient) -> None:
    run = await _signalled_run(client, b'"x"')
    whole = (await client.get(f"/v1/runs/{run}/journal", params={"limit": 1000})).json()
    everything = [(r["seq"], r["record"]["kind"]) for r in whole["records"]]
    paged: list[tuple[int, str]] = []
    after = 0
    while True:
        page = (
            await client.get(f"/v1/runs/{run}/journal", params={"limit": 1, "after": after})
        ).json()
        paged += [(r["seq"], r["record"]["kind"]) for r in page["records"]]
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert paged == everything  # fix/http: run.completed (same seq as wait.done) missing


# 2. GET /v1/runs/{id}/result: a run that returned null answers without "result"
# (RunOutcome is omit_defaults with result=None); on main it was always there.
async def test_result_null_is_in_the_body(client: httpx.AsyncClient) -> None:
    run = await _signalled_run(client, b"null")
    r = await client.get(f"/v1/runs/{run}/result", params={"timeout": "5s"})
    assert r.json() == {"run_id": run, "status": "completed", "result": None}


# 3. HEAD on GET routes: Starlette answered HEAD for every GET route (main); Litestar
# answers 405, so `curl -I`, HEAD health checks of load balancers fail.
async def test_head_healthz(client: httpx.AsyncClient) -> None:
    r = await client.head("/healthz")
    assert r.status_code == 200, (r.status_code, r.headers)


# 4. Litestar decodes bodies with msgspec strict=False: strings are taken for numbers
# and booleans, which the document (type: number / integer / boolean) and main refuse.
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/v1/limits/rv-lax", {"per_second": "20"}),
        ("PUT", "/v1/limits/rv-lax", {"concurrent": "1e3"}),
        ("POST", "/v1/runs/rv-none/resume", {"force": "true"}),
        ("POST", "/v1/runs/bulk/cancel", {"dry_run": "true", "id_prefix": "rv-none-"}),
    ],
)
async def test_strings_are_not_numbers_or_booleans(
    client: httpx.AsyncClient, method: str, path: str, body: dict[str, Any]
) -> None:
    r = await client.request(method, path, json=body)
    error = assert_http_error(r, 400, "invalid_argument")
    assert next(iter(body)) in error["message"]


# 5. Litestar's OpenAPI router (mounted at /openapi, routes/app.py) answers unknown
# paths below it with its own HTML 404, not the one error shape.
async def test_unknown_path_under_openapi_has_the_error_shape(client: httpx.AsyncClient) -> None:
    r = await client.get("/openapi/swagger")
    assert_http_error(r, 404, "not_found")


# 6. GET /v1/runs: the docs and the route's description say "newest first within a
# page"; the listing is oldest first.
async def test_list_is_newest_first_as_documented(client: httpx.AsyncClient) -> None:
    tag = secrets.token_hex(3)
    runs = [f"rv-ord-{tag}-{i}" for i in range(3)]
    for run in runs:  # one after the other: created_at increases
        await client.post("/v1/runs", json={"workflow": "hr-echo", "id": run, "input": "x"})
        await client.get(f"/v1/runs/{run}/result", params={"timeout": "15s"})
    r = await client.get("/v1/runs", params={"status": "completed", "id_prefix": f"rv-ord-{tag}"})
    listed = [i["run_id"] for i in r.json()["runs"]]
    assert listed == list(reversed(runs))


# 7. A cursor whose position does not fit in a u64 (a client can build one: the
# fingerprint is a hash of the filters) is a 500 with code fusee_error.
async def test_a_made_up_cursor_is_a_400(client: httpx.AsyncClient) -> None:
    fingerprint = hashlib.sha256(msgspec.json.encode((None,) * 5)).hexdigest()[:12]
    raw = msgspec.json.encode([0, 2**70, fingerprint])
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    r = await client.get("/v1/runs", params={"cursor": cursor})
    assert_http_error(r, 400, "invalid_argument")


# 8. The generated document is stricter than the server: IDs are documented as at most
# 64 characters (schemas.ID_SCHEMA) while the server takes 256 UTF-8 bytes (and child
# runs' IDs, "<run>/<call>-<hex>", grow past 64). A client or gateway validating against
# the document refuses real IDs.
async def test_the_document_takes_the_ids_the_server_takes(client: httpx.AsyncClient) -> None:
    run = "rv-long-" + "x" * 120
    r = await client.post("/v1/runs", json={"workflow": "hr-echo", "id": run, "input": "x"})
    assert r.status_code == 201, r.text
    doc = (await client.get("/openapi.json")).json()
    start = doc["components"]["schemas"]["StartRun"]["properties"]["id"]
    assert start.get("maxLength", 10**9) >= len(run), start
    path = doc["paths"]["/v1/runs/{run_id}"]["get"]["parameters"][0]["schema"]
    assert path.get("maxLength", 10**9) >= len(run), path
    assert (await client.get(f"/v1/runs/{quote(run, safe='')}")).status_code == 200


# 9. The completion callback takes a body (any JSON, or the page's form) and answers
# text/html to a form or a browser; the document lists no requestBody for the POST and
# only application/json answers, so a client generated from it cannot send the value.
async def test_the_document_has_the_completion_body(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    post = doc["paths"]["/v1/completions/{token}"]["post"]
    assert "requestBody" in post, sorted(post)
    assert "text/html" in post["responses"]["200"]["content"], post["responses"]["200"]


# 10. OPTIONS /v1/runs answers `allow: OPTIONS, POST` (GET missing).
async def test_options_allow_lists_every_method(client: httpx.AsyncClient) -> None:
    r = await client.options("/v1/runs")
    allowed = {m.strip() for m in r.headers.get("allow", "").split(",")}
    assert {"GET", "POST"} <= allowed, r.headers
