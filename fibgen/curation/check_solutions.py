"""Checks of solutions: unique names, known definitions, sources and entry points, the tools
they need, and (with ``load``) that each imports or builds."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

from fibgen.curation.findings import Report, Row, report_caught
from fibgen.format import FormatError, Solution
from fibgen.format.dataset import dataset_files, is_solution_folder, read_solution
from fibgen.format.jsonio import load_solution
from fibgen.format.models import Definition

# As fibgen.runtime.solutions.loading says it; not imported from there, which would import torch.
TRITON_INSTALL = "pip install 'fibgen[triton]'"

_EXPORT = re.compile(
    r"TVM_FFI_DLL_EXPORT_TYPED_FUNC\s*\(\s*(\w+)|\bm\.def\s*\(\s*\"(\w+)\"|\.def\s*\(\s*\"(\w+)\""
)


def check_solution_entries(
    report: Report,
    definitions: dict[str, tuple[Path, Definition]],
    load: bool,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Solution]:
    """Check every solution (with ``load``, import or build it, said first to ``progress``)."""
    by_name: dict[str, tuple[Path, Solution]] = {}
    for path in dataset_files(report.root, "solutions"):
        report.files["solutions"] += 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                stored = load_solution(path)
            except FormatError as exc:
                report.add("error", exc.path, exc.message)
                continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the same file's warnings, caught above
            try:
                solution = read_solution(path)
            except FormatError as exc:
                report.add("error", exc.path, exc.message, stored.definition)
                continue
        name = solution.definition
        report_caught(report, caught, name)
        report.records["solutions"] += 1
        if solution.name in by_name:
            report.add(
                "error",
                path,
                f"solution name {solution.name!r} is also used by {by_name[solution.name][0]} "
                "(flashinfer-bench refuses the dataset)",
                name,
            )
            continue
        by_name[solution.name] = (path, solution)
        report.rows.setdefault(name, Row()).solutions += 1
        if name not in definitions:
            report.add(
                "error",
                path,
                f"solution {solution.name!r} is for definition {name!r}, which the dataset "
                "does not have",
                name,
            )
        if is_solution_folder(path, stored) and stored != solution:
            report.add(
                "warning",
                path,
                "the folder's files differ from the JSON's sources: bench, tests and apply run "
                f"the files; `fibgen pack {path.parent}` writes them into the JSON",
                name,
            )
        problems = _solution_problems(solution)
        for problem in problems:
            report.add("error", path, problem, name)
        why = _not_loadable_here(solution) if load and name in definitions else None
        if load and name in definitions and why is None and not problems:
            # Loading says whatever a missing tool makes of it, once, as an error.
            load_problem = _load(path, solution, definitions[name][1], progress)
            if load_problem:
                report.add("error", path, load_problem, name)
            continue
        for note in _tool_problems(solution):
            report.add("warning", path, note, name)
        if why is not None:
            # Not a fault of the dataset: bench says "not run" for the same solution.
            report.add("warning", path, why, name)
    return {n: s for n, (_, s) in by_name.items()}


def _solution_problems(solution: Solution) -> list[str]:
    spec = solution.spec
    sources = {s.path: s.content for s in solution.sources}
    entry = sources[spec.entry_file]
    symbol = spec.entry_symbol
    problems = []
    if spec.language in ("python", "triton"):
        if not spec.entry_file.endswith(".py"):
            return [f"entry file {spec.entry_file!r} of a {spec.language} solution is not .py"]
        for path, text in sources.items():
            if not path.endswith(".py"):
                continue
            try:
                tree = ast.parse(text)
            except SyntaxError as exc:
                problems.append(f"{path}:{exc.lineno}: not valid Python: {exc.msg}")
                continue
            if path == spec.entry_file and not _defines(tree, symbol):
                problems.append(f"{path} defines no top-level {symbol!r} (the entry point)")
    elif spec.language in ("cpp", "cuda"):
        exported = {g for m in _EXPORT.finditer("\n".join(sources.values())) for g in m.groups()}
        if symbol not in exported:
            how = "PYBIND11 m.def" if spec.binding == "torch" else "TVM_FFI_DLL_EXPORT_TYPED_FUNC"
            problems.append(f"no source exports {symbol!r} (the entry point) with {how}")
        if not entry:
            problems.append(f"entry file {spec.entry_file!r} is empty")
    else:
        problems.append(
            f"language {spec.language!r} is not run by fibgen (python, triton, cpp, cuda)"
        )
    return problems


def _defines(tree: ast.Module, symbol: str) -> bool:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == symbol:
                return True
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == symbol for t in node.targets):
                return True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == symbol for a in node.names):
                return True
    return False


def _tool_problems(solution: Solution) -> list[str]:
    spec = solution.spec
    notes = []
    if spec.language in ("cpp", "cuda") and spec.binding != "torch":
        if importlib.util.find_spec("tvm_ffi") is None:
            notes.append(
                'the tvm-ffi binding (spec.binding null or "tvm-ffi") needs apache-tvm-ffi, '
                "which is not installed: pip install apache-tvm-ffi"
            )
    if spec.language == "cuda" and shutil.which("nvcc") is None:
        notes.append("a cuda solution needs nvcc, which is not on PATH here")
    if spec.language == "triton" and not _installed("triton"):
        notes.append(f"a triton solution needs Triton, which is not installed: {TRITON_INSTALL}")
    return notes


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _not_loadable_here(solution: Solution) -> str | None:
    """Why ``--load`` cannot judge a solution on this machine, or None when it can.

    A CUDA solution is compiled for the GPU it is to run on; without one visible, the tvm-ffi
    build cannot pick the architecture and fails, which says nothing about the solution.
    Given the architecture (and nvcc), it is compiled here as a check.
    """
    if solution.spec.language != "cuda":
        return None
    import torch

    if torch.cuda.is_available():
        return None
    arch = "TORCH_CUDA_ARCH_LIST" if solution.spec.binding == "torch" else "TVM_FFI_CUDA_ARCH_LIST"
    if os.environ.get(arch) and shutil.which("nvcc") is not None:
        return None
    return (
        "not loaded: a cuda solution is built for the GPU it runs on, and no GPU is visible "
        f"here; run `fibgen validate --load` on a machine with one, or set {arch} (e.g. "
        '"9.0" for an H100) with nvcc on PATH to compile-check it here'
    )


def _load(
    path: Path,
    solution: Solution,
    definition: Definition,
    progress: Callable[[str], None] | None,
) -> str | None:
    """Import or build a solution as bench and apply do; why it failed, or None."""
    from fibgen.runtime.errors import SolutionError
    from fibgen.runtime.solutions import loading as solutions

    language = solution.spec.language
    if progress is not None:
        verb = "building" if language in solutions.BUILT_LANGUAGES else "importing"
        note = " (a first build takes a while; builds are cached)" if verb == "building" else ""
        progress(f"validate: {verb} {language} solution {solution.name!r} ({path}){note}")
    entry = solutions.Entry(
        definition.name,
        f"solution {solution.name!r}",
        solution=solution,
        origin=solutions.Origin.of(path, solution),
    )
    with warnings.catch_warnings(record=progress is not None) as caught:
        if progress is not None:
            warnings.simplefilter("always")
        try:
            solutions.load(entry, tuple(definition.inputs), tuple(definition.outputs))
        except SolutionError as exc:
            return str(exc)
        finally:
            # What the load said (Triton's interpreter turned on, a solution's own warning)
            # goes where the progress goes: the report is about the dataset.
            for w in caught or ():  # recorded only with a progress
                if progress is not None:
                    progress(f"validate: {str(w.message).removeprefix('fibgen: ')}")
    return None
