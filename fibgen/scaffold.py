"""`fibgen scaffold-solution`: a new solution folder for one definition, ready to fill in.

The folder is ``<output>/<author>/<op_type>/<definition>/<name>/``: a Solution JSON
(flashinfer-bench's schema, every source listed) and the sources, whose entry function has
the definition's exact signature. The python and triton scaffolds hold a correct body (the
reference's math, or a real triton kernel for the families in ``_TRITON_KERNELS``), so a
fresh scaffold passes its generated test; the cuda scaffold comes from the CUDA target.
"""

from __future__ import annotations

import ast
import difflib
import getpass
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fibgen.compiler import ir

LANGUAGES = ("python", "triton", "cuda")
ENTRY_SYMBOL = "run"
_ENTRY_FILES = {"python": "main.py", "triton": "main.py"}

# Families that get a real triton kernel, by name → template. Others get a triton file whose
# entry runs the reference's math in torch, marked as the place to write the kernel.
_TRITON_KERNELS = {"rmsnorm": "scaffold_triton_rmsnorm.py.j2"}


class ScaffoldError(Exception):
    """A scaffold that cannot be written; the message says why, for the command line."""


@dataclass(frozen=True)
class Scaffold:
    """What was written: the solution folder, its JSON and its sources (relative paths)."""

    folder: Path
    solution_json: Path
    sources: tuple[str, ...]


def default_author() -> str:
    """The login name, which the Solution JSON records as author unless one is given."""
    try:
        return getpass.getuser() or "author"
    except Exception:  # no login name in some containers
        return "author"


def _compile(definitions: str) -> ir.Module:
    from fibgen.compiler import compile_paths
    from fibgen.compiler.diagnostics import has_errors, render_all

    if not Path(definitions).exists():
        raise ScaffoldError(f"definitions folder {definitions} does not exist")
    result = compile_paths([definitions])
    if result.module is None or has_errors(result.diagnostics):
        raise ScaffoldError(render_all(result.diagnostics, result.sources).rstrip())
    return result.module


def find_definition(module: ir.Module, name: str) -> tuple[ir.Definition, ir.Family]:
    """The definition called ``name`` and its family; an error lists the closest names."""
    by_name = {d.name: d for d in module.definitions}
    defn = by_name.get(name)
    if defn is None:
        close = difflib.get_close_matches(name, sorted(by_name), n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ScaffoldError(f"unknown definition {name!r}{hint}")
    family = next(f for f in module.families() if f.name == defn.family)
    return defn, family


def _reference_as(reference: str, new_name: str) -> str:
    """The reference with its top-level ``run`` renamed, so the entry can be called ``run``."""
    tree = ast.parse(reference)
    node = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == ENTRY_SYMBOL
    )
    lines = reference.splitlines()
    lines[node.lineno - 1] = lines[node.lineno - 1].replace(
        f"def {ENTRY_SYMBOL}(", f"def {new_name}(", 1
    )
    return "\n".join(lines).strip() + "\n"


def _tensor_doc(t: ir.DefTensor) -> str:
    shape = "scalar" if t.shape is None else f"[{', '.join(t.shape)}]"
    return f"{t.name}: {t.dtype}{shape}"


def _eps(reference: str | None) -> float:
    # Row-wise norms spell their epsilon as a module constant `EPS = ...` in the reference.
    for node in ast.parse(reference or "").body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["EPS"]
            and isinstance(node.value, ast.Constant)
        ):
            return float(node.value.value)
    return 1e-6


def _context(defn: ir.Definition, name: str, dps: bool) -> dict[str, object]:
    inputs = [t.name for t in defn.inputs]
    outputs = [t.name for t in defn.outputs]
    tensor_outputs = [t.name for t in defn.outputs if t.shape is not None]
    return {
        "name": name,
        "definition": defn.name,
        "params": ", ".join(inputs + outputs if dps else inputs),
        "inputs": ", ".join(inputs),
        "input_docs": [_tensor_doc(t) for t in defn.inputs],
        "output_docs": [_tensor_doc(t) for t in defn.outputs],
        "constraints": list(defn.constraints),
        "dps": dps,
        "outputs": outputs,
        "outputs_tuple": ", ".join(outputs) + ("," if len(outputs) == 1 else ""),
        "copies": [f"{o}.copy_(_{o})" for o in tensor_outputs],
        "returned": ", ".join(outputs),
        "underscored": ", ".join(f"_{o}" for o in outputs) + ("," if len(outputs) == 1 else ""),
    }


def _python_sources(defn: ir.Definition, name: str, dps: bool, language: str) -> dict[str, str]:
    from fibgen.codegen.python_dispatch import _render

    if defn.reference is None:
        raise ScaffoldError(
            f"{defn.name} has no reference yet: a {language} scaffold starts from the "
            "reference's math; write the reference in the .fidef first"
        )
    context = _context(defn, name, dps)
    template = "scaffold_python.py.j2"
    if language == "triton":
        template = _TRITON_KERNELS.get(defn.family, "scaffold_triton_torch.py.j2")
        context["eps"] = repr(_eps(defn.reference))
    context["reference"] = _reference_as(defn.reference, "_reference")
    return {_ENTRY_FILES[language]: _render(template, **context)}


def _cuda_sources(defn: ir.Definition, family: ir.Family, dps: bool) -> dict[str, str]:
    try:
        from fibgen.codegen.cuda import scaffold_sources
    except ImportError:
        raise ScaffoldError(
            "--language cuda is not available in this fibgen: the CUDA target has no "
            "scaffold_sources yet; use --language python or triton"
        ) from None
    return scaffold_sources(defn, family, entry=ENTRY_SYMBOL, dps=dps)


def _entry_file(sources: dict[str, str], language: str) -> str:
    if language in _ENTRY_FILES:
        return _ENTRY_FILES[language]
    # The CUDA target names its files; the binding is the one that exports the entry.
    for path in sorted(sources):
        if path.endswith((".cu", ".cpp")) and "binding" in Path(path).stem:
            return path
    return next(p for p in sorted(sources) if p.endswith((".cu", ".cpp")))


def scaffold_solution(
    definition: str,
    *,
    language: str,
    author: str | None = None,
    name: str | None = None,
    dps: bool = True,
    output: str | Path = "solutions",
    definitions: str = "definitions",
    force: bool = False,
) -> Scaffold:
    """Write a solution folder for ``definition``; nothing is written when anything fails."""
    from fibgen.codegen.pyformat import format_python
    from fibgen.format.jsonio import dump_solution
    from fibgen.format.models import BuildSpec, Solution, SourceFile

    if language not in LANGUAGES:
        raise ScaffoldError(f"unknown language {language!r}; choose one of {', '.join(LANGUAGES)}")
    author = author or default_author()
    name = name or f"{language}_{definition}"
    for what, value in (("author", author), ("name", name)):
        if not value or "/" in value or "\\" in value or value in (".", ".."):
            raise ScaffoldError(f"--{what} {value!r} must be a plain folder name")
    defn, family = find_definition(_compile(definitions), definition)

    if language == "cuda":
        sources = _cuda_sources(defn, family, dps)
    else:
        sources = _python_sources(defn, name, dps, language)
        sources = dict(zip(sources, format_python(list(sources.values()))))
    entry_file = _entry_file(sources, language)
    solution = Solution(
        name=name,
        definition=defn.name,
        author=author,
        description=f"Scaffold of a {language} solution for {defn.name}.",
        spec=BuildSpec(
            language=language,
            target_hardware=["cuda"] if language == "cuda" else ["cuda", "cpu"],
            entry_point=f"{entry_file}::{ENTRY_SYMBOL}",
            destination_passing_style=dps,
        ),
        sources=[SourceFile(path=p, content=sources[p]) for p in sorted(sources)],
    )
    folder = Path(output) / author / defn.op_type / defn.name / name
    _write_folder(folder, {f"{name}.json": dump_solution(solution), **sources}, force)
    return Scaffold(folder, folder / f"{name}.json", tuple(sorted(sources)))


def _write_folder(folder: Path, files: dict[str, str], force: bool) -> None:
    if folder.exists() and not force:
        raise ScaffoldError(f"{folder} already exists; pass --force to replace it")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed into place: a failure never leaves a half-written folder.
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    except OSError as exc:
        raise ScaffoldError(f"cannot create {folder}: {exc.strerror}") from None
    old = None
    try:
        for rel, text in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        if folder.exists():
            old = folder.with_name(f".{folder.name}-replaced")
            shutil.rmtree(old, ignore_errors=True)
            folder.rename(old)
        tmp.rename(folder)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not folder.exists():
            old.rename(folder)
        raise ScaffoldError(f"cannot write {folder}: {exc.strerror or exc}") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
