"""``/v1/tokens`` (API tokens: ``engine.tokens``, admin) and
``/v1/runs/{run_id}/streams/{name}/token`` (a stream token for a browser, read).

Which scope each route needs is the auth middleware's table (``auth.DEFAULT_RULES``)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, Response, delete, get, post
from litestar.params import Body, Parameter

from fusee import TokenInfo
from fusee.adapters.http.models import (
    StreamToken,
    StreamTokenRequest,
    TokenCreated,
    TokenListed,
    TokenRequest,
    Tokens,
)
from fusee.adapters.http.schemas import BAD_ID, NO_RUN, Name, RunId, errors
from fusee.adapters.http.state import api_state
from fusee.runtime.ids import validate_name

__all__ = ("handlers",)

AnyRequest = Request[Any, Any, Any]

TokenId = Annotated[
    str,
    Parameter(
        description="The token's ID (`fusee tokens ls`): 12 hex digits.",
        schema_extra={"pattern": "^[0-9a-f]{12}$"},
    ),
]


@get(
    "/v1/tokens",
    summary="Every API token of the namespace (never the tokens themselves)",
    responses=errors(),
)
async def list_tokens(request: AnyRequest) -> Tokens:
    infos = await api_state(request).engine.tokens.list()
    return Tokens(tokens=[TokenListed(**i.to_json()) for i in infos])


@post(
    "/v1/tokens",
    status_code=201,
    summary="Make an API token (shown this once)",
    description="`ttl` is a duration (`30d`); without one the token lives until revoked.",
    responses=errors(e400="`invalid_argument`: a scope, name or ttl that cannot be taken."),
)
async def create_token(request: AnyRequest, data: Annotated[TokenRequest, Body()]) -> TokenCreated:
    made = await api_state(request).engine.tokens.create(data.scope, name=data.name, ttl=data.ttl)
    return TokenCreated(**made.to_json())


@delete(
    "/v1/tokens/{token_id:str}",
    status_code=204,
    summary="Revoke an API token (at once, in every API process)",
    responses=errors(e404="`unknown_token`: no token of this ID."),
)
async def revoke_token(request: AnyRequest, token_id: TokenId) -> None:
    await api_state(request).engine.tokens.revoke(token_id)


@post(
    "/v1/runs/{run_id:str}/streams/{name:str}/token",
    status_code=201,
    summary="A short-lived token that reads this one stream (for a browser's EventSource)",
    description="`ttl` at most `1h` (default `5m`). The token ends with the API token that "
    "asked for it.",
    responses=errors(e400=BAD_ID, e404=NO_RUN),
)
async def stream_token(
    request: AnyRequest,
    run_id: RunId,
    name: Name,
    data: Annotated[StreamTokenRequest | None, Body()] = None,
) -> Response[StreamToken]:
    engine = api_state(request).engine
    run = engine.run(run_id)
    stream = validate_name(name, "stream name")
    ttl = (data or StreamTokenRequest()).ttl
    await run.describe()  # an unknown run: 404, no token
    caller = (request.scope.get("state") or {}).get("fusee_token")
    token = engine.tokens.stream_token(
        run.run_id, stream, ttl, issued_by=caller.id if isinstance(caller, TokenInfo) else None
    )
    access = await engine.tokens.verify_stream(token)
    expires = access.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return Response(StreamToken(access_token=token, expires_at=expires), status_code=201)


handlers = [list_tokens, create_token, revoke_token, stream_token]
