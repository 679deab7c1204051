"""The defects review rev-http found in the Litestar API (issue 15), each a test that
failed before its fix: journal paging, a null result, HEAD and OPTIONS, strict
decoding, the error shape under /openapi/, made-up cursors, the document against the
server (IDs, the completion body), the listing's order, the run ID ``bulk``, a
``curl -d true`` completion. A real ``fusee api`` process and worker
(tests/workers/http_runs.py), httpx.
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


# 6. GET /v1/runs: the docs said "newest first within a page"; the listing reads the
# index forward (oldest first), and now says so (design.md: reading it backward is open).
async def test_list_is_in_the_documented_order(client: httpx.AsyncClient) -> None:
    tag = secrets.token_hex(3)
    runs = [f"rv-ord-{tag}-{i}" for i in range(3)]
    for run in runs:  # one after the other: created_at increases
        await client.post("/v1/runs", json={"workflow": "hr-echo", "id": run, "input": "x"})
        await client.get(f"/v1/runs/{run}/result", params={"timeout": "15s"})
    r = await client.get("/v1/runs", params={"status": "completed", "id_prefix": f"rv-ord-{tag}"})
    listed = [i["run_id"] for i in r.json()["runs"]]
    assert listed == runs  # each ended after the one before
    doc = (await client.get("/openapi.json")).json()
    assert "oldest first" in doc["paths"]["/v1/runs"]["get"]["description"]


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


# -- beside the repros: the rest of each fix -------------------------------------------


async def test_head_on_reads_has_the_headers_of_get_and_no_body(
    client: httpx.AsyncClient,
) -> None:
    run = _rid("rv-head")
    r = await client.post("/v1/runs", json={"workflow": "hr-echo", "id": run, "input": "x"})
    assert r.status_code == 201, r.text
    # ended first: a run still running can change between the GET and the HEAD
    assert (await client.get(f"/v1/runs/{run}/result")).status_code == 200
    for path in (f"/v1/runs/{run}", "/v1/runs", "/openapi.json", "/v1/limits"):
        got, head = await client.get(path), await client.head(path)
        assert (head.status_code, head.content) == (got.status_code, b""), path
        assert head.headers["content-type"] == got.headers["content-type"], path
        assert head.headers["content-length"] == got.headers["content-length"], path
    r = await client.head("/v1/runs/nope")  # an error: its status and headers
    assert (r.status_code, r.content) == (404, b"")
    assert r.headers["content-type"].startswith("application/json")


async def test_options_and_405_list_every_method(client: httpx.AsyncClient) -> None:
    for path, methods in (
        ("/healthz", "GET, HEAD, OPTIONS"),
        ("/v1/runs", "GET, HEAD, OPTIONS, POST"),
        ("/v1/runs/x/cancel", "OPTIONS, POST"),
        ("/v1/limits/x", "GET, HEAD, OPTIONS, PUT"),
    ):
        r = await client.options(path)
        assert (r.status_code, r.headers["allow"]) == (204, methods), path
    r = await client.delete("/v1/runs")
    assert_http_error(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "GET, HEAD, OPTIONS, POST"


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v1/runs", {"limit": "1.0"}),
        ("/v1/runs", {"limit": "1e1"}),
        ("/v1/runs", {"limit": " 5"}),
        ("/v1/runs/rv-none/journal", {"after": "0.0"}),
        ("/v1/runs/rv-none/journal", {"limit": "true"}),
        ("/v1/runs/rv-none/journal", {"after": str(2**70)}),  # past a stream sequence
    ],
)
async def test_numeric_query_parameters_are_strict(
    client: httpx.AsyncClient, path: str, params: dict[str, str]
) -> None:
    r = await client.get(path, params=params)
    assert next(iter(params)) in assert_http_error(r, 400, "invalid_argument")["message"]


async def test_strict_bodies_still_take_what_they_document(client: httpx.AsyncClient) -> None:
    name = f"rv-strict-{secrets.token_hex(3)}"
    r = await client.put(f"/v1/limits/{name}", json={"per_second": 20, "burst": 5})
    assert r.status_code == 200, r.text  # an integer is a number
    r = await client.put(f"/v1/limits/{name}", json={"concurrent": 3.0})
    assert r.json()["concurrent"] == 3, r.text  # a whole number is an integer (JSON Schema)
    r = await client.put(f"/v1/limits/{name}", json={"concurrent": 3.5})
    assert "concurrent" in assert_http_error(r, 400, "invalid_argument")["message"]
    r = await client.post("/v1/runs", json={"workflow": "hr-echo", "id": 7})
    assert "'id'" in assert_http_error(r, 400, "invalid_argument")["message"]
    r = await client.post("/v1/runs/bulk/cancel", json={"dry_run": 1, "id_prefix": "rv-none-"})
    assert "dry_run" in assert_http_error(r, 400, "invalid_argument")["message"]
    r = await client.post("/v1/runs/bulk/cancel", json={"dry_run": True, "id_prefix": "rv-none-"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", ["/openapi", "/openapi/", "/openapi/openapi.json", "/openapi/x/y"])
async def test_nothing_is_served_under_openapi(client: httpx.AsyncClient, path: str) -> None:
    assert_http_error(await client.get(path), 404, "not_found")


def _cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode(value)).decode().rstrip("=")


@pytest.mark.parametrize(
    "value",
    [
        [-1, 1, "x"],
        [0, 0, "x"],
        [10**6, 1, "x"],
        [True, 1, "x"],
        [0, 1.5, "x"],
        [0, 1],
        {"stage": 0},
        "abc",
    ],
)
async def test_every_cursor_field_is_checked(client: httpx.AsyncClient, value: Any) -> None:
    r = await client.get("/v1/runs", params={"cursor": _cursor(value)})
    assert "cursor" in assert_http_error(r, 400, "invalid_argument")["message"]
    r = await client.get("/v1/runs", params={"cursor": "!!not base64"})
    assert_http_error(r, 400, "invalid_argument")


async def test_the_run_id_bulk_is_refused(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/runs", json={"workflow": "hr-echo", "id": "bulk", "input": "x"})
    assert "reserved" in assert_http_error(r, 400, "invalid_id")["message"]
    r = await client.post("/v1/runs", json={"workflow": "hr-echo", "id": "bulk/x", "input": "x"})
    assert r.status_code == 201, r.text  # only the one segment the bulk routes take


async def test_the_document_takes_names_of_128(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    signal = doc["paths"]["/v1/runs/{run_id}/signals/{name}"]["post"]["parameters"]
    name = next(p for p in signal if p["name"] == "name")
    assert name["schema"]["maxLength"] == 128
    r = await client.post(f"/v1/runs/rv-none/signals/{'n' * 128}", json=1)
    assert_http_error(r, 404, "run_not_found")  # the name was taken


@pytest.mark.parametrize(
    "params", [{"workflow": "\x80l"}, {"workflow": "w" * 129}, {"id_prefix": "a\x07"}]
)
async def test_a_filter_no_run_can_match_is_a_400(
    client: httpx.AsyncClient, params: dict[str, str]
) -> None:
    # found by schemathesis's negative checks: the document's pattern refuses it
    r = await client.get("/v1/runs", params=params)
    assert next(iter(params)) in assert_http_error(r, 400, "config_error")["message"]
    r = await client.post("/v1/runs/bulk/cancel", json={**params, "dry_run": True})
    assert_http_error(r, 400, "config_error")


async def test_the_document_takes_a_null_time_bound(client: httpx.AsyncClient) -> None:
    # found by schemathesis's negative checks: the server takes "since": null (no bound)
    doc = (await client.get("/openapi.json")).json()
    since = doc["components"]["schemas"]["BulkCancel"]["properties"]["since"]
    assert {"type": "null"} in since["anyOf"], since
    body = {"since": None, "dry_run": True, "id_prefix": "rv-none-"}
    assert (await client.post("/v1/runs/bulk/cancel", json=body)).status_code == 200
