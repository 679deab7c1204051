"""The import graph of ``fusee`` has no cycles, and the HTTP and CLI adapters use only
public names, checked on the source with the layering test's reader.

Every import counts, wherever it is: at the top, in ``TYPE_CHECKING`` blocks and in
function bodies (a lazy import hides a cycle from the interpreter, not from the reader).
An import names a module, or a name in one (``from m import n``: ``m.n`` when ``n`` is
a submodule, else ``m``). What Python does implicitly is not an edge: importing
``fusee.a.b`` first runs ``fusee/__init__.py`` and ``fusee/a/__init__.py``, and a
package's ``__init__`` re-exporting its modules is the curated surface, not a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.test_layering import SRC, imported_modules, module_name

# Cycles known and being removed elsewhere, each with why; this must shrink to nothing.

ADAPTERS_THAT_USE_PUBLIC_NAMES = ("adapters/http", "adapters/cli")


def import_graph(root: Path = SRC, package: str = "fusee") -> dict[str, set[str]]:
    """``{module: the modules of the package it imports}``, every import counted."""
    paths = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        deps = set()
        for imported in imported_modules(path, root):
            while imported and imported not in paths:  # a name in a module: the module
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                deps.add(imported)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(graph: dict[str, set[str]], component: frozenset[str]) -> list[str]:
    """The edges inside a cycle, for the failure message."""
    return [f"{a} -> {b}" for a in sorted(component) for b in sorted(graph[a] & component)]


def private_imports(root: Path = SRC) -> dict[str, list[str]]:
    """``{file: private fusee names it imports}`` for the adapters that must use only
    public ones: a module or a name with a component starting with ``_``."""
    out: dict[str, list[str]] = {}
    for adapter in ADAPTERS_THAT_USE_PUBLIC_NAMES:
        for path in sorted((root / "fusee" / adapter).rglob("*.py")):
            bad = sorted(
                m
                for m in imported_modules(path, root)
                if m.split(".")[0] == "fusee"
                and any(part.startswith("_") and not part.startswith("__") for part in m.split("."))
            )
            if bad:
                out[path.relative_to(root).as_posix()] = bad
    return out


def test_the_package_has_modules() -> None:
    # a moved package would make the checks below pass vacuously
    graph = import_graph()
    assert "fusee._engine" in graph
    assert "fusee.adapters.jetstream.store" in graph
    assert list((SRC / "fusee" / "adapters" / "http").rglob("*.py"))


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert [describe(graph, c) for c in cycles(graph)] == []


def test_http_and_cli_import_only_public_names() -> None:
    assert private_imports() == {}


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in {"fusee/__init__.py": "", **files}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    "b_imports_a",
    [
        "from fusee.a import X",
        "def f():\n    from fusee import a",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X",
        "import fusee.a",
    ],
)
def test_a_cycle_is_found_in_every_import_form(tmp_path: Path, b_imports_a: str) -> None:
    root = _package(tmp_path, {"fusee/a.py": "from fusee.b import Y", "fusee/b.py": b_imports_a})
    assert cycles(import_graph(root)) == [frozenset({"fusee.a", "fusee.b"})]


def test_parent_packages_and_acyclic_imports_are_no_cycle(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "fusee/__init__.py": "from fusee.sub.m import M as M",
            "fusee/sub/__init__.py": "",
            "fusee/sub/m.py": "from fusee.low import L",
            "fusee/low.py": "import json",
        },
    )
    assert import_graph(root)["fusee.sub.m"] == {"fusee.low"}
    assert cycles(import_graph(root)) == []


def test_a_private_import_of_an_adapter_is_caught(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "fusee/adapters/http/app.py": "from fusee._engine import Engine\nimport fusee.errors",
            "fusee/adapters/cli/main.py": "from fusee.actors.context import _secret\nimport fusee",
        },
    )
    assert private_imports(root) == {
        "fusee/adapters/cli/main.py": ["fusee.actors.context._secret"],
        "fusee/adapters/http/app.py": ["fusee._engine", "fusee._engine.Engine"],
    }


# -- private members stay in their module ---------------------------------------------

# private names of the standard library fusee uses on purpose
STDLIB_PRIVATE = frozenset({"_getframe"})


def _private_defined(tree: ast.Module) -> set[str]:
    """The private attribute names a module defines: its methods and functions, the
    attributes its code assigns on ``self``/``cls`` (an assignment to another object's
    private attribute is a reach too), its classes' annotated fields."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("_"):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def private_reaches(root: Path = SRC) -> dict[str, list[str]]:
    """``{file: ["line: expr"]}``: reads of ``obj._name`` (not on ``self``/``cls``)
    where no code of that module defines ``_name``: another module's private member."""
    out: dict[str, list[str]] = {}
    for path in sorted((root / "fusee").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        own = _private_defined(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
                continue
            if node.attr.startswith("__") or node.attr in own or node.attr in STDLIB_PRIVATE:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            out.setdefault(str(path.relative_to(root)), []).append(
                f"{node.lineno}: {ast.unparse(node)}"
            )
    return out


def test_no_module_reaches_into_another_modules_private_members() -> None:
    assert private_reaches() == {}


def test_the_private_member_check_sees_a_reach(tmp_path: Path) -> None:
    pkg = tmp_path / "fusee"
    pkg.mkdir()
    (pkg / "a.py").write_text("class A:\n    def _hidden(self) -> None: ...\n")
    (pkg / "b.py").write_text("def use(a):\n    return a._hidden()\n")
    assert private_reaches(tmp_path) == {"fusee/b.py": ["2: a._hidden"]}
