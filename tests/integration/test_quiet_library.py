"""fusee as a library prints nothing of its own: a plain script's stdout is its own, and
below warning nothing shows unless the application configures logging."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

SCRIPT = """
import logging, sys
import anyio
import fusee

if sys.argv[3] == "debug":
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)

@fusee.workflow("quiet")
async def quiet(ctx, x):
    return await ctx.step("double", lambda: x * 2)

async def main():
    async with await fusee.connect(sys.argv[1], namespace=sys.argv[2]) as engine:
        async with engine.worker():
            run = await engine.start(quiet, "q-1", 21)
            assert await run.result(timeout=20) == 42

anyio.run(main)
"""


def _run(tmp_path: Path, url: str, namespace: str, mode: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    return subprocess.run(
        [sys.executable, str(script), url, namespace, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


async def test_a_plain_script_prints_nothing(
    nats_server: Any, namespace: str, tmp_path: Path
) -> None:
    done = _run(tmp_path, nats_server.url, namespace, "plain")
    assert done.stdout == ""
    assert done.stderr == ""


async def test_an_application_that_configures_logging_sees_fusee_lines(
    nats_server: Any, namespace: str, tmp_path: Path
) -> None:
    done = _run(tmp_path, nats_server.url, namespace + "d", "debug")
    assert done.stdout == ""
    assert "event='step.completed'" in done.stderr
    assert "run_id='q-1'" in done.stderr
