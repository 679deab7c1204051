"""``/v1/limits``: rate and concurrency limits, what ``fusee limits ls`` and ``fusee
limits set`` show and do (``Engine.limits``, ``Engine.get_limit``,
``Engine.update_limit``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fusee import LimitInfo
from fusee.adapters.http.state import api_state, json_body, json_response
from fusee.errors import InvalidArgument

__all__ = ("routes",)


def _json(info: LimitInfo) -> dict[str, Any]:
    return dataclasses.asdict(info)


async def list_limits(request: Request) -> Response:
    """``GET /v1/limits``: every limit, sorted by name."""
    infos = await api_state(request).engine.limits()
    return json_response({"limits": [_json(i) for i in infos]})


async def limit(request: Request) -> Response:
    """``GET /v1/limits/{name}``: one limit (``404 UnknownLimit`` for a name never
    set); ``PUT``: change the fields given (``{"per_second", "burst", "concurrent"}``,
    each optional, ``null`` removes it), the others keep their value; answers the limit."""
    engine = api_state(request).engine
    name = request.path_params["name"]
    if request.method == "GET":
        return json_response(_json(await engine.get_limit(name)))
    body = await json_body(request, "the limit")
    if not isinstance(body, dict):
        raise InvalidArgument(
            "the body must be a JSON object with any of per_second, burst, concurrent "
            '(e.g. {"per_second": 20})'
        )
    for count in ("burst", "concurrent"):
        value = body.get(count)
        if isinstance(value, float) and value.is_integer():
            body[count] = int(value)  # JSON's 5.0 is the integer 5
    return json_response(_json(await engine.update_limit(name, **body)))


routes: list[BaseRoute] = [
    Route("/v1/limits", list_limits, methods=["GET"], name="limits"),
    Route("/v1/limits/{name:id}", limit, methods=["GET", "PUT"], name="limit"),
]
