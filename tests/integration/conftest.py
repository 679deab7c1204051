"""Fixtures for the integration tests: an engine per test, and worker processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import fusee
from tests.workers.procs import HERE, worker_procs

__all__ = ("engine", "worker_procs", "bulk_workers")


@pytest.fixture
async def engine(nats_server: Any, namespace: str) -> AsyncIterator[fusee.Engine]:
    """An engine on the session server, in this test's own namespace (4 partitions)."""
    eng = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        yield eng
    finally:
        await eng.close()


@pytest.fixture
async def bulk_workers(worker_procs: Any) -> Any:
    """A worker subprocess serving the bulk tests' workflows (tests/workers/bulk.py)."""
    workers = worker_procs()
    workers.module = HERE / "bulk.py"
    await workers.start()
    return workers
