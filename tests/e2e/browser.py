"""Headless Chromium for the web UI's tests: Debian's ``chromium`` package driven by
Playwright for Python (no ``playwright install``: the browser is the system's), and a
check that a screenshot is not blank.

Without a chromium the tests skip, saying why; under ``CI=true`` they fail instead
(``.ci/run`` installs it), so CI can never pass without running them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    """The chromium executable (``FUSEE_CHROMIUM``, else ``chromium`` on ``PATH``)."""
    given = os.environ.get("FUSEE_CHROMIUM")
    found = given or shutil.which("chromium")
    if found and Path(found).exists():
        return found
    why = "no chromium on PATH (Debian: apt-get install chromium; or set FUSEE_CHROMIUM)"
    if given:
        why = f"FUSEE_CHROMIUM={given!r} does not exist"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the browser tests: {why}")
    pytest.skip(why)


COUNT_COLOURS = """async (b64) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const bitmap = await createImageBitmap(new Blob([bytes], { type: "image/png" }));
  const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
  const g = canvas.getContext("2d");
  g.drawImage(bitmap, 0, 0);
  const px = g.getImageData(0, 0, bitmap.width, bitmap.height).data;
  const seen = new Set();
  for (let i = 0; i < px.length; i += 4) seen.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
  return seen.size;
}"""
"""A function for ``page.evaluate``: how many distinct colours a PNG (base64) holds,
decoded by the browser itself (on a blank page of its own)."""
