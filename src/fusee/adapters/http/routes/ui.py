"""``/ui``: the web UI, its files, its login and its session.

The UI is hand-written ES modules and CSS in ``fusee/ui/static/`` (package data, no
build step), served here, by the same app as the API; its only backend is the API
under ``/v1``. Its login takes an API token, checks it, and keeps it in an ``HttpOnly``,
``SameSite=Strict`` cookie (``auth.UI_COOKIE``), which the auth middleware takes for the
UI's requests (``auth.py``: a request that changes something must also carry
``X-Fusee-UI: 1``). With auth off (``fusee dev``, ``fusee api --no-auth``) there is no
login: ``GET /ui/session`` says so.
"""

from __future__ import annotations

import time
from importlib import resources
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, get, post
from litestar.datastructures import Cookie
from litestar.params import Parameter

from fusee.adapters.http.auth import UI_COOKIE, UI_HEADER, cookie_token
from fusee.adapters.http.errors import ApiError
from fusee.adapters.http.state import api_state, json_body
from fusee.errors import Unauthorized

__all__ = ("handlers", "STATIC")

AnyRequest = Request[Any, Any, Any]

STATIC = resources.files("fusee") / "ui" / "static"
_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The page loads nothing from anywhere else, runs no inline script, and is never framed.
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class Session(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the UI needs to know before its first page: whether to show the login."""

    auth: bool
    logged_in: bool
    token_id: str | None = None
    scope: str | None = None


class Login(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    token: str


def _file(name: str) -> Response[bytes]:
    suffix = name[name.rfind(".") :] if "." in name else ""
    item = STATIC / name
    if suffix not in _TYPES or "/" in name or name.startswith(".") or not item.is_file():
        raise ApiError(404, f"no such file of the UI: {name!r}", "not_found")
    return Response(item.read_bytes(), media_type=_TYPES[suffix], headers=_HEADERS)


@get("/ui", include_in_schema=False)
async def page() -> Response[bytes]:
    return _file("index.html")


@get("/ui/static/{file:str}", include_in_schema=False)
async def static(
    file: Annotated[str, Parameter(description="A file of the UI, one path segment.")],
) -> Response[bytes]:
    return _file(file)


@get("/ui/session", include_in_schema=False)
async def session(request: AnyRequest) -> Session:
    state = api_state(request)
    if not state.auth:
        return Session(auth=False, logged_in=True)
    token = cookie_token(request.scope)
    if token is None:
        return Session(auth=True, logged_in=False)
    try:
        info = await state.engine.tokens.verify(token)
    except Unauthorized:
        return Session(auth=True, logged_in=False)
    return Session(auth=True, logged_in=True, token_id=info.id, scope=info.scope)


def _require_ui_header(request: AnyRequest) -> None:
    if request.headers.get(UI_HEADER) != "1":
        raise ApiError(
            403, f"the UI's login and logout need the header {UI_HEADER}: 1", "forbidden"
        )


@post("/ui/login", status_code=200, include_in_schema=False)
async def login(request: AnyRequest) -> Response[Session]:
    """Check the API token of the body (``{"token": ...}``) and keep it in the cookie."""
    _require_ui_header(request)
    body = await json_body(request, "the login")
    try:
        token = msgspec.convert(body, Login).token.strip()
    except msgspec.ValidationError as exc:
        raise ApiError(400, f'the login: send {{"token": "<API token>"}} ({exc})') from None
    if not token:
        raise ApiError(400, "the login: the token is empty", "invalid_argument")
    state = api_state(request)
    if not state.auth:
        return Response(Session(auth=False, logged_in=True))
    if state.engine.tokens.is_stream_token(token):
        raise ApiError(401, "the UI takes an API token, not a stream token", "unauthorized")
    try:
        info = await state.engine.tokens.verify(token)
    except Unauthorized as exc:
        raise ApiError(401, str(exc), "unauthorized") from None
    max_age = None
    if info.expires_at is not None:
        max_age = max(1, int(info.expires_at.timestamp() - time.time()))
    cookie = Cookie(
        key=UI_COOKIE,
        value=token,
        path="/",
        httponly=True,
        samesite="strict",
        # HTTPS here, or at a proxy in front (its X-Forwarded-Proto; trusting the
        # header only ever makes the cookie stricter)
        secure=request.url.scheme == "https"
        or request.headers.get("x-forwarded-proto", "").split(",")[0].strip() == "https",
        max_age=max_age,
    )
    body_out = Session(auth=True, logged_in=True, token_id=info.id, scope=info.scope)
    return Response(body_out, cookies=[cookie], headers={"Cache-Control": "no-store"})


@post("/ui/logout", status_code=200, include_in_schema=False)
async def logout(request: AnyRequest) -> Response[Session]:
    _require_ui_header(request)
    gone = Cookie(key=UI_COOKIE, value="", path="/", httponly=True, samesite="strict", max_age=0)
    auth = api_state(request).auth
    return Response(Session(auth=auth, logged_in=not auth), cookies=[gone])


handlers = [page, static, session, login, logout]
