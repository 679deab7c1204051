"""``/healthz`` and ``/openapi.json``: about the API itself."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from fusee.adapters.http.errors import ApiError
from fusee.adapters.http.models import Health
from fusee.adapters.http.schemas import errors
from fusee.adapters.http.state import api_state

__all__ = ("handlers",)


@get(
    "/healthz",
    summary="Liveness and readiness",
    security=[{}],
    responses=errors(e503="`service_unavailable`: the NATS connection is down (reconnecting)."),
)
async def healthz(request: Request[Any, Any, Any]) -> Health:
    """``200`` while the engine's NATS connection is up, else ``503``."""
    engine = api_state(request).engine
    if not engine.store.nc.is_connected:
        raise ApiError(503, "not connected to NATS (reconnecting)")
    return Health(status="ok", namespace=engine.namespace)


@get("/openapi.json", include_in_schema=False, summary="This document")
async def document(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """The OpenAPI 3.1 document, generated from the routes' own types."""
    return Response(request.app.openapi_schema.to_schema())


handlers = [healthz, document]
