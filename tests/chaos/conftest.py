"""Fixtures for tests that run workers in their own processes."""

from tests.workers.procs import worker_procs

__all__ = ("worker_procs",)
