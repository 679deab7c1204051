"""Fixtures for tests that run workers in their own processes, and the region drills'
loopback topology."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import LoopbackRegions
from tests.workers.procs import worker_procs

__all__ = ("regions", "worker_procs")


@pytest.fixture
def regions(tmp_path: Path) -> Iterator[LoopbackRegions]:
    """Two regions of three servers and a witness, on loopback (``LoopbackRegions``)."""
    topology = LoopbackRegions.start(tmp_path / "regions")
    try:
        yield topology
    finally:
        topology.stop()
