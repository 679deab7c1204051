"""The layers, checked on the source: the pure core and the actors stay free of I/O.

``fusee.runtime`` (records, replay, IDs, durations...) is deterministic code: no event
loop, no network, no clock, no randomness, no logging. ``fusee.actors`` talks to NATS
only through the ports in ``fusee.actors.ports``, and to the event loop through anyio.
The ruff ``banned-api`` rules say the same for some names; this reads every import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "fusee"

RUNTIME_BANNED = ("anyio", "asyncio", "nats", "socket", "time", "random", "structlog")
ACTORS_BANNED = ("nats", "asyncio", "fusee.adapters")
# the handles and the narrow client they talk through: the store is a port to them
HANDLES = ("_run.py", "_objects.py", "_client.py")
HANDLES_BANNED = ("nats", "fusee.adapters", "fusee._engine")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, root: Path = SRC) -> set[str]:
    """Every module ``path`` imports, anywhere in the file (``TYPE_CHECKING`` blocks and
    function bodies too), as absolute dotted names; ``from m import n`` gives ``m`` and
    ``m.n`` (``n`` may be a submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def violations(layer: str, banned: tuple[str, ...], root: Path = SRC) -> dict[str, list[str]]:
    """``{file: banned modules it imports}`` for the files of ``fusee.<layer>``."""
    out: dict[str, list[str]] = {}
    for path in sorted((root / "fusee" / layer).rglob("*.py")):
        bad = sorted(
            m
            for m in imported_modules(path, root)
            if any(m == b or m.startswith(b + ".") for b in banned)
        )
        if bad:
            out[path.relative_to(root).as_posix()] = bad
    return out


def test_the_layers_have_modules() -> None:
    # a moved package would make the checks below pass vacuously
    assert list((PACKAGE / "runtime").glob("*.py"))
    assert list((PACKAGE / "actors").glob("*.py"))


def test_runtime_does_no_io() -> None:
    assert violations("runtime", RUNTIME_BANNED) == {}


def test_actors_reach_nats_only_through_ports() -> None:
    assert violations("actors", ACTORS_BANNED) == {}


def test_the_handles_reach_the_store_only_through_its_port() -> None:
    # Run, ObjectKey and Replies use fusee.actors.ports.HandleStore, never NatsStore
    found = {
        name: sorted(
            m
            for m in imported_modules(PACKAGE / name)
            if any(m == b or m.startswith(b + ".") for b in HANDLES_BANNED)
        )
        for name in HANDLES
    }
    assert found == {name: [] for name in HANDLES}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import time", {"time"}),
        ("import anyio.abc as a", {"anyio.abc"}),
        ("from nats.js import api", {"nats.js", "nats.js.api"}),
        ("from fusee import adapters", {"fusee", "fusee.adapters"}),
        ("def f():\n    import random", {"random"}),
        ("from . import codec", {"fusee.runtime", "fusee.runtime.codec"}),
        ("from ..adapters.cli import main", {"fusee.adapters.cli", "fusee.adapters.cli.main"}),
    ],
)
def test_imports_are_read_in_every_form(tmp_path: Path, source: str, expected: set[str]) -> None:
    # the checker itself, on a file placed as fusee/runtime/probe.py
    probe = tmp_path / "fusee" / "runtime" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(source)
    assert imported_modules(probe, tmp_path) == expected


def test_a_banned_import_is_caught(tmp_path: Path) -> None:
    (tmp_path / "fusee" / "runtime").mkdir(parents=True)
    (tmp_path / "fusee" / "runtime" / "clocky.py").write_text("from time import monotonic\n")
    (tmp_path / "fusee" / "runtime" / "fine.py").write_text("import hashlib\n")
    assert violations("runtime", RUNTIME_BANNED, tmp_path) == {
        "fusee/runtime/clocky.py": ["time", "time.monotonic"]
    }
