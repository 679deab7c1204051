"""The web UI (``/ui``) in headless Chromium, against a real ``fusee api`` process (auth
on), a real worker process and a real nats-server: log in, watch runs change status
live, bulk-cancel one, resume a paused one, follow a token stream as the test releases
its tokens, send a signal, approve, edit an object's state, read the limits; each
checked in the page and in NATS (the journal, the object's state). Screenshots of each
page go under the test's ``tmp_path`` and must not be blank; the browser's console must
stay free of errors. The run page of a 500-step run is timed (printed, not asserted:
docs/ui.md has the figure).
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, ConsoleMessage, Page, async_playwright, expect

import fusee
from fusee.runtime.records import RunCancelled, RunResumed
from tests.e2e.browser import ARGS, COUNT_COLOURS, chromium
from tests.workers.procs import HERE, Workers, api_server, started, wait_until
from tests.workers.ui import token

# a page's answer waits on a worker's round trip through NATS: on 2 loaded cores that
# can take more than Playwright's default 5 s
expect.set_options(timeout=20_000)

STEPS = 500  # the long run's steps
TOKENS = 6  # the streamed run's tokens


class Served:
    def __init__(self, base: str, nats: str, namespace: str, tmp: Path) -> None:
        self.base, self.nats, self.namespace, self.tmp = base, nats, namespace, tmp


@pytest.fixture(scope="module")
def served(nats_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("ui")
    namespace = f"t{secrets.token_hex(4)}"
    workers = Workers(nats_server.url, namespace, tmp, module=HERE / "ui.py")
    with api_server(nats_server.url, namespace, tmp, auth=True) as server:
        try:
            worker = workers.spawn()
            serving = started(server, "api.serving")
            started(worker, "worker.started")
            yield Served(str(serving["url"]), nats_server.url, namespace, tmp)
        finally:
            workers.cleanup()


@pytest.fixture
async def engine(served: Served) -> AsyncIterator[fusee.Engine]:
    async with await fusee.connect(served.nats, namespace=served.namespace) as e:
        yield e


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    executable = chromium()
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=executable, args=ARGS)
        try:
            yield b
        finally:
            await b.close()


class Shots:
    """Screenshots under ``tmp_path``, each checked not blank by its colours."""

    def __init__(self, browser: Browser, tmp: Path) -> None:
        self.browser, self.tmp = browser, tmp
        self.taken: list[tuple[str, int]] = []
        self._blank: Page | None = None

    async def take(self, page: Page, name: str) -> int:
        path = self.tmp / f"{name}.png"
        data = await page.screenshot(path=str(path), full_page=False)
        if self._blank is None:
            self._blank = await (await self.browser.new_context()).new_page()
        colours = int(await self._blank.evaluate(COUNT_COLOURS, base64.b64encode(data).decode()))
        assert colours > 20, f"{path} looks blank ({colours} colours)"
        self.taken.append((name, colours))
        return colours


# The one error the scenario makes on purpose: the wrong token's login, a 401 that
# Chromium reports on the console as it does every response of status 400 and above.
REFUSED_LOGIN = "/ui/login: Failed to load resource: the server responded with a status of 401"


def watch_console(page: Page, errors: list[str]) -> None:
    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            errors.append(f"{msg.location.get('url') or page.url}: {msg.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc}"))


async def status_of(engine: fusee.Engine, run_id: str) -> str:
    return (await engine.run(run_id).describe()).status


async def test_ui_scenario(
    served: Served, engine: fusee.Engine, browser: Browser, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    fixed = tmp_path / "fixed"
    await engine.start("ui-long", "long-1", {"steps": STEPS})
    await engine.start("ui-stream", "stream-1", {"tokens": TOKENS, "gate": str(gate)})
    for rid in ("wait-1", "wait-2", "wait-3", "batch-1", "batch-2"):
        await engine.start("ui-wait", rid, None)
    await engine.start("ui-pause", "pause-1", {"fixed": str(fixed)})
    await engine.start("ui-approve", "approve-1", None)
    await engine.object("ui-cart", "k1").call("add", "apple")
    await engine.update_limit("ui-lim", per_second=5.0, concurrent=2)
    await engine.update_limit("ui-slot", concurrent=1)
    slot_gate = tmp_path / "slot-gate"
    for rid, key in (("slot-1", "alice"), ("slot-2", "bob")):
        await engine.start("ui-slot", rid, {"key": key, "gate": str(slot_gate)})
    await wait_until(
        lambda: _all_parked(engine), timeout=30, what="the waiting runs parked, the pause paused"
    )
    # admin: the filter-wide bulk actions need it (the cookie test below uses write)
    write = (await engine.tokens.create("admin", name="ui-test")).token

    errors: list[str] = []
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    watch_console(page, errors)
    shots = Shots(browser, tmp_path)

    # --- login: a wrong token is refused in the page; the right one sets the cookie
    await page.goto(f"{served.base}/ui")
    await expect(page.get_by_role("heading", name="Log in to fusee")).to_be_visible()
    await shots.take(page, "login")
    await page.get_by_label("API token").fill("fsk_not-a-token")
    await page.get_by_role("button", name="Log in").click()
    await expect(page.locator("#login-err")).not_to_be_empty()
    await page.get_by_label("API token").fill(write)
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    cookie = next(c for c in await context.cookies() if c["name"] == "fusee_ui")
    assert cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict"

    # --- runs: live status without reload, paused runs with their reason
    rows = page.locator("table.runs tbody tr")
    await expect(page.locator('tr[data-run="wait-2"]')).to_have_attribute("data-status", "waiting")
    await expect(page.locator('tr[data-run="pause-1"] td.reason')).to_contain_text("provider")
    await shots.take(page, "runs")
    assert await engine.run("wait-2").signal("go", "from the test")
    await expect(page.locator('tr[data-run="wait-2"]')).to_have_attribute(
        "data-status", "completed", timeout=15_000
    )
    # filters: paused only
    await page.get_by_label("Status").select_option("paused")
    await page.get_by_role("button", name="Filter").click()
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_have_attribute("data-run", "pause-1")
    await page.get_by_label("Status").select_option("")
    await page.get_by_label("ID starts with").fill("wait-")
    await page.get_by_role("button", name="Filter").click()
    await expect(rows).to_have_count(3)

    # --- bulk cancel, confirmed in a dialog
    await page.get_by_label("Select run wait-1").check()
    await page.get_by_role("button", name="Cancel selected").click()
    dialog = page.locator("dialog#confirm")
    await expect(dialog).to_be_visible()
    await expect(dialog).to_contain_text("wait-1")
    await shots.take(page, "runs-confirm")
    await dialog.get_by_role("button", name="Confirm").click()
    await expect(page.locator('tr[data-run="wait-1"]')).to_have_attribute(
        "data-status", "cancelled", timeout=15_000
    )
    journal = await engine.run("wait-1").journal()
    assert any(isinstance(r, RunCancelled) for _, r in journal)

    # --- every run the filters match, on every page: counted first, then confirmed
    await page.get_by_label("ID starts with").fill("batch-")
    await page.get_by_role("button", name="Filter").click()
    await expect(rows).to_have_count(2)
    await page.get_by_role("button", name="Cancel all matching…").click()
    await expect(dialog.locator("#confirm-title")).to_have_text("Cancel 2 runs?")
    await expect(dialog).to_contain_text("id_prefix=batch-")
    await dialog.get_by_role("button", name="Confirm").click()
    await expect(page.locator("#runs-note")).to_have_text("Cancelled 2 (skipped 0).")
    for rid in ("batch-1", "batch-2"):
        await expect(page.locator(f'tr[data-run="{rid}"]')).to_have_attribute(
            "data-status", "cancelled", timeout=15_000
        )
        assert any(isinstance(r, RunCancelled) for _, r in await engine.run(rid).journal())

    # --- a paused run resumed from its page
    fixed.write_text("up")
    await page.goto(f"{served.base}/ui#/runs/pause-1")
    await expect(page.locator(".facts")).to_have_attribute("data-status", "paused")
    await expect(page.locator("#timeline")).to_contain_text("provider")
    await page.get_by_role("button", name="Resume run").click()
    await dialog.get_by_role("button", name="Confirm").click()
    await expect(page.locator(".facts")).to_have_attribute(
        "data-status", "completed", timeout=15_000
    )
    await expect(page.locator("#run-result")).to_contain_text("answered")
    assert any(isinstance(r, RunResumed) for _, r in await engine.run("pause-1").journal())
    assert await engine.run("pause-1").result(timeout=5) == "answered"

    # --- a token stream, live: each token the test releases shows up in the page; the
    # page follows by itself a stream whose step is still running
    (gate.parent / f"{gate.name}.0").touch()
    text = token(0)
    await wait_until(
        lambda: _has_stream(engine, "stream-1"), timeout=15, what="stream-1's first token"
    )
    await page.goto(f"{served.base}/ui#/runs/stream-1")
    await expect(page.locator('#stream-list [data-follow="model-0"]')).to_be_visible()
    stream = page.locator('pre.stream[data-stream="model-0"]')
    await expect(page.locator('article[data-stream="model-0"] .stream-status')).to_have_text("live")
    await expect(stream).to_have_text(text)
    for i in range(1, TOKENS):
        (gate.parent / f"{gate.name}.{i}").touch()
        text += token(i)
        await expect(stream).to_have_text(text)
        if i == 2:
            await shots.take(page, "run-stream")
    await expect(page.locator('article[data-stream="model-0"]')).to_have_attribute(
        "data-ended", "true"
    )
    assert await engine.run("stream-1").result(timeout=10) == text

    # --- a signal: JSON checked before it is sent
    await page.goto(f"{served.base}/ui#/runs/wait-3")
    await page.get_by_label("Signal name").fill("go")
    payload = page.get_by_label("Payload (JSON)")
    await payload.fill('{"ok": tru')
    await page.get_by_role("button", name="Send signal").click()
    await expect(payload).to_have_attribute("aria-invalid", "true")
    await expect(page.locator("#signal-payload-err")).to_contain_text("Not valid JSON")
    await payload.fill('{"ok": true}')
    await page.get_by_role("button", name="Send signal").click()
    await expect(page.locator(".facts")).to_have_attribute(
        "data-status", "completed", timeout=15_000
    )
    assert await engine.run("wait-3").result(timeout=5) == {"ok": True}

    # --- an approval
    await page.goto(f"{served.base}/ui#/runs/approve-1")
    approve = page.get_by_role("button", name="Approve refund")
    await expect(approve).to_be_visible()
    await shots.take(page, "run-approval")
    await approve.click()
    await expect(page.locator(".facts")).to_have_attribute(
        "data-status", "completed", timeout=15_000
    )
    assert await engine.run("approve-1").result(timeout=5) is True

    # --- an object's state, edited (validated, applied through the API)
    await page.goto(f"{served.base}/ui#/objects")
    await page.get_by_role("list", name="Object types").get_by_role("link", name="ui-cart").click()
    await expect(page.get_by_label("Object type", exact=True)).to_have_value("ui-cart")
    await page.get_by_role("link", name="k1").click()
    await expect(page.locator("#object-state")).to_contain_text("apple")
    await page.get_by_role("button", name="Edit state").click()
    editor = page.get_by_label("New state (a JSON object)")
    await editor.fill("[1, 2]")
    await page.get_by_role("button", name="Apply").click()
    await expect(page.locator("#state-editor-err")).to_contain_text("JSON object")
    await editor.fill('{"items": ["pear"]}')
    await page.get_by_role("button", name="Apply").click()
    await expect(page.locator("#object-note")).to_have_text("State applied.")
    await expect(page.locator("#object-state")).to_contain_text("pear")
    await shots.take(page, "object")
    assert await engine.object("ui-cart", "k1").state() == {"items": ["pear"]}
    # its queue: an invocation that runs until cancelled, cancelled from the page
    seq = await engine.object("ui-cart", "k1").send("hold", str(tmp_path / "never"))
    cancel = page.get_by_role("button", name=f"Cancel invocation {seq} (hold)")
    await expect(cancel).to_be_visible(timeout=15_000)
    await cancel.click()
    await dialog.get_by_role("button", name="Confirm").click()
    await expect(page.locator("#object-note")).to_have_text(f"Invocation {seq} cancelled.")
    await expect(page.locator("#object-queue")).to_contain_text(
        "Nothing running or waiting.", timeout=15_000
    )
    shown = await engine.object("ui-cart", "k1").show()
    assert shown.running is None
    assert shown.waiting == []

    # --- limits: rates and caps, and the holder and the waiter (by fairness key) of one
    waiting = await wait_until(
        lambda: _slot_waiter(engine), timeout=30, what="ui-slot held once, one run waiting"
    )
    await page.get_by_role("link", name="Limits").click()
    row = page.locator('tr[data-limit="ui-lim"]')
    await expect(row.locator("td").nth(0)).to_have_text("5")
    await expect(row.locator("td").nth(2)).to_have_text("2")
    slot = page.locator('tr[data-limit="ui-slot"]')
    await expect(slot.locator("td").nth(2)).to_have_text("1")  # concurrent
    await expect(slot.locator("td").nth(3)).to_have_text("1")  # holders
    await expect(slot.locator(".waiters")).to_have_text(f"{waiting}: 1")
    await shots.take(page, "limits")
    slot_gate.touch()
    await expect(slot.locator("td").nth(3)).to_have_text("0", timeout=20_000)
    await expect(slot).to_contain_text("none")
    for rid in ("slot-1", "slot-2"):
        assert await engine.run(rid).result(timeout=20) == "done"

    # --- the run page of a 500-step run: how long until its timeline is drawn
    await wait_until(
        lambda: _ended(engine, "long-1"), timeout=60, what=f"the {STEPS}-step run's end"
    )
    began = time.perf_counter()
    await page.goto(f"{served.base}/ui#/runs/long-1")
    await expect(page.locator("#timeline > li.k-step")).to_have_count(STEPS)
    wall = (time.perf_counter() - began) * 1000
    head = page.locator(".run-head[data-render-ms]")  # this page's, set once it is drawn
    await expect(head).to_have_count(1)
    drawn = float(await head.get_attribute("data-render-ms") or "nan")
    fetched = float(await head.get_attribute("data-fetch-ms") or "nan")
    print(
        f"\nui.run_page {STEPS} steps: drawn in {drawn:.0f} ms after the page started "
        f"({fetched:.0f} ms of it the journal's fetch), {wall:.0f} ms from navigation to "
        "the last step in the DOM"
    )
    await page.locator("#journal-title").scroll_into_view_if_needed()
    await shots.take(page, "run-long")

    # --- keyboard: the skip link comes first, the nav is reachable and works
    await page.goto(f"{served.base}/ui#/runs")
    await page.reload()  # a fresh load: focus starts at the top of the document
    await expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.id") == "skip"
    await page.keyboard.press("Tab")
    await page.keyboard.press("Tab")
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.textContent") == "Limits"
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Limits")).to_be_visible()

    # --- a phone's width, and dark mode
    phone = await browser.new_context(viewport={"width": 390, "height": 844}, color_scheme="dark")
    small = await phone.new_page()
    watch_console(small, errors)
    await phone.add_cookies(
        [
            {
                "name": cookie["name"],
                "value": cookie["value"],
                "domain": cookie["domain"],
                "path": cookie["path"],
                "httpOnly": True,
                "sameSite": "Strict",
            }
        ]
    )
    for name, hash_ in (("runs", "#/runs"), ("run-long", "#/runs/long-1")):
        await small.goto(f"{served.base}/ui{hash_}")
        await expect(small.locator("h1")).to_be_visible()
        await small.wait_for_load_state("networkidle")
        width = await small.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{name} at 390 px scrolls sideways ({width} px wide)"
        await shots.take(small, f"phone-dark-{name}")
    light = await page.evaluate("getComputedStyle(document.body).backgroundColor")
    dark = await small.evaluate("getComputedStyle(document.body).backgroundColor")
    assert light != dark, "prefers-color-scheme: dark changed nothing"
    await phone.close()
    await context.close()

    print("ui.screenshots", ", ".join(f"{n}: {c} colours" for n, c in shots.taken))
    refused_login = [e for e in errors if REFUSED_LOGIN in e]
    assert len(refused_login) == 1, errors
    assert [e for e in errors if REFUSED_LOGIN not in e] == [], errors


async def _all_parked(engine: fusee.Engine) -> bool:
    want = {f"wait-{i}": "waiting" for i in (1, 2, 3)} | {"pause-1": "paused"}
    want |= {"batch-1": "waiting", "batch-2": "waiting"}
    want["approve-1"] = "waiting"
    return all([await status_of(engine, rid) == s for rid, s in want.items()])


async def _slot_waiter(engine: fusee.Engine) -> str | None:
    """The fairness key waiting for ``ui-slot`` once one run holds it and one waits."""
    limit = await engine.get_limit("ui-slot")
    if limit.holders == 1 and sum(limit.waiters.values()) == 1:
        return next(iter(limit.waiters))
    return None


async def _has_stream(engine: fusee.Engine, run_id: str) -> bool:
    return "model-0" in await engine.run(run_id).streams()


async def _ended(engine: fusee.Engine, run_id: str) -> bool:
    return (await engine.run(run_id).describe()).ended


# --- the cookie's rules, over plain HTTP


async def test_ui_cookie_is_taken_for_reads_and_for_writes_with_the_ui_header(
    served: Served, engine: fusee.Engine
) -> None:
    write = (await engine.tokens.create("write", name="ui-cookie")).token
    async with httpx.AsyncClient(base_url=served.base, timeout=20) as client:
        bad = await client.post("/ui/login", json={"token": write})
        assert bad.status_code == 403, bad.text  # no X-Fusee-UI: a form posted cross-site
        wrong = await client.post("/ui/login", json={"token": "nope"}, headers={"X-Fusee-UI": "1"})
        assert wrong.status_code == 401, wrong.text
        assert "set-cookie" not in wrong.headers
        ok = await client.post("/ui/login", json={"token": write}, headers={"X-Fusee-UI": "1"})
        assert ok.status_code == 200, ok.text
        set_cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in set_cookie
        assert "samesite=strict" in set_cookie
        assert (await client.get("/ui/session")).json()["logged_in"] is True
        assert (await client.get("/v1/runs")).status_code == 200  # the cookie, a read
        await engine.start("ui-wait", "cookie-1", None)
        refused = await client.post("/v1/runs/cookie-1/cancel", json={})
        assert refused.status_code == 403, refused.text
        assert "X-Fusee-UI" in refused.json()["error"]["message"]
        assert await status_of(engine, "cookie-1") != "cancelled"
        done = await client.post("/v1/runs/cookie-1/cancel", json={}, headers={"X-Fusee-UI": "1"})
        assert done.status_code == 202, done.text
        # another app on this host (cookies are shared across ports) with a cookie
        # http.cookies cannot parse: ours is still read
        client.cookies.set("prefs", '{"theme": "dark"}')
        assert (await client.get("/ui/session")).json()["logged_in"] is True
        assert (await client.get("/v1/runs")).status_code == 200
        out = await client.post("/ui/logout", headers={"X-Fusee-UI": "1"})
        assert out.status_code == 200
        assert (await client.get("/v1/runs")).status_code == 401
    read = (await engine.tokens.create("read", name="ui-cookie-read")).token
    await engine.start("ui-wait", "cookie-2", None)
    async with httpx.AsyncClient(base_url=served.base, timeout=20) as client:
        ui = {"X-Fusee-UI": "1"}
        behind = await client.post(
            "/ui/login", json={"token": read}, headers={**ui, "X-Forwarded-Proto": "https"}
        )
        assert behind.status_code == 200, behind.text
        assert "secure" in behind.headers["set-cookie"].lower()  # TLS at a proxy in front
        client.cookies.set("fusee_ui", read)  # httpx keeps no Secure cookie over http
        assert (await client.get("/v1/runs")).status_code == 200
        denied = await client.post("/v1/runs/cookie-2/cancel", json={}, headers=ui)
        assert denied.status_code == 403, denied.text  # a read token's cookie writes nothing
        assert await status_of(engine, "cookie-2") != "cancelled"
    admin = (await engine.tokens.create("write", name="ui-waits")).token
    async with httpx.AsyncClient(base_url=served.base, timeout=20) as client:
        bearer = {"Authorization": f"Bearer {admin}"}
        none = await client.post("/v1/runs/cookie-2/waits/0/complete", json=True, headers=bearer)
        assert none.status_code == 404, none.text
        assert none.json()["error"]["code"] == "wait_not_found"
    async with httpx.AsyncClient(base_url=served.base, timeout=20) as anon:
        page = await anon.get("/ui")
        assert page.status_code == 200
        assert "text/html" in page.headers["content-type"]
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert (await anon.get("/ui/static/app.js")).status_code == 200
        missing = await anon.get("/ui/static/nope.js")
        assert missing.status_code == 404
        assert "nope.js" in missing.json()["error"]["message"]
        assert (await anon.get("/ui/session")).json() == {"auth": True, "logged_in": False}


async def test_ui_without_auth_has_no_login(
    nats_server: Any, browser: Browser, tmp_path: Path
) -> None:
    """``fusee api --no-auth``: the UI opens on the runs page, no login, no logout."""
    namespace = f"t{secrets.token_hex(4)}"
    with api_server(nats_server.url, namespace, tmp_path, auth=False) as server:
        base = (await server.wait_for("api.serving", timeout=20))["url"]
        async with await fusee.connect(nats_server.url, namespace=namespace) as engine:
            await engine.start("ui-wait", "open-1", None)  # no worker: it stays pending
        errors: list[str] = []
        context = await browser.new_context(viewport={"width": 1280, "height": 800})
        page = await context.new_page()
        watch_console(page, errors)
        await page.goto(f"{base}/ui")
        await expect(page.get_by_role("heading", name="Runs")).to_be_visible()
        await expect(page.locator('tr[data-run="open-1"]')).to_have_attribute(
            "data-status", "pending"
        )
        await expect(page.locator("#who")).to_have_text("auth off")
        await expect(page.get_by_role("button", name="Log out")).to_be_hidden()
        await context.close()
        assert errors == [], errors


async def test_ui_stream_resumes_after_the_api_restarts(
    served: Served, engine: fusee.Engine, browser: Browser, tmp_path: Path
) -> None:
    """The API goes away mid-stream (its event streams end) and comes back on the same
    port: the page's EventSource reconnects with Last-Event-ID and the text goes on from
    there, no token lost, none twice."""
    gate = tmp_path / "gate"
    await engine.start("ui-stream", "stream-2", {"tokens": TOKENS, "gate": str(gate)})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    errors: list[str] = []
    watch_console(page, errors)
    stream = page.locator('pre.stream[data-stream="model-0"]')
    status = page.locator('article[data-stream="model-0"] .stream-status')
    text = ""

    def release(i: int) -> str:
        (gate.parent / f"{gate.name}.{i}").touch()
        return token(i)

    with api_server(served.nats, served.namespace, tmp_path / "a") as first:
        base = (await first.wait_for("api.serving", timeout=20))["url"]
        port = base.rsplit(":", 1)[1]
        await page.goto(f"{base}/ui#/runs/stream-2?stream=model-0")
        await expect(status).to_have_text("live")
        for i in range(3):
            text += release(i)
            await expect(stream).to_have_text(text)
    await expect(status).to_have_text("reconnecting…")
    text += release(3)  # written while no API serves: read after the reconnect
    with api_server(served.nats, served.namespace, tmp_path / "b", args=["--port", port]) as second:
        await second.wait_for("api.serving", timeout=20)
        await expect(status).to_have_text("live", timeout=20_000)
        await expect(stream).to_have_text(text)
        for i in range(4, TOKENS):
            text += release(i)
            await expect(stream).to_have_text(text)
        await expect(page.locator('article[data-stream="model-0"]')).to_have_attribute(
            "data-ended", "true"
        )
    await context.close()
    assert await engine.run("stream-2").result(timeout=10) == text
    # while no API served, the browser's reconnect attempts failed, and said so
    assert all("ERR_CONNECTION_REFUSED" in e for e in errors), errors
