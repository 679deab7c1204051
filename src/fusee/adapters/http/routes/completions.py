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
from litestar import MediaType, Request, Response, get, post
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import OpenAPI, OpenAPIMediaType, RequestBody, Schema
from litestar.openapi.spec.enums import OpenAPIType

from fusee import CompletionInfo
from fusee.adapters.http.errors import ApiError
from fusee.adapters.http.models import Completed
from fusee.adapters.http.schemas import Token, errors
from fusee.adapters.http.state import api_state, json_body
from fusee.errors import InvalidArgument, InvalidToken

__all__ = ("handlers", "finish_document")

FORM = "application/x-www-form-urlencoded"
AnyRequest = Request[Any, Any, Any]
_UNKNOWN = "`invalid_token`: the token names no wait (malformed, forged, unknown run)."
_SPENT = "`invalid_token`: the wait is over (expired, or answered with another value)."
_PAGE = ResponseSpec(
    data_container=str,
    media_type="text/html",
    description="For a browser (`Accept: text/html`).",
    generate_examples=False,
)


def _wants_html(request: AnyRequest) -> bool:
    accept = request.headers.get("accept", "")
    return "text/html" in accept and "application/json" not in accept


@get(
    "/v1/completions/{token:str}",
    summary="What a completion wait asks for (the callback URL)",
    security=[{}],
    responses=errors(e404=_UNKNOWN, e409=_SPENT),
)
async def show(request: AnyRequest, token: Token) -> Response[CompletionInfo]:
    """What the wait asks, and whether it still waits (an HTML page for a browser)."""
    try:
        info = await api_state(request).engine.completion(token)
    except InvalidToken as exc:
        raise _refused(exc) from None
    if _wants_html(request):
        return Response(_page(info, request.url.path), media_type=MediaType.HTML)  # type: ignore[arg-type]
    return Response(info)


@post(
    "/v1/completions/{token:str}",
    status_code=200,
    summary="Complete a wait: approve, reject, or answer with any JSON value",
    description="The body is the value the wait returns: any JSON (`true`, `false`, "
    '`{"approved": false, "reason": "..."}`), or the page\'s form '
    "(`application/x-www-form-urlencoded`: `approved=true|false`, `reason`), answered "
    "with the page again. Authenticated by its signed token alone.",
    security=[{}],
    responses=errors(
        e400="`invalid_argument`: the body is missing, not JSON, or the form is not.",
        e404=_UNKNOWN,
        e409=_SPENT,
    ),
)
async def complete(request: AnyRequest, token: Token) -> Response[Completed]:
    """Complete the wait with the body's value."""
    engine = api_state(request).engine
    data = await request.body()
    # a form of the page (approved=...); any other body sent as a form is tried as
    # JSON: `curl -X POST URL -d true` sends `true` as application/x-www-form-urlencoded
    form = _content_type(request) == FORM and _is_page_form(data)
    if form:
        value = _form_value(data)
    else:
        if not data.strip():
            raise InvalidArgument("the completion's value is missing: send JSON (true, false, ...)")
        what = "the completion's value"
        if _content_type(request) == FORM:
            what += " (a form without approved=true|false, read as JSON)"
        value = await json_body(request, what)  # (null is a value)
    try:
        stored = await engine.complete(token, value)
    except InvalidToken as exc:
        raise _refused(exc) from None
    if form:  # a person clicked a button: show the page again, now answered
        info = await engine.completion(token)
        if info.status == "waiting":  # stored, not taken by the run yet: it will be
            info.status, info.value = "completed", value
        return Response(_page(info, request.url.path), media_type=MediaType.HTML)  # type: ignore[arg-type]
    return Response(Completed(completed=True, stored=stored, value=value))


def _refused(exc: InvalidToken) -> ApiError:
    """A spent token (expired, used with another value): 409; any other: 404, since the
    URL names no wait (a forged one is told apart only in the message)."""
    return ApiError(409 if exc.spent else 404, str(exc), "invalid_token")


def _content_type(request: AnyRequest) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _is_page_form(data: bytes) -> bool:
    """The body holds the page form's field ``approved`` (else it is not that form)."""
    return "approved" in parse_qs(data.decode("utf-8", "replace"), keep_blank_values=True)


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


handlers = [show, complete]


_FORM = Schema(
    type=OpenAPIType.OBJECT,
    properties={
        "approved": Schema(type=OpenAPIType.STRING, enum=["true", "false"]),
        "reason": Schema(type=OpenAPIType.STRING),
    },
    required=["approved"],
)


def finish_document(document: OpenAPI) -> None:
    """What the generator cannot see of these routes: ``complete`` reads its body as it
    comes (any JSON, or the page's form), and both answer a browser with the page
    (``text/html``)."""
    item = (document.paths or {}).get("/v1/completions/{token}")
    if item is None or item.post is None or item.get is None:
        return
    item.post.request_body = RequestBody(
        description="The value the wait returns: any JSON; or the page's form.",
        required=True,
        content={
            "application/json": OpenAPIMediaType(schema=Schema(description="Any JSON value.")),
            FORM: OpenAPIMediaType(schema=_FORM),
        },
    )
    page = OpenAPIMediaType(schema=Schema(type=OpenAPIType.STRING))
    for operation in (item.get, item.post):
        answer = (operation.responses or {}).get("200")
        content = getattr(answer, "content", None)
        if content is not None:
            content["text/html"] = page
