"""``/v1/completions/{token}``: the callback URL ``ctx.await_completion`` hands out.

Authenticated by its signed token alone (it names one wait and is unguessable), so a
person can open it from an email or a chat message: ``GET`` shows what is asked, with
two buttons (an HTML page for a browser, JSON otherwise); ``POST`` completes the wait
with a JSON value (``true``, ``false``, ``{"approved": false, "reason": "..."}``, any
JSON), or with the page's form (``approved=true|false`` and an optional ``reason``).
"""

from __future__ import annotations

import html
from typing import Any
from urllib.parse import parse_qs

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from fusee import CompletionInfo
from fusee.adapters.http.errors import error_response
from fusee.adapters.http.state import api_state, json_body, json_response
from fusee.errors import InvalidArgument, InvalidToken

__all__ = ("routes",)

FORM = "application/x-www-form-urlencoded"


def _wants_html(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "text/html" in accept and "application/json" not in accept


async def show(request: Request) -> Response:
    """``GET /v1/completions/{token}``: what the wait asks, and whether it still waits."""
    try:
        info = await api_state(request).engine.completion(request.path_params["token"])
    except InvalidToken as exc:
        return _refused(exc)
    if _wants_html(request):
        return HTMLResponse(_page(info, request.url.path))
    return json_response(info)


async def complete(request: Request) -> Response:
    """``POST /v1/completions/{token}``: complete the wait with the body's value."""
    engine = api_state(request).engine
    token = request.path_params["token"]
    form = request.headers.get("content-type", "").split(";")[0].strip() == FORM
    if form:
        value = _form_value(await request.body())
    else:
        if not (await request.body()).strip():
            raise InvalidArgument("the completion's value is missing: send JSON (true, false, ...)")
        value = await json_body(request, "the completion's value")  # (null is a value)
    try:
        stored = await engine.complete(token, value)
    except InvalidToken as exc:
        return _refused(exc)
    if form:  # a person clicked a button: show the page again, now answered
        info = await engine.completion(token)
        if info.status == "waiting":  # stored, not taken by the run yet: it will be
            info.status, info.value = "completed", value
        return HTMLResponse(_page(info, request.url.path))
    return json_response({"completed": True, "stored": stored, "value": value})


def _refused(exc: InvalidToken) -> Response:
    """A spent token (expired, used with another value): 409; any other: 404, since the
    URL names no wait (a forged one is told apart only in the message)."""
    return error_response(409 if exc.spent else 404, "InvalidToken", str(exc))


def _form_value(data: bytes) -> Any:
    fields = parse_qs(data.decode("utf-8", "replace"), keep_blank_values=True)
    approved = (fields.get("approved") or [""])[0]
    if approved not in ("true", "false"):
        raise InvalidArgument("the form's field 'approved' must be true or false")
    reason = (fields.get("reason") or [""])[0].strip()
    if approved == "true":
        return True
    return {"approved": False, "reason": reason} if reason else False


def _page(info: CompletionInfo, action: str) -> str:
    e = html.escape
    title = f"{e(info.name)} — run {e(info.run_id)}"
    if info.status == "waiting":
        body = f"""<p>Run <code>{e(info.run_id)}</code> ({e(info.workflow)}) waits for
<strong>{e(info.name)}</strong>.</p>
<form method="post" action="{e(action)}">
<button name="approved" value="true" type="submit">Approve</button>
<button name="approved" value="false" type="submit">Reject</button>
<p><label>Reason (optional) <input name="reason" maxlength="2000"></label></p>
</form>"""
    elif info.status == "completed":
        value = e(msgspec.json.encode(info.value).decode())
        body = f"<p>Answered: <code>{value}</code>. Nothing more to do.</p>"
    else:
        body = f"<p>This request has expired: {e(info.reason or '')}.</p>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><h1>{e(info.name)}</h1>{body}</body></html>
"""


routes: list[BaseRoute] = [
    Route("/v1/completions/{token:id}", show, methods=["GET"], name="completion_show"),
    Route("/v1/completions/{token:id}", complete, methods=["POST"], name="completion_complete"),
]
