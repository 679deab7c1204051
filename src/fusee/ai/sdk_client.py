"""The SDK client a provider model uses: the caller's own, or a new one, always with
the SDK's retries off (``max_retries=0``), so the step's retry policy is the one that
applies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fusee.errors import ConfigError

__all__ = ("sdk_client",)


def sdk_client(
    factory: Callable[..., Any],
    client: Any,
    *,
    name: object,
    base_url: str | None,
    api_key: str | None,
    where: str,
) -> Any:
    """``client`` copied with ``max_retries=0``, or ``factory(base_url=, api_key=,
    max_retries=0)`` when it is None.

    Raises:
        ConfigError: ``name`` is not a non-empty str, or ``client`` came with
            ``base_url``/``api_key``.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: the model name {name!r} is not a non-empty str")
    if client is None:
        return factory(base_url=base_url, api_key=api_key, max_retries=0)
    if base_url is not None or api_key is not None:
        raise ConfigError(f"{where}: give client= or base_url=/api_key=, not both")
    return client.with_options(max_retries=0)
