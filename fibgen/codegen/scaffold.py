"""Solution scaffolds: a new solution folder for one definition, ready to fill in.

The folder is ``<output>/<author>/<op_type>/<definition>/<name>/``: a Solution JSON
(flashinfer-bench's schema, every source listed) and the sources, whose entry function has
the definition's exact signature. The python and triton scaffolds hold a correct body (the
reference's math, or a real triton kernel for the families in ``_TRITON_KERNELS``), so a
fresh scaffold passes its generated test; the cuda scaffold comes from the CUDA target.
`fibgen scaffold-solution` (fibgen/cli/scaffold.py) is the command over it.
"""

from __future__ import annotations

import ast
import difflib
import getpass
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # the CLI imports this module to list languages; the IR loads on use
    from fibgen.compiler import ir
    from fibgen.format.models.base import Binding, Language

LANGUAGES = ("python", "triton", "cuda")
ENTRY_SYMBOL = "run"
_ENTRY_FILES = {"python": "main.py", "triton": "main.py"}


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


class DiagnosticsError(ScaffoldError):
    """The definitions do not compile; the message is the rendered diagnostics, which say
    ``error:`` themselves."""


def _compile(definitions: str | Path | ir.Module | None) -> tuple[ir.Module, str]:
    """The module of ``definitions`` and how to name where it came from."""
    from fibgen.compiler import compile_paths, discover, ir
    from fibgen.compiler.diagnostics import has_errors, render_all
    from fibgen.paths import definitions_dir

    if isinstance(definitions, ir.Module):
        return definitions, "the given definitions"
    where = f"{definitions}"
    if definitions is None:
        definitions, where = definitions_dir(), "fibgen's built-in catalogue"
    elif not Path(definitions).exists():
        raise ScaffoldError(f"definitions folder {definitions} does not exist")
    elif not discover([str(definitions)])[0]:
        raise ScaffoldError(f"no .fidef files in {definitions}")
    result = compile_paths([str(definitions)])
    if result.module is None or has_errors(result.diagnostics):
        raise DiagnosticsError(render_all(result.diagnostics, result.sources).rstrip())
    return result.module, where


def find_definition(
    module: ir.Module, name: str, where: str = "the definitions"
) -> tuple[ir.Definition, ir.Family]:
    """The definition called ``name`` and its family; an error names the closest names."""
    by_name = {d.name: d for d in module.definitions}
    defn = by_name.get(name)
    if defn is None:
        close = difflib.get_close_matches(name, sorted(by_name), n=3)
        hint = f"\n  = help: did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""
        raise ScaffoldError(f"no definition named `{name}` in {where}{hint}")
    family = next(f for f in module.families() if f.name == defn.family)
    return defn, family


def _reference_as(reference: str, new_name: str) -> str:
    """The reference with its top-level ``run`` renamed, so the entry can be called ``run``."""
    tree = ast.parse(reference)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == ENTRY_SYMBOL)
    lines = reference.splitlines()
    lines[node.lineno - 1] = lines[node.lineno - 1].replace(
        f"def {ENTRY_SYMBOL}(", f"def {new_name}(", 1
    )
    return "\n".join(lines).strip() + "\n"


def _tensor_doc(t: ir.DefTensor) -> str:
    shape = " scalar" if t.shape is None else f"[{', '.join(t.shape)}]"
    return f"{t.name}: {t.dtype}{shape}"


def _eps(reference: str | None) -> float:
    # Row-wise norms spell their epsilon as a module constant `EPS = ...` in the reference.
    for node in ast.parse(reference or "").body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["EPS"]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, (int, float))
        ):
            return float(node.value.value)
    return 1e-6


def _reference_call(defn: ir.Definition, dps: bool) -> list[str]:
    """Entry body lines that compute the outputs with the reference's math."""
    call = f"_reference({', '.join(t.name for t in defn.inputs)})"
    if not dps:
        return [f"return {call}"]
    outputs = [t.name for t in defn.outputs]
    lines = [f"{', '.join(f'_{o}' for o in outputs)} = {call}"]
    lines += [f"{t.name}.copy_(_{t.name})" for t in defn.outputs if t.shape is not None]
    return lines


def _rmsnorm_call(defn: ir.Definition, dps: bool) -> list[str]:
    """Entry body lines that launch the row-wise RMS norm kernel."""
    x, w = (t.name for t in defn.inputs)
    out = defn.outputs[0].name
    lines = [f"{x} = {x}.contiguous()"]
    lines += [] if dps else [f"{out} = torch.empty_like({x})"]
    lines += [
        f"rows = {x}.numel() // {x}.shape[-1]",
        "_rmsnorm_kernel[(rows,)](",
        f"    {x}, {w}, {out}, {x}.shape[-1], EPS, BLOCK=triton.next_power_of_2({x}.shape[-1])",
        ")",
    ]
    return lines if dps else [*lines, f"return {out}"]


def _doc_lines(defn: ir.Definition) -> list[str]:
    lines = ["Inputs:", *(f"    {_tensor_doc(t)}" for t in defn.inputs)]
    lines += ["Outputs:", *(f"    {_tensor_doc(t)}" for t in defn.outputs)]
    if defn.constraints:
        lines += ["Constraints:", *(f"    {c}" for c in defn.constraints)]
    return lines


# Families that get a real triton kernel: template and entry body. Others get a triton file
# whose entry runs the reference's math in torch, marked as the place to write the kernel.
_TRITON_KERNELS = {"rmsnorm": ("scaffold_triton_rmsnorm.py.j2", _rmsnorm_call)}


def _context(defn: ir.Definition, name: str, dps: bool) -> dict[str, object]:
    from fibgen.codegen.python.pyliteral import docstring_text

    inputs = [t.name for t in defn.inputs]
    outputs = [t.name for t in defn.outputs]
    # The module docstring quotes the definition's text (constraints): escaped, it stays text.
    return {
        "name": docstring_text(name),
        "definition": docstring_text(defn.name),
        "params": ", ".join(inputs + outputs if dps else inputs),
        "doc": [docstring_text(line) for line in _doc_lines(defn)],
        "style": "writes into the output buffers" if dps else "returns the outputs",
    }


def _python_sources(defn: ir.Definition, name: str, dps: bool, language: str) -> dict[str, str]:
    from fibgen.codegen.templates import render

    if defn.reference is None:
        raise ScaffoldError(
            f"{defn.name} has no reference yet: a {language} scaffold starts from the "
            "reference's math; write the reference in the .fidef first"
        )
    context = _context(defn, name, dps)
    template = {"python": "scaffold_python.py.j2", "triton": "scaffold_triton_torch.py.j2"}
    context["body"] = _reference_call(defn, dps)
    context["reference"] = _reference_as(defn.reference, "_reference")
    if language == "triton" and defn.family in _TRITON_KERNELS:
        template[language], body = _TRITON_KERNELS[defn.family]
        context["body"] = body(defn, dps)
        context["eps"] = repr(_eps(defn.reference))
    return {_ENTRY_FILES[language]: render(template[language], **context)}


def _cuda_sources(defn: ir.Definition, family: ir.Family, dps: bool) -> tuple[dict, str, Binding]:
    """The CUDA target's scaffold: (sources, entry file, binding)."""
    try:
        from fibgen.codegen.cuda.emit import BINDING, ENTRY_FILE, CudaGenError, scaffold_sources
    except ImportError:
        raise ScaffoldError(
            "--language cuda is not available in this fibgen: the CUDA target has no "
            "scaffold_sources yet; use --language python or triton"
        ) from None
    try:
        sources = scaffold_sources(defn, family, entry=ENTRY_SYMBOL, dps=dps)
    except CudaGenError as exc:
        raise ScaffoldError(f"cannot scaffold a cuda solution for {defn.name}: {exc}") from None
    return sources, ENTRY_FILE, BINDING


def scaffold_solution(
    definition: str,
    *,
    language: str,
    author: str | None = None,
    name: str | None = None,
    dps: bool = True,
    output: str | Path = "solutions",
    definitions: str | Path | ir.Module | None = None,
    force: bool = False,
) -> Scaffold:
    """Write a solution folder for ``definition``; nothing is written when anything fails.

    ``definitions``: `.fidef` files or folders, or a compiled module; None is fibgen's
    built-in catalogue.
    """
    from fibgen.codegen.python.pyformat import format_python
    from fibgen.format.jsonio import dump_solution
    from fibgen.format.models import BuildSpec, Solution, SourceFile

    if language not in LANGUAGES:
        raise ScaffoldError(f"unknown language {language!r}; choose one of {', '.join(LANGUAGES)}")
    from fibgen.format.models import NAME_RULE, name_problem

    flags = {"definition": "DEFINITION", "author": "--author", "name": "--name"}
    if author is None:
        author, flags["author"] = default_author(), "the login name (pass --author)"
    name = name or f"{language}_{definition}"
    # Each becomes a folder name (Note [safe names] in fibgen/format/models/names.py).
    for what, value in (("definition", definition), ("author", author), ("name", name)):
        problem = name_problem(value)
        if problem is not None:
            raise ScaffoldError(f"{flags[what]} {value!r} {problem}; {NAME_RULE}")
    module, where = _compile(definitions)
    defn, family = find_definition(module, definition, where)

    binding: Binding | None = None
    if language == "cuda":
        sources, entry_file, binding = _cuda_sources(defn, family, dps)
    else:
        sources = _python_sources(defn, name, dps, language)
        sources = dict(zip(sources, format_python(list(sources.values()))))
        entry_file = _ENTRY_FILES[language]
    solution = Solution(
        name=name,
        definition=defn.name,
        author=author,
        description=f"Scaffold of a {language} solution for {defn.name}.",
        spec=BuildSpec(
            language=cast("Language", language),  # one of LANGUAGES, checked above
            target_hardware=["cuda"] if language == "cuda" else ["cuda", "cpu"],
            entry_point=f"{entry_file}::{ENTRY_SYMBOL}",
            destination_passing_style=dps,
            binding=binding,
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
