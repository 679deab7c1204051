"""Settings the hypothesis state machines share: reproducible (derandomized, no
example database), no deadline (the machines drive real code, some on an event loop),
no health checks (their rules draw data as they go)."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

__all__ = ("machine_settings",)


def machine_settings(examples: int, steps: int, *, shrink: bool = True) -> settings:
    """``examples`` runs of up to ``steps`` rules; ``shrink=False`` for a search that
    only has to find a failure (a defect put back), not minimise it."""
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
