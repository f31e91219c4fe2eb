"""The layering: each package of fibgen imports only the packages below it (docs/architecture.md).

Every ``import`` of every module under ``fibgen/`` is read from its source (function-level
imports included, as they are imports all the same), and each one that crosses from one
layer into another must be a dependency that the layer is allowed.
"""

from __future__ import annotations

import ast
import sys
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


def _circles() -> list[list[str]]:
    """The import circles among fibgen's modules: each strongly connected set of two or more
    modules of the graph of every import (function-level and type-only ones included, as
    each is a dependency all the same), by Tarjan's algorithm."""
    modules = _modules()
    known = set(modules)
    graph = {
        m: sorted({i for i, _ in _imports(m, p, known) if i in known and i != m})
        for m, p in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circle():
    circles = _circles()
    assert not circles, "modules that import each other, directly or around a circle:\n" + (
        "\n".join(" <-> ".join(c) for c in circles)
    )


def test_the_circle_check_finds_a_circle(monkeypatch):
    # Two modules that import each other, one of them only for a type and inside a function.
    fake = {"fibgen.a": "import fibgen.b\n", "fibgen.b": "def f():\n    from fibgen import a\n"}
    paths = {name: Path(name) for name in fake}
    monkeypatch.setattr(sys.modules[__name__], "_modules", lambda: paths)
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: fake[str(self)])
    assert _circles() == [["fibgen.a", "fibgen.b"]]


def _private_reaches(modules: dict[str, Path]) -> list[str]:
    """Where a module of fibgen takes another module's private name: ``from fibgen.x import
    _y``, or ``m._y`` on a module ``m`` of fibgen it imported."""
    known = set(modules)
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        aliases: set[str] = set()  # names bound to modules of fibgen
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fibgen"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(REPO)}:{node.lineno}: {alias.name}")
                    if f"{node.module}.{alias.name}" in known:
                        aliases.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("fibgen") and alias.asname:
                        aliases.add(alias.asname)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_takes_another_modules_private_names():
    found = _private_reaches(_modules())
    assert not found, "private names taken from another module (make them public):\n" + (
        "\n".join(found)
    )


def test_the_private_name_check_finds_both_ways(monkeypatch):
    fake = {
        "fibgen.a": "from fibgen.b import _hidden\n",
        "fibgen.b": "from fibgen import c\nc._secret()\n_hidden = 1\n",
        "fibgen.c": "from fibgen.b import _hidden as public  # noqa\nfrom fibgen.b import __doc__\n",
    }
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: fake[str(self)])
    monkeypatch.setattr(sys.modules[__name__], "REPO", Path(""))
    found = _private_reaches({name: Path(name) for name in fake})
    assert found == ["fibgen.a:1: _hidden", "fibgen.b:2: c._secret", "fibgen.c:1: _hidden"]


# The one module of fibgen that generated code imports (fibgen/runtime/for_generated.py).
FOR_GENERATED = "fibgen.runtime.for_generated"


@pytest.mark.slow
def test_generated_python_imports_only_the_runtimes_fixed_module():
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
                top = name.split(".")[0]
                if top in GENERATOR_ONLY or (top == "fibgen" and name != FOR_GENERATED):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
    assert not bad, f"generated code imports more than {FOR_GENERATED}:\n" + "\n".join(bad)


def test_the_fixed_module_gives_every_name_a_rule_may_call():
    from fibgen.runtime import for_generated
    from fibgen.runtime.routing import rulefns

    helpers = {
        n for n, v in vars(rulefns).items() if callable(v) and v.__module__ == rulefns.__name__
    }
    assert helpers and helpers <= set(for_generated.__all__)
    for name in for_generated.__all__:
        assert getattr(for_generated, name) is not None, name


def test_earlier_generated_packages_still_import(tmp_path):
    # The import lines packages generated before the runtime's sub-packages carry (Note
    # [generated imports] in fibgen/runtime/for_generated.py), in a fresh interpreter.
    import subprocess
    import sys

    lines = [
        "from fibgen.runtime.apply import ApiDefault, INPLACE, ORIGINAL, RETURNS, SERVING, register_api",
        "from fibgen.runtime.ops import decode as _decode, fresh as _fresh, pack as _pack",
        "from fibgen.runtime.rulefns import kv_pair",
        "from fibgen.runtime.builders import build_extension",
        "from fibgen.runtime import register_package, testing",
        "import fibgen.runtime",
        "assert callable(fibgen.runtime.apply) and fibgen.runtime.apply.__name__ == 'apply'",
        "assert testing.__name__ == 'fibgen.runtime.checking.testing'",
        "assert build_extension.__module__ == 'fibgen.runtime.solutions.builders'",
    ]
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
