"""The API's routes, one module per resource; each exports ``handlers``, its typed
Litestar route handlers (the OpenAPI document is generated from their signatures)."""
