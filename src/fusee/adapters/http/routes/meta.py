"""``/healthz`` and ``/openapi.json``: about the API itself."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from fusee.adapters.http.errors import error_response
from fusee.adapters.http.openapi import openapi_document
from fusee.adapters.http.state import api_state, json_response

__all__ = ("routes",)


async def healthz(request: Request) -> Response:
    """``200 {"status": "ok"}`` while the engine's NATS connection is up, else ``503``."""
    engine = api_state(request).engine
    if not engine.store.nc.is_connected:
        return error_response(503, "ServiceUnavailable", "not connected to NATS (reconnecting)")
    return json_response({"status": "ok", "namespace": engine.namespace})


async def openapi(request: Request) -> Response:
    """The OpenAPI 3.1 document of this API."""
    return json_response(openapi_document(request.app.routes))


routes: list[BaseRoute] = [
    Route("/healthz", healthz, methods=["GET"], name="healthz"),
    Route("/openapi.json", openapi, methods=["GET"], name="openapi"),
]
