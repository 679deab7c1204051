"""``/v1/tokens`` (API tokens: ``engine.tokens``, admin) and
``/v1/runs/{run_id}/streams/{name}/token`` (a stream token for a browser, read)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fusee import TokenInfo
from fusee.adapters.http.state import api_state, json_body, json_response
from fusee.errors import InvalidArgument
from fusee.runtime.ids import validate_name

__all__ = ("routes",)


async def list_tokens(request: Request) -> Response:
    """``GET /v1/tokens``: every token of the namespace (never the token itself)."""
    infos = await api_state(request).engine.tokens.list()
    return json_response({"tokens": [i.to_json() for i in infos]})


async def create_token(request: Request) -> Response:
    """``POST /v1/tokens`` with ``{"scope", "name"?, "ttl"?}``: ``201`` with the token,
    shown this once."""
    body = await json_body(request, "the token request")
    if not isinstance(body, dict) or set(body) - {"scope", "name", "ttl"} or "scope" not in body:
        raise InvalidArgument(
            'the body must be a JSON object {"scope": "read"|"write"|"admin", "name"?: str, '
            '"ttl"?: "30d"}'
        )
    name, ttl = body.get("name"), body.get("ttl")
    if name is not None and not isinstance(name, str):
        raise InvalidArgument("name must be a string")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, str | int | float)):
        raise InvalidArgument('ttl must be a duration ("30d") or a number of seconds')
    made = await api_state(request).engine.tokens.create(body["scope"], name=name, ttl=ttl)
    return json_response(made.to_json(), status=201)


async def revoke_token(request: Request) -> Response:
    """``DELETE /v1/tokens/{token_id}``: ``204``; ``404 UnknownToken`` for no such ID."""
    await api_state(request).engine.tokens.revoke(request.path_params["token_id"])
    return Response(status_code=204)


async def stream_token(request: Request) -> Response:
    """``POST /v1/runs/{run_id}/streams/{name}/token`` with ``{"ttl"?: "5m"}`` (at most
    ``1h``): ``201 {"access_token", "expires_at"}``, a token that reads this one stream
    (``GET .../streams/{name}?access_token=...``) and stops working with the token that
    asked for it."""
    engine = api_state(request).engine
    run = engine.run(request.path_params["run_id"])
    name = validate_name(request.path_params["name"], "stream name")
    body = await json_body(request, "the stream token request")
    if body is None:
        body = {}
    if not isinstance(body, dict) or set(body) - {"ttl"}:
        raise InvalidArgument('the body must be empty or a JSON object {"ttl"?: "5m"}')
    ttl = body.get("ttl", "5m")
    if isinstance(ttl, bool) or not isinstance(ttl, str | int | float):
        raise InvalidArgument('ttl must be a duration ("5m") or a number of seconds')
    await run.describe()  # an unknown run: 404, no token
    caller = request.scope.get("state", {}).get("fusee_token")
    token = engine.tokens.stream_token(
        run.run_id, name, ttl, issued_by=caller.id if isinstance(caller, TokenInfo) else None
    )
    access = await engine.tokens.verify_stream(token)
    return json_response(
        {"access_token": token, "expires_at": access.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")},
        status=201,
    )


routes: list[BaseRoute] = [
    Route("/v1/tokens", list_tokens, methods=["GET"], name="tokens"),
    Route("/v1/tokens", create_token, methods=["POST"], name="token_create"),
    Route("/v1/tokens/{token_id:id}", revoke_token, methods=["DELETE"], name="token_revoke"),
    Route(
        "/v1/runs/{run_id:id}/streams/{name:id}/token",
        stream_token,
        methods=["POST"],
        name="run_stream_token",
    ),
]
