"""Import a user's Python file by path, so its ``@fusee.workflow`` functions register."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType

__all__ = ("LoadError", "load_file")


class LoadError(Exception):
    """A file could not be imported; the message says which and why, on one line."""


def load_file(path: str) -> ModuleType:
    """Import the Python file at ``path`` as a module named after it.

    Its directory goes first on ``sys.path``, so the file imports its neighbours as
    ``python FILE`` would let it.

    Raises:
        LoadError: no such file, not a ``.py`` file, or its code raised while importing.

    Example:
        ``module = load_file("examples/agent.py")``
    """
    file = Path(path)
    if not file.exists():
        raise LoadError(f"no such file: {path}")
    if not file.is_file() or file.suffix != ".py":
        raise LoadError(f"{path}: not a Python file (expected a .py file)")
    resolved = file.resolve()
    directory = str(resolved.parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    name = _module_name(resolved)
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has one
        raise LoadError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise LoadError(
            f"cannot import {path}: SyntaxError: {exc.msg} (line {exc.lineno})"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any error of the user's module becomes one clear line
        sys.modules.pop(name, None)
        frames = traceback.extract_tb(exc.__traceback__)
        ours = [f for f in frames if Path(f.filename).resolve() == resolved] or frames
        where = f" (at {ours[-1].filename}:{ours[-1].lineno})" if ours else ""
        raise LoadError(f"cannot import {path}: {type(exc).__name__}: {exc}{where}") from None
    return module


def _module_name(file: Path) -> str:
    """The file's stem when that module name is free (or is this file), else a unique one."""
    stem = file.stem if file.stem.isidentifier() else "fusee_user_module"
    existing = sys.modules.get(stem)
    if existing is None or Path(getattr(existing, "__file__", "") or "").resolve() == file:
        return stem
    n = 1
    while f"{stem}_{n}" in sys.modules:
        n += 1
    return f"{stem}_{n}"
