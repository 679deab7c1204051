"""Fixtures of the rev-agents repros (tests/conftest.py is not an ancestor of this folder)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator

import pytest

import fusee
from fusee.adapters.jetstream.server import EmbeddedServer


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    server = EmbeddedServer.start(tmp_path_factory.mktemp("nats"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def namespace() -> str:
    return f"t{secrets.token_hex(4)}"


@pytest.fixture
async def engine(nats_server: EmbeddedServer, namespace: str) -> AsyncIterator[fusee.Engine]:
    eng = await fusee.connect(nats_server.url, namespace=namespace, partitions=4)
    try:
        yield eng
    finally:
        await eng.close()
