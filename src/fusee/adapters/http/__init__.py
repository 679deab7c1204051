"""The HTTP API: an ASGI app on an engine (``create_app``) and a way to serve it (``serve_api``).

Reference: ``docs/reference/http-api.md``; the OpenAPI document, generated from the routes, is
``GET /openapi.json``.
"""

from fusee.adapters.http.app import create_app as create_app
from fusee.adapters.http.server import Bound as Bound
from fusee.adapters.http.server import serve_api as serve_api

__all__ = ("create_app", "serve_api", "Bound")
