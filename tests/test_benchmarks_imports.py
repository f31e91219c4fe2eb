"""The benchmark scripts import what fibgen has: they are run by hand, rarely, so a module
moved or a name renamed inside fibgen would otherwise be found only by the next person who
runs them."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _fibgen_imports() -> list[tuple[str, int, str, str | None]]:
    """(script, line, module, name or None) for every import of fibgen in benchmarks/."""
    found = []
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "fibgen":
                found += [(path.name, node.lineno, node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                found += [
                    (path.name, node.lineno, a.name, None)
                    for a in node.names
                    if a.name.split(".")[0] == "fibgen"
                ]
    return found


def test_every_fibgen_import_of_the_benchmarks_resolves():
    imports = _fibgen_imports()
    assert len(imports) > 20, "the scripts' imports were not found"
    missing = []
    for script, line, module, name in imports:
        where = f"benchmarks/{script}:{line}"
        try:
            imported = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{where}: {module} ({exc})")
            continue
        if name is not None and not hasattr(imported, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{where}: {module} has no {name}")
    assert not missing, "\n".join(missing)
