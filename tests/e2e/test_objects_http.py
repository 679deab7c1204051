"""The objects routes of the HTTP API against real processes: ``fusee api`` and a worker
serving ``tests/workers/objects.py`` on a real nats-server, spoken to with httpx.

One API process and one worker serve the whole module (each test uses its own keys).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import pytest

import fusee
from tests.helpers import assert_http_error
from tests.workers.procs import HERE, served_api
from tests.workers.procs import ServedApi as Api

OBJECTS = HERE / "objects.py"


@pytest.fixture(scope="module")
def api(nats_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("objects-http")
    with served_api(nats_server.url, tmp, OBJECTS) as api:
        yield api


def _key(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The one error shape; returns its ``error`` object."""
    return assert_http_error(response, status, code)


async def wait_running(engine: fusee.Engine, key: str, seq: int) -> None:
    with anyio.fail_after(15):
        while True:
            info = await engine.object("counter", key).show()
            if info.running is not None and info.running.seq == seq:
                return
            await anyio.sleep(0.05)


# -- reading ----------------------------------------------------------------------------


async def test_call_then_list_show_and_get_the_state(client: httpx.AsyncClient) -> None:
    key = _key("tally")
    r = await client.post(f"/v1/objects/counter/{key}/call/add", json={"client": "h", "n": 1})
    assert (r.status_code, r.json()) == (200, {"result": 1})
    r = await client.post(f"/v1/objects/counter/{key}/call/add", json={"client": "h", "n": 2})
    assert r.json() == {"result": 2}

    r = await client.get(f"/v1/objects/counter/{key}/state")
    assert (r.status_code, r.json()) == (200, {"count": 2, "seen": ["h:1", "h:2"]})
    r = await client.get(f"/v1/objects/counter/{_key('never')}/state")
    assert (r.status_code, r.json()) == (200, {})

    r = await client.get("/v1/objects/counter")
    assert r.status_code == 200, r.text
    keys = {e["key"]: e["state"] for e in r.json()["keys"]}
    assert keys[key] == {"count": 2, "seen": ["h:1", "h:2"]}
    assert list(keys) == sorted(keys)

    r = await client.get(f"/v1/objects/counter/{key}")
    assert r.status_code == 200, r.text
    shown = r.json()
    assert shown["object_type"] == "counter"
    assert shown["key"] == key
    assert shown["state"] == {"count": 2, "seen": ["h:1", "h:2"]}
    assert (shown["running"], shown["waiting"]) == (None, [])
    assert shown["last"]["handler"] == "add"
    assert shown["last"]["ok"] is True

    # a key with a slash is one path segment, its slash written %2F
    slashed = quote(f"{key}/sub", safe="")
    r = await client.post(f"/v1/objects/counter/{slashed}/call/add", json={"n": 1})
    assert r.json() == {"result": 1}
    r = await client.get(f"/v1/objects/counter/{slashed}/state")
    assert r.json() == {"count": 1, "seen": ["None:1"]}


async def test_keys_that_look_like_routes_address_themselves(client: httpx.AsyncClient) -> None:
    base = _key("k9")
    looks_like_state = quote(f"{base}/state", safe="")
    r = await client.post(f"/v1/objects/counter/{looks_like_state}/call/add", json={"n": 7})
    assert r.json() == {"result": 1}
    shown = (await client.get(f"/v1/objects/counter/{looks_like_state}")).json()
    assert shown["key"] == f"{base}/state"  # its show, not the state of key "k9-…"
    assert shown["state"]["count"] == 1
    assert (await client.get(f"/v1/objects/counter/{base}/state")).json() == {}
    # a type is one segment too, and may not hold a slash
    assert_error(await client.get("/v1/objects/a%2Fb/k"), 400, "invalid_id")


async def test_send_shows_the_queue_and_cancel_takes_an_invocation_off(
    client: httpx.AsyncClient, engine: fusee.Engine
) -> None:
    key = _key("queue")
    r = await client.post(f"/v1/objects/counter/{key}/send/approve", json={})
    assert r.status_code == 202, r.text
    held = r.json()["seq"]
    r = await client.post(f"/v1/objects/counter/{key}/send/add", json={"n": 1})
    queued = r.json()["seq"]
    assert queued > held
    await wait_running(engine, key, held)

    shown = (await client.get(f"/v1/objects/counter/{key}")).json()
    assert shown["running"]["seq"] == held
    assert shown["running"]["handler"] == "approve"
    assert shown["running"]["running_since"] > 0
    assert [(w["seq"], w["handler"]) for w in shown["waiting"]] == [(queued, "add")]

    r = await client.post(f"/v1/objects/counter/{key}/cancel", json={"seq": queued})
    assert (r.status_code, r.json()) == (202, {"seq": queued, "reason": "cancelled over HTTP"})
    r = await client.post(f"/v1/objects/counter/{key}/cancel", json={"reason": "enough"})
    assert (r.status_code, r.json()) == (202, {"seq": held, "reason": "enough"})
    obj = engine.object("counter", key)
    with pytest.raises(fusee.HandlerCancelled, match="enough"):
        await obj.result(held, timeout="15s")
    with pytest.raises(fusee.HandlerCancelled):
        await obj.result(queued, timeout="15s")
    assert await obj.state() == {}  # neither changed anything

    r = await client.post(f"/v1/objects/counter/{key}/cancel")
    assert "nothing queued" in assert_error(r, 409, "nothing_to_cancel")["message"]
    for body in ({"seq": 0}, {"seq": -1}, {"reason": 3}, {"what": 1}, [1]):
        r = await client.post(f"/v1/objects/counter/{key}/cancel", json=body)
        assert_error(r, 400, "invalid_argument")


# -- editing ----------------------------------------------------------------------------


async def test_patch_and_delete_the_state(client: httpx.AsyncClient, engine: fusee.Engine) -> None:
    key = _key("edit")
    url = f"/v1/objects/counter/{key}/state"
    await client.post(f"/v1/objects/counter/{key}/call/add", json={"client": "h", "n": 1})

    r = await client.patch(url, json={"set": {"count": 10, "tags": ["x"]}, "delete": ["seen"]})
    assert (r.status_code, r.json()) == (200, {"count": 10, "tags": ["x"]})
    r = await client.post(f"/v1/objects/counter/{key}/call/add", json={})
    assert r.json() == {"result": 11}  # handlers see the edit

    r = await client.patch(url, json={"state": {"only": True}})
    assert (r.status_code, r.json()) == (200, {"only": True})
    r = await client.patch(url, json={"clear": True, "set": {"fresh": 1}})
    assert r.json() == {"fresh": 1}

    r = await client.delete(url)
    assert (r.status_code, r.json()) == (200, {})
    assert await engine.object("counter", key).state() == {}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"set": {"a": 1}', "not valid JSON"),
        (b"[1, 2]", "the body: Expected `object`, got `array`"),
        (b'{"set": [1]}', "the body's field 'set': Expected `object | null`"),
        (b'{"delete": "count"}', "the body's field 'delete': Expected `array | null`"),
        (b'{"state": {"a": 1}, "set": {"b": 2}}', "send it without"),
        (b'{"clear": "yes"}', "the body's field 'clear': Expected `bool`"),
        (b'{"sett": {"a": 1}}', "unknown field `sett`"),
        (b"{}", "nothing to edit"),
        (b"", "the body: missing"),
    ],
)
async def test_a_bad_edit_is_400_and_changes_nothing(
    client: httpx.AsyncClient, engine: fusee.Engine, body: bytes, says: str
) -> None:
    key = _key("bad-edit")
    await client.post(f"/v1/objects/counter/{key}/call/add", json={"client": "h", "n": 1})
    before = await engine.object("counter", key).show()
    r = await client.patch(f"/v1/objects/counter/{key}/state", content=body)
    assert says in assert_error(r, 400, "invalid_argument")["message"]
    after = await engine.object("counter", key).show()
    assert after.state == before.state == {"count": 1, "seen": ["h:1"]}
    assert after.last == before.last  # nothing ran
    assert after.waiting == []  # nothing was queued


# -- calls ------------------------------------------------------------------------------


async def test_a_failing_handler_unknown_handler_and_timeout(
    client: httpx.AsyncClient, engine: fusee.Engine
) -> None:
    key = _key("fail")
    await client.post(f"/v1/objects/counter/{key}/call/add", json={"client": "h", "n": 1})

    r = await client.post(f"/v1/objects/counter/{key}/call/fail", json={"message": "boom"})
    error = assert_error(r, 500, "handler_failed")
    assert error == {
        "code": "handler_failed",
        "message": "boom",
        "request_id": r.headers["x-request-id"],
        "error_type": "ValueError",
        "handler": "fail",
    }
    r = await client.get(f"/v1/objects/counter/{key}/state")
    assert r.json() == {"count": 1, "seen": ["h:1"]}  # the failed handler changed nothing

    r = await client.post(f"/v1/objects/counter/{key}/call/nosuch")
    error = assert_error(r, 404, "unknown_handler")
    assert "no handler 'nosuch'" in error["message"]

    started = time.monotonic()
    r = await client.post(f"/v1/objects/counter/{key}/call/approve?timeout=300ms", json={})
    assert "stays queued or running" in assert_error(r, 504, "timeout")["message"]
    assert time.monotonic() - started < 5
    # the invocation went on: cancel it, and the call of it answers 409
    shown = (await client.get(f"/v1/objects/counter/{key}")).json()
    pending = (shown["running"] or shown["waiting"][0])["seq"]
    async with anyio.create_task_group() as tg:
        answers: list[httpx.Response] = []

        async def call_again() -> None:
            answers.append(await client.post(f"/v1/objects/counter/{key}/call/approve", json={}))

        tg.start_soon(call_again)
        await wait_running(engine, key, pending)
        await client.post(f"/v1/objects/counter/{key}/cancel", json={"seq": pending})
        await wait_running(engine, key, pending + 2)  # the second approve (after the cancel)
        await client.post(f"/v1/objects/counter/{key}/cancel", json={"reason": "stop"})
    error = assert_error(answers[0], 409, "handler_cancelled")
    assert (error["message"], error["error_type"]) == ("stop", "fusee.Cancelled")


async def test_idempotency_key_runs_a_call_once(client: httpx.AsyncClient) -> None:
    key = _key("once")
    url = f"/v1/objects/counter/{key}/call/add"
    headers = {"Idempotency-Key": "order-1"}
    first = await client.post(url, json={"n": 1}, headers=headers)
    again = await client.post(url, json={"n": 1}, headers=headers)
    assert first.json() == again.json() == {"result": 1}
    r = await client.post(f"/v1/objects/counter/{key}/send/add", json={}, headers=headers)
    assert r.status_code == 202
    r = await client.post(url, json={"n": 2})
    assert r.json() == {"result": 2}  # the retries did not run again


async def test_bad_names_and_bodies(client: httpx.AsyncClient) -> None:
    key = _key("bad")
    r = await client.get("/v1/objects/bad%09type/k/state")
    assert "invalid object type" in assert_error(r, 400, "invalid_id")["message"]
    r = await client.get("/v1/objects/counter/a%01b")
    assert_error(r, 400, "invalid_id")
    r = await client.get("/v1/objects/%40counter")
    assert_error(r, 400, "invalid_id")
    r = await client.post(f"/v1/objects/counter/{key}/call/add", content=b"{nope")
    assert "the body is not valid JSON" in assert_error(r, 400, "invalid_argument")["message"]
    deep = b"[" * 10_000 + b"]" * 10_000
    r = await client.post(f"/v1/objects/counter/{key}/call/add", content=deep)
    assert "the body nests too deeply" in assert_error(r, 400, "invalid_argument")["message"]
    r = await client.post(f"/v1/objects/counter/{key}/call/add", json={"b": "x" * 2_000_000})
    assert "is 2,000,008 bytes" in assert_error(r, 413, "payload_too_large")["message"]
    # under the body limit, over what one message holds with its envelope: a clear 400
    r = await client.post(f"/v1/objects/counter/{key}/call/add", json={"b": "x" * 1_040_000})
    assert "bytes as JSON" in assert_error(r, 400, "not_encodable")["message"]
    r = await client.post(f"/v1/objects/counter/{key}/call/add?timeout=10m", json={})
    assert_error(r, 400, "invalid_argument")
    r = await client.post(f"/v1/objects/counter/{key}/call/add", headers={"Idempotency-Key": ""})
    assert_error(r, 400, "invalid_id")
    r = await client.put(f"/v1/objects/counter/{key}/state")
    allowed = assert_error(r, 405, "method_not_allowed")["message"].split("allowed: ", 1)[1]
    assert {"GET", "PATCH", "DELETE"} <= set(allowed.rstrip(")").split(", "))
    r = await client.get(f"/v1/objects/counter/{key}/state")
    assert r.json() == {}  # none of the above ran anything


async def test_openapi_documents_the_object_routes(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    paths = doc["paths"]
    assert set(paths["/v1/objects/{object_type}/{key}/state"]) == {"get", "patch", "delete"}
    for path in (
        "/v1/objects/{object_type}",
        "/v1/objects/{object_type}/{key}",
        "/v1/objects/{object_type}/{key}/state",
        "/v1/objects/{object_type}/{key}/call/{handler}",
        "/v1/objects/{object_type}/{key}/send/{handler}",
        "/v1/objects/{object_type}/{key}/cancel",
    ):
        assert path in paths
        for op in paths[path].values():
            assert op["responses"], path
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == set(path.replace("}", "{").split("{")[1::2]), path
    call = paths["/v1/objects/{object_type}/{key}/call/{handler}"]["post"]
    assert {"200", "404", "409", "500", "504"} <= set(call["responses"])
    schemas = doc["components"]["schemas"]
    for name in ("ObjectInfo", "ObjectEdit", "ObjectKeys", "CallResult"):
        assert name in schemas
