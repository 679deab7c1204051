"""The callback URL ``ctx.await_completion`` hands out, served by the HTTP API: a person
opens it (a page with two buttons), or a program posts a JSON value to it."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx

import fusee
from fusee.adapters.http import serve_api

URLS: dict[str, str] = {}


@fusee.workflow("http_approval")
async def http_approval(ctx: fusee.Context, run: str) -> Any:
    def ask(cb: fusee.Completion) -> None:
        URLS[run] = cb.url

    return await ctx.await_completion("ship-it", ask=ask, timeout="1h")


@contextlib.asynccontextmanager
async def _served(nats_url: str, namespace: str) -> AsyncIterator[tuple[fusee.Engine, str]]:
    """The API on one engine, and a worker on another whose callback URLs point at it."""
    async with (
        await fusee.connect(nats_url, namespace=namespace) as api_engine,
        anyio.create_task_group() as tg,
    ):
        bound = await tg.start(functools.partial(serve_api, api_engine, port=0))
        async with (
            await fusee.connect(
                nats_url, namespace=namespace, callback_base_url=bound.url
            ) as engine,
            engine.worker(),
        ):
            yield engine, bound.url
        tg.cancel_scope.cancel()


async def _url(engine: fusee.Engine, run: str) -> str:
    await engine.start(http_approval, run, run)
    with anyio.fail_after(15):
        while run not in URLS:
            await anyio.sleep(0.02)
    return URLS[run]


async def test_a_person_opens_the_url_and_rejects_with_a_reason(
    nats_server: Any, namespace: str
) -> None:
    async with _served(nats_server.url, namespace) as (engine, base):
        await _by_hand(engine, base)


async def _by_hand(engine: fusee.Engine, base: str) -> None:
    url = await _url(engine, "by-hand")
    assert url.startswith(f"{base}/v1/completions/")
    async with httpx.AsyncClient(timeout=20) as client:
        shown = (await client.get(url, headers={"Accept": "application/json"})).json()
        assert (shown["run_id"], shown["name"], shown["status"]) == (
            "by-hand",
            "ship-it",
            "waiting",
        )
        page = await client.get(url, headers={"Accept": "text/html"})
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert 'value="true"' in page.text
        assert 'value="false"' in page.text
        assert "ship-it" in page.text
        answered = await client.post(url, data={"approved": "false", "reason": "too much"})
        assert answered.status_code == 200
        assert "Answered" in answered.text
    assert await engine.run("by-hand").result(timeout=15) == {
        "approved": False,
        "reason": "too much",
    }


async def test_a_program_posts_json_once(nats_server: Any, namespace: str) -> None:
    async with _served(nats_server.url, namespace) as (engine, _):
        await _by_program(engine)


async def _by_program(engine: fusee.Engine) -> None:
    url = await _url(engine, "by-program")
    async with httpx.AsyncClient(timeout=20) as client:
        r = await client.post(url, json=True)
        assert r.json() == {"completed": True, "stored": True, "value": True}
        r = await client.post(url, json=True)  # a retry, a second click
        assert r.json() == {"completed": True, "stored": False, "value": True}
        assert await engine.run("by-program").result(timeout=15) is True
        r = await client.post(url, json=False)
        assert r.status_code == 409
        assert r.json()["error"]["code"] == "invalid_token"
        shown = (await client.get(url)).json()
        assert (shown["status"], shown["value"]) == ("completed", True)
        # a token changed anywhere, even in bits that decode the same, names nothing
        prefix, _, mac = url.rpartition(".")
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        spare = prefix + "." + mac[:-1] + alphabet[alphabet.index(mac[-1]) | 3]
        for bad in (spare, url + "x", f"{url.rsplit('/', 1)[0]}/nope"):
            r = await client.post(bad, json=True)
            assert r.status_code == 404, (bad, r.text)
            assert r.json()["error"]["code"] == "invalid_token"
        r = await client.post(url, content=b"{not json")
        assert r.status_code in (400, 409)


async def test_null_is_a_value_and_an_empty_body_is_not(nats_server: Any, namespace: str) -> None:
    async with _served(nats_server.url, namespace) as (engine, _):
        url = await _url(engine, "by-null")
        async with httpx.AsyncClient(timeout=20) as client:
            r = await client.post(url, content=b"", headers={"content-type": "application/json"})
            assert r.status_code == 400
            assert "missing" in r.json()["error"]["message"]
            r = await client.post(
                url, content=b"null", headers={"content-type": "application/json"}
            )
            assert r.json() == {"completed": True, "stored": True, "value": None}
        assert await engine.run("by-null").result(timeout=15) is None


async def test_curl_d_true_completes(nats_server: Any, namespace: str) -> None:
    # `curl -X POST URL -d true` sends `true` as a form (application/x-www-form-urlencoded)
    form = {"content-type": "application/x-www-form-urlencoded", "accept": "*/*"}
    async with _served(nats_server.url, namespace) as (engine, _):
        url = await _url(engine, "by-curl")
        async with httpx.AsyncClient(timeout=20) as client:
            r = await client.post(url, content=b"reason=no", headers=form)
            assert r.status_code == 400, r.text
            assert "approved=true|false" in r.json()["error"]["message"]
            r = await client.post(url, content=b"true", headers=form)
            assert r.json() == {"completed": True, "stored": True, "value": True}
        assert await engine.run("by-curl").result(timeout=15) is True
