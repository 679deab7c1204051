"""Benchmarks: ``python -m bench`` (``make bench``) prints JSON lines, then a table."""

from __future__ import annotations

import os

__all__ = ("floor_replicas",)


def floor_replicas() -> int:
    """The replica count of the floors' own streams: ``$FUSEE_REPLICAS`` (else 1), the
    one ``fusee.connect`` gives the namespace's, so a floor is measured on the same kind
    of stream as what it is compared with (``python -m bench.cluster`` sets 3)."""
    return int(os.environ.get("FUSEE_REPLICAS") or 1)
