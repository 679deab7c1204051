"""Fixtures of the rev-auth repros (tests/conftest.py is not an ancestor of this folder)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fusee.adapters.jetstream.server import EmbeddedServer


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    server = EmbeddedServer.start(tmp_path_factory.mktemp("nats"))
    try:
        yield server
    finally:
        server.stop()
