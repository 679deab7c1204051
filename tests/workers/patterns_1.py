"""The agent patterns of ``examples/patterns/`` that ``tests/integration/test_patterns_1.py``
runs, imported as ``fusee dev`` imports a file, so one worker serves them all. The test
module imports ``FILES`` from here without loading them (it serves nothing)."""

from __future__ import annotations

from pathlib import Path

from fusee.adapters.cli.loader import load_file

PATTERNS = Path(__file__).resolve().parents[2] / "examples" / "patterns"
FILES = (
    "prompt_chaining",
    "routing",
    "parallelization",
    "orchestrator_workers",
    "evaluator_optimizer",
    "agent_loop",
    "sessions",
    "approval",
)

if __name__ != "tests.workers.patterns_1":  # a worker's module (launch.py), not the tests' import
    for _stem in FILES:
        load_file(str(PATTERNS / f"{_stem}.py"))
