"""The limits routes of the HTTP API against real processes: ``fusee api`` and a worker
serving ``tests/workers/limits.py`` on a real nats-server, spoken to with httpx.

One API process and one worker serve the module (each test uses its own limits).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import fusee
from tests.helpers import assert_http_error
from tests.workers.procs import HERE, served_api, wait_until
from tests.workers.procs import ServedApi as Api

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def api(nats_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("limits-http")
    with served_api(nats_server.url, tmp, HERE / "limits.py") as api:
        yield api


def assert_error(response: httpx.Response, status: int, code: str) -> str:
    """The one error shape; returns the message."""
    message: str = assert_http_error(response, status, code)["message"]
    return message


def _limit(name: str, per_second: float | None, burst: int | None, concurrent: int | None,
           holders: int = 0, waiters: dict[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "name": name,
        "per_second": per_second,
        "burst": burst,
        "concurrent": concurrent,
        "holders": holders,
        "waiters": waiters or {},
    }


async def test_put_changes_what_is_given_and_get_shows_it(client: httpx.AsyncClient) -> None:
    name = f"team/openai-{secrets.token_hex(3)}"  # a "/" in a name: %2F in the path
    path = f"/v1/limits/{name.replace('/', '%2F')}"
    assert "unknown_limit" in (r := await client.get(path)).text
    assert name in assert_error(r, 404, "unknown_limit")

    r = await client.put(path, json={"per_second": 20, "concurrent": 4})
    assert r.status_code == 200, r.text
    assert r.json() == _limit(name, 20, 20, 4)  # the default burst: one second's worth
    assert (await client.get(path)).json() == _limit(name, 20, 20, 4)
    listed = (await client.get("/v1/limits")).json()["limits"]
    assert _limit(name, 20, 20, 4) in listed

    # a burst alone keeps the rate and the cap
    r = await client.put(path, json={"burst": 7})
    assert r.json() == _limit(name, 20, 7, 4), r.text
    # a new rate alone gets its default burst, and keeps the cap
    r = await client.put(path, json={"per_second": 50})
    assert r.json() == _limit(name, 50, 50, 4), r.text
    # null removes the cap
    r = await client.put(path, json={"concurrent": None})
    assert r.json() == _limit(name, 50, 50, None), r.text
    assert (await client.get(path)).json() == _limit(name, 50, 50, None)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"per_second": -5}, "per_second must be a positive number, not -5"),
        ({"per_second": 0}, "per_second must be a positive number"),
        ({"concurrent": 0}, "concurrent must be a whole number of at least 1, not 0"),
        ({"burst": 2.5}, "the body's field 'burst': Expected `int | null`, got `float`"),
        ({"concurrent": [5]}, "the body's field 'concurrent': Expected `int | null`"),
        ({"per_second": None}, "give per_second=, concurrent= or both"),  # nothing left
        ({"speed": 3}, "unknown field `speed`"),
        ([1, 2], "the body: Expected `object`, got `array`"),
    ],
)
async def test_bad_input_is_a_400_naming_it_and_nothing_is_stored(
    client: httpx.AsyncClient, body: Any, says: str
) -> None:
    name = f"bad-{secrets.token_hex(3)}"
    r = await client.put(f"/v1/limits/{name}", json={"per_second": 10})
    assert r.status_code == 200, r.text
    before = (await client.get("/v1/limits")).json()
    r = await client.put(f"/v1/limits/{name}", json=body)
    assert says in assert_error(r, 400, "invalid_argument")
    assert (await client.get("/v1/limits")).json() == before  # nothing stored


async def test_bad_names_and_bodies(client: httpx.AsyncClient) -> None:
    before = (await client.get("/v1/limits")).json()
    assert "limit name" in assert_error(await client.get("/v1/limits/a%09b"), 400, "invalid_id")
    r = await client.put("/v1/limits/a%09b", json={"per_second": 1})
    assert "limit name" in assert_error(r, 400, "invalid_id")
    r = await client.put("/v1/limits/fresh", content=b"{not json")
    assert "not valid JSON" in assert_error(r, 400, "invalid_argument")
    # a new limit needs a rate or a cap; a burst needs a rate
    r = await client.put("/v1/limits/fresh", json={})
    assert "give per_second=, concurrent= or both" in assert_error(r, 400, "invalid_argument")
    r = await client.put("/v1/limits/fresh", json={"burst": 3, "concurrent": 2})
    assert "burst= needs per_second=" in assert_error(r, 400, "invalid_argument")
    assert (await client.get("/v1/limits")).json() == before
    assert_error(await client.get("/v1/limits/fresh"), 404, "unknown_limit")


async def test_holders_and_waiters_per_fairness_key(
    client: httpx.AsyncClient, engine: fusee.Engine, tmp_path: Path
) -> None:
    """The worker's ``limited`` steps take permits of limit ``k``; GET shows who holds
    and who waits, a PUT raising the cap lets one more in."""
    r = await client.put("/v1/limits/k", json={"concurrent": 1})
    assert r.status_code == 200, r.text
    arg = {"dir": str(tmp_path), "slots": 2}
    first = await engine.start("limited", "http-k-1", {**arg, "tenant": "a"})
    await wait_until(lambda: (tmp_path / "held-http-k-1").exists(), timeout=30, what="a holder")
    runs = [first]
    for i, tenant in ((2, "a"), (3, "b"), (4, "b")):
        runs.append(await engine.start("limited", f"http-k-{i}", {**arg, "tenant": tenant}))

    async def queued() -> bool:
        # (the first may be granted on core NATS: no request of it in the inbox)
        info = (await client.get("/v1/limits/k")).json()
        return bool(info == _limit("k", None, None, 1, holders=1, waiters={"a": 1, "b": 2}))

    await wait_until(queued, timeout=30, what="one holder and the 3 waiters")
    # one more permit: the next key in turn ("a", queued first) gets it
    r = await client.put("/v1/limits/k", json={"concurrent": 2})
    assert r.json()["concurrent"] == 2, r.text

    async def two_held() -> Any:
        info = (await client.get("/v1/limits/k")).json()
        return info if info["holders"] == 2 else None

    info = await wait_until(two_held, timeout=30, what="two holders")
    assert info == _limit("k", None, None, 2, holders=2, waiters={"b": 2})
    assert info in (await client.get("/v1/limits")).json()["limits"]
    assert (tmp_path / "held-http-k-2").exists()

    (tmp_path / "release").touch()
    for run in runs:
        assert await run.result(timeout=60) == "ok"
    assert not (tmp_path / "overflow").exists()

    async def idle() -> Any:
        info = (await client.get("/v1/limits/k")).json()
        return info if info["holders"] == 0 and not info["waiters"] else None

    await wait_until(idle, timeout=30, what="nothing held, nobody waiting")
