"""The HTTP API as an ASGI app: ``create_app(engine)``.

Litestar: its route handlers are typed functions whose msgspec Structs are the bodies,
and the OpenAPI document (``GET /openapi.json``) is generated from them, so it cannot
drift from what the routes take and answer. Around the router, plain ASGI layers
(outermost first): the request's ID, routing on the raw path (IDs hold ``%2F``), the
last resort for bugs, the auth check (``auth=True``: ``adapters/http/auth.py``), the
body limit. The caller's middleware (``middleware=``, e.g.
your own middleware) runs inside the router, once a route matched, with
``scope["path_template"]`` naming it. See ``docs/reference/http-api.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from litestar import Litestar, Request, Response
from litestar.exceptions import HTTPException, NotFoundException, ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme, Tag
from litestar.types import Middleware

from fusee import Engine, __version__
from fusee.adapters.http.auth import DEFAULT_RULES, AuthMiddleware
from fusee.adapters.http.errors import (
    HTTP_CODES,
    ApiError,
    ErrorBody,
    code_of,
    error_body,
    request_id_of,
    status_of,
)
from fusee.adapters.http.limits import DEFAULT_MAX_BODY, BodyLimit
from fusee.adapters.http.methods import AllowedMethods, HeadAsGet, allowed
from fusee.adapters.http.middleware import LastResort, RequestId, Unserved
from fusee.adapters.http.models import FIELD_SCHEMAS, STRUCTS
from fusee.adapters.http.paths import DecodedParams, RawPath
from fusee.adapters.http.redact import redacted
from fusee.adapters.http.routes import (
    bulk,
    completions,
    limits,
    meta,
    objects,
    runs,
    streams,
    tokens,
    ui,
)
from fusee.adapters.http.state import ApiState
from fusee.adapters.http.strict import strict_inputs
from fusee.errors import FuseeError
from fusee.logs import get_logger

__all__ = ("create_app", "api_state_of", "FuseeApi")

log = get_logger()

AnyRequest = Request[Any, Any, Any]
# where Litestar's OpenAPI router is mounted (it must be somewhere): nothing there is served
_LITESTAR_DOCS = "/openapi"


class FuseeApi:
    """The API's ASGI app: the router (``litestar``) inside its ASGI layers."""

    def __init__(self, litestar: Litestar, outer: Any) -> None:
        self.litestar = litestar
        self._outer = outer

    @property
    def state(self) -> ApiState:
        state: ApiState = self.litestar.state.fusee
        return state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._outer(scope, receive, send)


def create_app(
    engine: Engine,
    *,
    keepalive: float = 15.0,
    max_body: int = DEFAULT_MAX_BODY,
    middleware: Sequence[Middleware] = (),
    auth: bool = True,
) -> FuseeApi:
    """The HTTP API on ``engine``, as an ASGI app (serve it with uvicorn).

    The app uses the engine and does not close it: whoever connected it closes it.

    Args:
        engine: a connected engine; every request reads its namespace.
        keepalive: seconds between keep-alive comments of an idle event stream.
        max_body: the largest request body taken, in bytes (larger: ``413``, unread).
        middleware: ASGI middleware run once a route matched, outermost first (Litestar's
            ``middleware``: a factory ``app -> app`` or ``DefineMiddleware(cls, ...)``).
            (Auth is ``auth=``, an outer layer, not this.) It sees ``scope["path_template"]``
            (``/v1/runs/{run_id}``) and answers errors with
            :func:`fusee.adapters.http.errors.send_error`.
        auth: require a bearer token of the route's scope (``engine.tokens``; see
            ``docs/security.md``): :class:`AuthMiddleware` outside the router, before
            any body is read. ``False`` opens every route to anyone who can reach the
            port: for local development only.

    Example:
        ``uvicorn.run(create_app(await fusee.connect()))``
    """
    handlers = [
        *meta.handlers,
        *bulk.handlers,
        *runs.handlers,
        *streams.handlers,
        *objects.handlers,
        *completions.handlers,
        *limits.handlers,
        *tokens.handlers,
        *ui.handlers,
    ]
    app = Litestar(
        route_handlers=handlers,
        middleware=[DecodedParams, AllowedMethods, *middleware],
        before_request=strict_inputs,
        exception_handlers={
            HTTPException: _http_error,
            ApiError: _api_error,
            FuseeError: _fusee_error,
            RecursionError: _too_deep,
            Exception: _internal_error,
        },
        openapi_config=OpenAPIConfig(
            title="fusee HTTP API",
            version=__version__,
            description="Runs, keyed objects and limits of a fusee namespace over HTTP. Every "
            'error is `{"error": {"code", "message", "request_id"}}`, every response has '
            "`X-Request-ID`.",
            # no HTML viewers (they load scripts from CDNs): the document, served at
            # /openapi.json by routes/meta.py (Litestar's own router, which must be
            # somewhere, is under /openapi/, where the Unserved layer answers every path
            # with the error shape: its catch-all would answer HTML)
            path=_LITESTAR_DOCS,
            render_plugins=[JsonRenderPlugin()],
            components=Components(
                security_schemes={
                    "bearer": SecurityScheme(
                        type="http",
                        scheme="bearer",
                        description="An API token (`fusee tokens create --scope read|write|admin`).",
                    ),
                    "access_token": SecurityScheme(
                        type="apiKey",
                        name="access_token",
                        security_scheme_in="query",
                        description="A stream token (`POST /v1/runs/{run_id}/streams/{name}/token`): "
                        "reads that one stream only.",
                    ),
                }
            ),
            security=[{"bearer": []}],
            tags=[Tag(name="fusee")],
            create_examples=False,
        ),
        request_max_body_size=None,  # the BodyLimit layer has it, before anything is read
        debug=False,
        logging_config=None,
    )
    app.state.fusee = ApiState(engine=engine, keepalive=keepalive, auth=auth)
    _finish_document(app, auth=auth)
    inner: Any = BodyLimit(app, max_body=max_body)
    if auth:  # before the body is read: a refused request's body never is
        inner = AuthMiddleware(inner, verifier=engine.tokens, rules=DEFAULT_RULES)
    inner = Unserved(LastResort(inner), _LITESTAR_DOCS)
    outer = RequestId(HeadAsGet(RawPath(inner)))
    return FuseeApi(app, outer)


def api_state_of(app: FuseeApi) -> ApiState:
    """The state of an app made by :func:`create_app` (its engine, its open streams)."""
    return app.state


def _error(
    request: AnyRequest, status: int, body: ErrorBody, headers: dict[str, str] | None = None
) -> Response[ErrorBody]:
    body.error.request_id = request_id_of(request.scope)
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def _http_error(request: AnyRequest, exc: Exception) -> Response[ErrorBody]:
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    headers = dict(exc.headers or {})
    if isinstance(exc, NotFoundException) or status == 404:
        message = (
            f"no such endpoint: {request.method} {request.scope.get('path', request.url.path)}"
            " (an ID is one path segment: write its '/' as %2F)"
        )
    elif status == 405:
        methods = headers.pop("allow", headers.pop("Allow", "")).split(",")
        headers["Allow"] = allowed([m.strip() for m in methods if m.strip()])
        message = (
            f"{request.method} is not allowed on {request.url.path} (allowed: {headers['Allow']})"
        )
    elif isinstance(exc, ValidationException):
        message = _validation_message(exc)
    else:
        message = str(exc.detail)
    code = HTTP_CODES.get(status, "error")
    if status == 400:
        code = "invalid_argument"
        if not isinstance(exc, ValidationException):  # the body could not be decoded
            message = f"the body is not valid JSON: {message}"
    return _error(request, status, error_body(code, message), headers)


def _validation_message(exc: ValidationException) -> str:
    """The framework's validation failure, as one sentence naming what is wrong."""
    parts = []
    for item in exc.extra if isinstance(exc.extra, list) else []:
        if not isinstance(item, dict):
            continue
        key, source = item.get("key"), item.get("source")
        message = str(item.get("message", "invalid"))
        if message == f"'{key}'":  # a KeyError's text: nothing was sent
            message = "missing"
        if source == "body":
            named = "the body" if key in (None, "data") else f"the body's field {key!r}"
        else:
            named = f"{getattr(source, 'value', source)} parameter {key!r}"
        parts.append(f"{named}: {message}")
    return "; ".join(parts) or str(exc.detail)


def _api_error(request: AnyRequest, exc: Exception) -> Response[ErrorBody]:
    assert isinstance(exc, ApiError)
    body = error_body(exc.code, exc.message, handler=exc.handler, error_type=exc.error_type)
    return _error(request, exc.status, body)


def _fusee_error(request: AnyRequest, exc: Exception) -> Response[ErrorBody]:
    status = status_of(exc)
    if status >= 500:
        log.warning(
            "http.error", path=redacted(request.url.path), error=f"{type(exc).__name__}: {exc}"
        )
    return _error(request, status, error_body(code_of(exc), str(exc)))


def _too_deep(request: AnyRequest, exc: Exception) -> Response[ErrorBody]:
    """A body nested deeper than the decoder can follow (``[[[[...]]]]``)."""
    return _error(
        request, 400, error_body("invalid_argument", "the body nests too deeply to be read")
    )


def _internal_error(request: AnyRequest, exc: Exception) -> Response[ErrorBody]:
    """Any other exception (a bug): logged with its traceback, answered without it."""
    log.error(
        "http.internal_error",
        method=request.method,
        path=redacted(request.url.path),
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    message = "internal error; the server logged it as http.internal_error"
    return _error(request, 500, error_body("internal_error", message))


_REFUSALS = {
    "401": "`unauthorized`: no API token, or one that is unknown, revoked, expired or "
    "forged (`Authorization: Bearer <token>`).",
    "403": "`forbidden`: the token's scope is below the route's (`read` < `write` < `admin`).",
    "503": "`connection_lost`: the token could not be checked (NATS did not answer).",
}


def _finish_document(app: Litestar, *, auth: bool) -> None:
    """What the generator leaves out: the refusals of the auth middleware (``401``,
    ``403``) on every operation that needs a token; and, from the bodies' own
    definitions, a Struct that
    refuses unknown fields (``forbid_unknown_fields``) says so
    (``additionalProperties: false``), the fields of ``FIELD_SCHEMAS`` get
    their ranges, and the completion routes their bodies."""
    document = app.openapi_schema
    completions.finish_document(document)
    shape = next(  # an error response (the error shape) to describe the refusals with
        op.responses["400"]
        for item in (document.paths or {}).values()
        for op in (item.get, item.put, item.post, item.delete, item.patch)
        if op is not None and op.responses and "400" in op.responses
    )
    for item in (document.paths or {}).values():
        for method in ("get", "put", "post", "delete", "patch", "head"):
            operation = getattr(item, method, None)
            if operation is None or operation.security == [{}]:
                continue  # open: /healthz, the document, the completion URLs
            if not auth:  # `fusee api --no-auth`: nothing asks for a token
                operation.security = [{}]
                continue
            responses = operation.responses or {}
            for status, text in _REFUSALS.items():
                responses.setdefault(status, replace(shape, description=text))
            operation.responses = responses
    schemas = document.components.schemas or {}
    for name, schema in schemas.items():
        config = getattr(STRUCTS.get(name), "__struct_config__", None)
        if config is not None and config.forbid_unknown_fields:
            schema.additional_properties = False
        for field, documented in FIELD_SCHEMAS.get(name, {}).items():
            properties = dict(schema.properties or {})
            properties[field] = documented  # type: ignore[assignment]
            schema.properties = properties
