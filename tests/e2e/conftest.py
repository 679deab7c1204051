"""Fixtures shared by the HTTP tests: each module starts its own API server and worker
(its ``api`` fixture, with ``base``, ``nats`` and ``namespace``); these talk to them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import fusee


@pytest.fixture
async def client(api: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the module's API server."""
    async with httpx.AsyncClient(base_url=api.base, timeout=20.0) as c:
        yield c


@pytest.fixture
async def engine(api: Any) -> AsyncIterator[fusee.Engine]:
    """An engine in the namespace the module's API server serves."""
    async with await fusee.connect(api.nats, namespace=api.namespace) as e:
        yield e
