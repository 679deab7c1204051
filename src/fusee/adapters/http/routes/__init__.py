"""The API's routes, one module per resource; each exports ``routes``, a list of Starlette routes.

A new resource (start, signal, cancel, objects) is a new module here whose ``routes``
``fusee.adapters.http.app`` adds, and an entry in ``fusee.adapters.http.openapi``.
"""

# the `{…:id}` route parameters: one percent-encoded path segment each
import fusee.adapters.http.paths  # noqa: F401
