"""The CLI does not import rich's progress bar until a bulk command draws it (it cost
every command about 7.5 ms: issue 12's review)."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_imports_without_rich_progress() -> None:
    code = "import sys, fusee.adapters.cli.main; print('rich.progress' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"
