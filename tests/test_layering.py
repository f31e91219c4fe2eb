"""The layering: each package of fibgen imports only the packages below it (docs/architecture.md).

Every ``import`` of every module under ``fibgen/`` is read from its source (function-level
imports included, as they are imports all the same), and each one that crosses from one
layer into another must be a dependency that the layer is allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "fibgen"

# The layers, bottom up, and what each may import besides itself. The runtime sits beside the
# compiler and the code generator, not above them: it runs generated code and never the
# generator, so it imports neither.
ALLOWED: dict[str, set[str]] = {
    # Helpers of every layer: where data files are, atomic file writing.
    "base": set(),
    # The FlashInfer Trace data model and the dataset layout's I/O.
    "format": {"base"},
    # The .fidef language to the IR.
    "compiler": {"base", "format"},
    # The IR to files.
    "codegen": {"base", "format", "compiler"},
    # Routing of live calls to solutions; tracing.
    "runtime": {"base", "format"},
    # A dataset's workloads (read, made, written) and checks of a whole dataset.
    "curation": {"base", "format", "runtime"},
    # Benchmark runs and their reports.
    "bench": {"base", "format", "runtime", "curation"},
    # Steps that span the compiler and the code generator, which may not import each other
    # (`fibgen import`, the definition `fibgen workloads` writes).
    "pipeline": {"base", "format", "compiler", "codegen", "runtime", "curation"},
    # The command line: parses arguments, calls the layers below, prints.
    "cli": {"base", "format", "compiler", "codegen", "runtime", "curation", "bench", "pipeline"},
}

# Third-party packages that only the generator's layers may import.
GENERATOR_ONLY = {"lark", "jinja2"}
NO_GENERATOR = {"base", "format", "runtime", "curation", "bench"}

# Known violations of today, each (importing module, imported module). They pass for now
# and are to be removed as the code is moved; an entry that no longer happens fails
# test_every_known_violation_still_happens, so that the list only shrinks.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


def layer_of(module: str) -> str | None:
    """The layer of a module of fibgen, or None for one that no rule places."""
    parts = module.split(".")
    if parts[0] != "fibgen":
        return None
    if len(parts) == 1:
        return "base"
    top = parts[1]
    if top in ALLOWED:
        return top
    if top in ("paths", "fsutil", "data"):
        return "base"
    # The command line, wherever its modules are: fibgen/cli/, or cli_*.py beside it,
    # `python -m fibgen`, and the modules that only the command line uses.
    if top.startswith("cli") or top in ("scaffold", "demo", "__main__"):
        return "cli"
    return None


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for path in sorted(PACKAGE.rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _imports(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the module, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                # `from fibgen.bench import worker` imports the module fibgen.bench.worker.
                child = f"{base}.{alias.name}"
                found.append((child if child in known else base, node.lineno))
    return found


def _crossings() -> tuple[list[tuple[str, str, str]], list[str]]:
    """Every import that a layer is not allowed, as (module, imported, where); and the
    modules that no layer rule places."""
    modules = _modules()
    known = set(modules)
    bad, unplaced = [], []
    for module, path in modules.items():
        layer = layer_of(module)
        if layer is None:
            unplaced.append(module)
            continue
        for imported, line in _imports(module, path, known):
            where = f"{path.relative_to(REPO)}:{line}"
            top = imported.split(".")[0]
            if top in GENERATOR_ONLY:
                if layer in NO_GENERATOR:
                    bad.append((module, imported, where))
                continue
            target = layer_of(imported)
            if target is None or target == layer:
                continue
            if target not in ALLOWED[layer]:
                bad.append((module, imported, where))
    return bad, unplaced


def test_every_module_has_a_layer():
    _, unplaced = _crossings()
    assert not unplaced, (
        f"modules that no layer rule places: {unplaced}; say where they belong in "
        "layer_of (tests/test_layering.py) and docs/architecture.md"
    )


def test_no_module_imports_above_its_layer():
    bad, _ = _crossings()
    new = [
        f"{where}: {module} ({layer_of(module)}) imports {imported}"
        f" ({layer_of(imported) or imported})"
        for module, imported, where in bad
        if (module, imported) not in KNOWN_VIOLATIONS
    ]
    assert not new, "imports against the layering:\n" + "\n".join(new)


def test_every_known_violation_still_happens():
    bad, _ = _crossings()
    happening = {(module, imported) for module, imported, _ in bad}
    gone = sorted(KNOWN_VIOLATIONS - happening)
    assert not gone, f"no longer violations: remove them from KNOWN_VIOLATIONS: {gone}"


@pytest.mark.parametrize(
    "layer, forbidden",
    [
        ("runtime", {"compiler", "codegen", "cli", "curation", "bench"}),
        ("codegen", {"cli", "bench", "runtime", "curation"}),
        ("compiler", {"codegen", "cli", "bench", "runtime", "curation"}),
        ("format", {"compiler", "codegen", "runtime", "curation", "bench", "cli"}),
        ("curation", {"compiler", "codegen", "bench", "cli"}),
        ("bench", {"compiler", "codegen", "cli"}),
    ],
)
def test_the_rules_of_the_pipeline_are_the_table(layer, forbidden):
    # The rules of docs/architecture.md, said one by one, against ALLOWED above.
    assert not forbidden & ALLOWED[layer]


@pytest.mark.slow
def test_generated_python_imports_only_the_runtime():
    generated = REPO / "generated"
    bad = []
    for path in sorted(generated.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                if name.split(".")[0] in GENERATOR_ONLY or (
                    name.split(".")[0] == "fibgen" and layer_of(name) != "runtime"
                ):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
    assert not bad, "generated code imports more than fibgen.runtime:\n" + "\n".join(bad)
