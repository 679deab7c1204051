"""What the region drills share (tests/chaos/test_region_*.py): the region lease they
run with, the partition count, a worker's environment, a run's side-effect counts, the
home's engine, and the old-epoch records a promoted journal must not hold."""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import fusee
from fusee.adapters.jetstream.layout import EPOCH
from tests.cluster import Netns

PARTITIONS = 8

# the region lease of the drills' workers and failovers (20 s by default): a region
# loss's failover waits it out before it promotes the mirror
LEASE = "3"


def env_for(region: str, partner: str | None = None) -> dict[str, str]:
    env = {"FUSEE_REGION": region, "FUSEE_REPLICAS": "3", "FUSEE_REGION_LEASE": LEASE}
    if partner is not None:
        env["FUSEE_PARTNER_REGION"] = partner
    return env


def step_runs(log: Path) -> collections.Counter[str]:
    """How many times each step of one run started (its side-effect file)."""
    if not log.exists():
        return collections.Counter()
    return collections.Counter(line.split()[0] for line in log.read_text().splitlines() if line)


async def connect_home(url: str, namespace: str) -> fusee.Engine:
    """An engine in east, the namespace's home, with west its partner (R3)."""
    return await fusee.connect(
        url, namespace=namespace, region="east", partner="west", replicas=3,
        partitions=PARTITIONS,
    )  # fmt: skip


async def epoch_one_after(engine: fusee.Engine, stream: str, seq: int) -> list[int]:
    """Sequences above ``seq`` in ``stream`` whose record names epoch 1."""
    js = engine.store.js
    last = (await js.stream_info(stream)).state.last_seq
    out = []
    for s in range(seq + 1, last + 1):
        try:
            msg = await js.get_msg(stream, s)
        except Exception:  # noqa: BLE001 - a deleted or rolled-up sequence
            continue
        if (msg.headers or {}).get(EPOCH) == "1":
            out.append(s)
    return out


async def caught_up(engine: fusee.Engine) -> bool:
    """Whether the journal's mirror holds every record of its origin (and one at least)."""
    lag = await engine.mirror_lag()
    return lag is not None and lag.behind == 0 and lag.mirror_last_seq > 0


def network_namespaces(sites: tuple[str, ...]) -> Iterator[Netns]:
    """A fixture's body: :class:`Netns` for ``sites``, removed after the test. Where
    namespaces cannot be made (not root, no iproute2) the test is skipped, and under
    ``CI=true`` it fails instead: CI runs the partition drills, never skips them."""
    try:
        made = Netns.make(sites)
    except OSError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"a partition drill must run in CI: {exc}")
        pytest.skip(str(exc))
    try:
        yield made
    finally:
        made.remove()
