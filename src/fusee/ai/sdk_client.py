"""The SDK client a provider model uses: the caller's own, or a new one, always with
the SDK's retries off (``max_retries=0``), so the step's retry policy is the one that
applies; and :class:`SDKModel`, what the provider models share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from fusee.ai.types import NamedModel
from fusee.errors import ConfigError

__all__ = ("sdk_client", "SDKModel")


class SDKModel(NamedModel):
    """A model over a provider SDK's client: its name, the client, the settings passed
    to every request, and whether it continues a prefill. Its ``repr`` is the call that
    makes it (``factory``), with the options that are not the default."""

    factory: ClassVar[str]  # the function that makes one: "openai_model"
    defaults: ClassVar[dict[str, Any]] = {}  # its options' defaults, left out of repr

    def __init__(self, name: str, client: Any, settings: dict[str, Any], prefill: bool) -> None:
        self._name = name
        self.client = client
        self.settings = settings
        self._prefill = prefill

    def __repr__(self) -> str:
        defaults = {**self.defaults, "prefill": False}
        options = {**{k: getattr(self, k) for k in self.defaults}, "prefill": self._prefill}
        shown = "".join(f", {k}={v!r}" for k, v in options.items() if v != defaults[k])
        return f"{self.factory}({self._name!r}{shown})"


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
