"""``/v1/limits``: rate and concurrency limits, what ``fusee limits ls`` and ``fusee
limits set`` show and do (``Engine.limits``, ``Engine.get_limit``,
``Engine.update_limit``)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, get, put
from litestar.params import Body

from fusee import LimitInfo
from fusee.adapters.http.models import LimitChange, Limits
from fusee.adapters.http.schemas import BAD_ID, Name, errors
from fusee.adapters.http.state import api_state

__all__ = ("handlers",)

AnyRequest = Request[Any, Any, Any]


@get("/v1/limits", summary="Every limit, with its holders and waiters")
async def list_limits(request: AnyRequest) -> Limits:
    return Limits(limits=await api_state(request).engine.limits())


@get(
    "/v1/limits/{name:str}",
    summary="A limit",
    responses=errors(e400=BAD_ID, e404="`unknown_limit`: no limit of this name was set."),
)
async def get_limit(request: AnyRequest, name: Name) -> LimitInfo:
    return await api_state(request).engine.get_limit(name)


@put(
    "/v1/limits/{name:str}",
    summary="Set or change a limit (`fusee limits set`)",
    description="The fields given change (`null` removes one), the others keep their value.",
    responses=errors(
        e400="`invalid_id` (the name), or `invalid_argument`: a rate or count that is not "
        "positive, a burst without a rate, nothing to set on a new limit; nothing was stored."
    ),
)
async def put_limit(
    request: AnyRequest, name: Name, data: Annotated[LimitChange, Body()]
) -> LimitInfo:
    changes = {k: v for k, v in msgspec.structs.asdict(data).items() if v is not msgspec.UNSET}
    return await api_state(request).engine.update_limit(name, **changes)


handlers = [list_limits, get_limit, put_limit]
