"""The in-memory benchmark still runs against the actor as it is (its figures are for
``make bench``, never asserted here): a change to the actor's constructor or its store
port must not leave it broken unnoticed."""

from __future__ import annotations

import anyio
from bench.step_cpu import cpu_per_step


def test_the_step_cpu_bench_runs_the_real_actor() -> None:
    assert anyio.run(cpu_per_step, 2, 3) > 0
