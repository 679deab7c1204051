"""The web UI's files (src/fusee/ui/static/, package data served at /ui): every module
an ES module imports and every file the page names is there, and nothing the page loads
comes from anywhere else (its CSP allows only 'self')."""

from __future__ import annotations

import re

from fusee.adapters.http.routes.ui import STATIC

IMPORT = re.compile(r"""^import .* from "\./([\w.-]+)";$""", re.MULTILINE)
DYNAMIC = re.compile(r"""import\(""")


def _files() -> dict[str, str]:
    return {f.name: f.read_text() for f in STATIC.iterdir() if f.is_file()}


def test_every_import_and_every_file_the_page_names_is_shipped() -> None:
    files = _files()
    assert {"index.html", "app.js", "style.css"} <= set(files)
    for name, text in files.items():
        if not name.endswith(".js"):
            continue
        for imported in IMPORT.findall(text):
            assert imported in files, f"{name} imports ./{imported}, which is not shipped"
        assert not DYNAMIC.search(text), f"{name}: a dynamic import (keep the graph static)"
    named = re.findall(r'(?:src|href)="/ui/static/([\w.-]+)"', files["index.html"])
    assert sorted(named) == ["app.js", "style.css"]
    for name in named:
        assert name in files


def test_nothing_is_loaded_from_elsewhere() -> None:
    for name, text in _files().items():
        assert not re.search(r"https?://", text), f"{name} names another origin"
