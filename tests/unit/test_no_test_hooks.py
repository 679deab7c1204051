"""The product code reads no test-only hook: an interruption at a known point is the
tests' own doing (``tests/workers/bulk_cli.py`` wraps the CLI's per-run callback), not
an environment variable a deployment could set by mistake (issue 12's review)."""

from __future__ import annotations

from pathlib import Path

import fusee

SRC = Path(fusee.__file__).parent


def test_no_module_of_fusee_reads_a_test_hook() -> None:
    found = [
        str(path.relative_to(SRC))
        for path in sorted(SRC.rglob("*.py"))
        if "FUSEE_TEST_" in path.read_text()
    ]
    assert found == []
