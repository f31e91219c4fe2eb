"""`fibgen validate DATASET`: check a whole FlashInfer Trace dataset before anything runs on it.

Every file is read, and every problem is collected rather than the first one raised:

- schemas: each definition, solution, workload line and trace line against the format's
  models (unknown keys are warnings, as flashinfer-bench ignores them), and each sidecar;
- layout: files that no reader takes (a ``.json`` under workloads/, anything beside the
  four folders and blob/), duplicate definition and solution names (flashinfer-bench
  refuses a dataset that has them), workload lines in traces/ and results in workloads/;
- references: solutions, workloads and traces of definitions the dataset does not have,
  traces of solutions it does not have, workloads whose axes or inputs do not fit their
  definition;
- blobs: every safetensors input's file and tensor, with the shape and dtype its
  definition gives;
- solutions: a language fibgen runs, an entry that exists (Python sources parse and define
  it; C++/CUDA sources export it), a binding whose tools are installed, a solution folder
  whose JSON holds its files; with ``load``, each is imported or built.

The result is plain data (``Report``); ``render`` prints the per-definition table and the
problems. This module imports torch only to read blob headers and, with ``load``, to load.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fibgen.format import FormatError, Solution
from fibgen.format.dataset import (
    DATASET_FOLDERS,
    EXTRAS_SUFFIX,
    dataset_files,
    is_solution_folder,
    read_extras,
    read_solution,
    resolve_dataset_path,
)
from fibgen.format.jsonio import load_definition, load_solution, parse_trace_line, read_text
from fibgen.format.models import Definition, Trace, workload_problems

# What a dataset root may hold besides its four folders.
_OTHER_FOLDERS = ("blob",)


@dataclass
class Problem:
    """One finding: ``error`` (a reader fails or a run would) or ``warning``."""

    level: str
    where: str
    message: str
    definition: str | None = None

    def __str__(self) -> str:
        return f"{self.level}: {self.where}: {self.message}"


@dataclass
class Row:
    """Per definition: what the dataset holds for it."""

    solutions: int = 0
    workloads: int = 0
    traces: int = 0
    passed: int = 0
    errors: int = 0
    warnings: int = 0


@dataclass
class Report:
    """Counts per folder, a row per definition, and every problem found."""

    root: Path
    files: Counter = field(default_factory=Counter)
    records: Counter = field(default_factory=Counter)
    rows: dict[str, Row] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        """The problems that are errors."""
        return [p for p in self.problems if p.level == "error"]

    @property
    def warnings(self) -> list[Problem]:
        """The problems that are warnings."""
        return [p for p in self.problems if p.level == "warning"]

    def add(self, level: str, where: Any, message: str, definition: str | None = None) -> None:
        """Record a problem, counted in its definition's row."""
        self.problems.append(Problem(level, str(where), message, definition))
        if definition is not None:
            row = self.rows.setdefault(definition, Row())
            if level == "error":
                row.errors += 1
            else:
                row.warnings += 1


def _caught(report: Report, caught: list, definition: str | None = None) -> None:
    for w in caught:
        report.add("warning", getattr(w.message, "path", "?"), _warning_text(w), definition)


def _warning_text(w: Any) -> str:
    message = w.message
    line = getattr(message, "line", None)
    text = getattr(message, "message", str(message))
    return f"line {line}: {text}" if line is not None else text


def validate_dataset(root: str | Path, *, load: bool = False) -> Report:
    """Check every file of the dataset at ``root`` (see the module's docstring)."""
    root = Path(root)
    report = Report(root)
    if not root.is_dir():
        report.add("error", root, "no such dataset folder")
        return report
    present = [name for name in DATASET_FOLDERS if (root / name).is_dir()]
    if not present:
        report.add(
            "error",
            root,
            "not a dataset: it has none of definitions/, solutions/, workloads/, traces/",
        )
        return report
    _layout(report)
    definitions = _definitions(report)
    solutions = _solutions(report, definitions, load)
    blobs = _workloads(report, definitions)
    _traces(report, definitions, solutions)
    _unused_blobs(report, blobs)
    return report


# ---------------------------------------------------------------------------------------
# Layout


def _layout(report: Report) -> None:
    root = report.root
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir() and entry.name in (*DATASET_FOLDERS, *_OTHER_FOLDERS):
            continue
        if entry.is_file() and entry.suffix not in (".json", ".jsonl", ".safetensors"):
            continue  # a README, a LICENSE: not data
        report.add(
            "warning",
            entry,
            "not part of the dataset layout (definitions/, solutions/, workloads/, traces/, "
            "blob/); no reader takes it",
        )
    for top, suffix in DATASET_FOLDERS.items():
        base = root / top
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(base).parts
            if any(part.startswith(".") or part == "__pycache__" for part in rel):
                continue
            if not path.is_file() or path.name.endswith(suffix):
                continue
            if top == "definitions" and path.suffix == EXTRAS_SUFFIX:
                continue
            if top == "solutions" and _in_solution_folder(path):
                continue
            report.add(
                "warning",
                path,
                f"ignored: the readers of {top}/ take {suffix} files only",
            )


def _in_solution_folder(path: Path) -> bool:
    for folder in path.parents:
        candidate = folder / f"{folder.name}.json"
        if candidate.is_file():
            return True
        if folder.name == "solutions":
            return False
    return False


# ---------------------------------------------------------------------------------------
# Definitions


def _definitions(report: Report) -> dict[str, tuple[Path, Definition]]:
    found: dict[str, tuple[Path, Definition]] = {}
    for path in dataset_files(report.root, "definitions"):
        report.files["definitions"] += 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                defn = load_definition(path)
            except FormatError as exc:
                report.add("error", path, exc.message)
                continue
        _caught(report, caught)
        report.records["definitions"] += 1
        report.rows.setdefault(defn.name, Row())
        if defn.name in found:
            report.add(
                "error",
                path,
                f"definition name {defn.name!r} is also used by {found[defn.name][0]} "
                "(flashinfer-bench refuses the dataset)",
                defn.name,
            )
            continue
        found[defn.name] = (path, defn)
        try:
            extras = read_extras(path)
        except FormatError as exc:
            report.add("error", exc.path, exc.message, defn.name)
            continue
        for name in extras.get("hints") or {}:
            if name not in defn.inputs:
                report.add(
                    "warning",
                    path.with_suffix(EXTRAS_SUFFIX),
                    f"a hint for {name!r}, which is not an input of {defn.name}",
                    defn.name,
                )
    for path in sorted((report.root / "definitions").rglob(f"*{EXTRAS_SUFFIX}")):
        if not path.with_suffix(".json").is_file():
            report.add("warning", path, "a sidecar with no definition JSON beside it")
    return found


# ---------------------------------------------------------------------------------------
# Solutions

_EXPORT = re.compile(
    r"TVM_FFI_DLL_EXPORT_TYPED_FUNC\s*\(\s*(\w+)|\bm\.def\s*\(\s*\"(\w+)\"|\.def\s*\(\s*\"(\w+)\""
)


def _solutions(
    report: Report, definitions: dict[str, tuple[Path, Definition]], load: bool
) -> dict[str, Solution]:
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
        _caught(report, caught, name)
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
        for problem in _solution_problems(solution):
            report.add("error", path, problem, name)
        for note in _tool_problems(solution):
            report.add("warning", path, note, name)
        if load and name in definitions:
            why = _not_loadable_here(solution)
            if why is not None:
                # Not a fault of the dataset: bench says "not run" for the same solution.
                report.add("warning", path, why, name)
                continue
            problem = _load(solution, definitions[name][1])
            if problem:
                report.add("error", path, problem, name)
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
    if spec.language == "triton" and importlib.util.find_spec("triton") is None:
        notes.append("a triton solution needs triton, which is not installed")
    return notes


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


def _load(solution: Solution, definition: Definition) -> str | None:
    from fibgen.runtime import solutions
    from fibgen.runtime.errors import SolutionError

    entry = solutions.Entry(definition.name, f"solution {solution.name!r}", solution=solution)
    try:
        solutions.load(entry, tuple(definition.inputs), tuple(definition.outputs))
    except SolutionError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------------------------------
# Workloads and blobs


def _lines(report: Report, path: Path, kind: str) -> list[tuple[int, Trace]]:
    out = []
    try:
        text = read_text(path)
    except FormatError as exc:
        report.add("error", path, exc.message)
        return out
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                trace = parse_trace_line(line, path, lineno)
            except FormatError as exc:
                report.add("error", f"{path}:{lineno}", exc.message)
                continue
        _caught(report, caught, trace.definition)
        report.records[kind] += 1
        out.append((lineno, trace))
    return out


def _workloads(report: Report, definitions: dict[str, tuple[Path, Definition]]) -> set[Path]:
    blobs: set[Path] = set()
    seen: set[tuple[str, str]] = set()
    headers: dict[Path, Any] = {}
    # definition -> (inputs whose blob is absent, workloads they are in, the first one)
    absent: dict[str, list] = {}
    for path in dataset_files(report.root, "workloads"):
        report.files["workloads"] += 1
        for lineno, trace in _lines(report, path, "workloads"):
            where = f"{path}:{lineno}"
            name = trace.definition
            if not trace.is_workload_trace:
                report.add(
                    "error",
                    where,
                    "an evaluated trace in workloads/ (flashinfer-bench refuses it): results "
                    "go under traces/",
                    name,
                )
                continue
            report.rows.setdefault(name, Row()).workloads += 1
            workload = trace.workload
            if (name, workload.uuid) in seen:
                report.add("warning", where, f"workload uuid {workload.uuid} repeats", name)
            seen.add((name, workload.uuid))
            found = definitions.get(name)
            if found is None:
                report.add(
                    "error", where, f"a workload of {name!r}, which the dataset does not have", name
                )
                continue
            defn = found[1]
            for problem in workload_problems(defn, workload):
                report.add("error", where, problem, name)
            for input_name, spec in workload.inputs.items():
                if spec.type != "safetensors":
                    continue
                problem = _blob_problem(report.root, spec, defn, workload, input_name, headers)
                try:
                    blobs.add(resolve_dataset_path(report.root, spec.path).resolve())
                except ValueError:
                    pass
                if problem == _ABSENT:
                    entry = absent.setdefault(name, [0, set(), f"{where}: {spec.path}"])
                    entry[0] += 1
                    entry[1].add(workload.uuid)
                elif problem:
                    report.add("error", where, f"input {input_name!r}: {problem}", name)
    for name, (inputs, uuids, first) in sorted(absent.items()):
        report.add(
            "error",
            first,
            f"{inputs} safetensors input(s) of {len(uuids)} workload(s) of {name} refer to "
            "blob files that are not in the dataset (the first is shown; copy the dataset's "
            "blob/ folder in)",
            name,
        )
    report.files["blobs"] = len(blobs)
    return blobs


_ABSENT = "absent"


def _blob_problem(
    root: Path,
    spec: Any,
    defn: Definition,
    workload: Any,
    input_name: str,
    headers: dict[Path, Any],
) -> str | None:
    try:
        path = resolve_dataset_path(root, spec.path)
    except ValueError as exc:
        return str(exc)
    if not path.is_file():
        return _ABSENT
    header = headers.get(path)
    if header is None:
        header = headers[path] = _header(path)
    if isinstance(header, str):
        return f"its blob {spec.path} is not a readable safetensors file: {header}"
    if spec.tensor_key not in header:
        return f"no tensor {spec.tensor_key!r} in {spec.path} (it has: {', '.join(sorted(header))})"
    dtype, shape = header[spec.tensor_key]
    tensor = defn.inputs.get(input_name)
    if tensor is None or tensor.shape is None:
        return None
    sizes = {**defn.const_axes, **workload.axes}
    if all(a in sizes for a in tensor.shape) and tensor.dtype != "float4_e2m1":
        expected = [sizes[a] for a in tensor.shape]
        if list(shape) != expected:
            return f"the stored tensor has shape {list(shape)}, the workload's axes give {expected}"
    names = {
        "float32": "F32",
        "float16": "F16",
        "bfloat16": "BF16",
        "float8_e4m3fn": "F8_E4M3",
        "float8_e5m2": "F8_E5M2",
        "int64": "I64",
        "int32": "I32",
        "int16": "I16",
        "int8": "I8",
        "bool": "BOOL",
    }
    if tensor.dtype in names and dtype != names[tensor.dtype]:
        return f"the stored tensor is {dtype}, the definition declares {tensor.dtype}"
    return None


def _header(path: Path) -> dict[str, tuple[str, list[int]]] | str:
    # The JSON header of a safetensors file: 8 bytes of length, then the header itself.
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if size <= 0 or size > 100 << 20:
                return "bad header length"
            header = json.loads(f.read(size))
    except (OSError, ValueError) as exc:
        return str(exc)
    return {
        k: (v.get("dtype", "?"), list(v.get("shape", [])))
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict)
    }


def _unused_blobs(report: Report, used: set[Path]) -> None:
    base = report.root / "blob"
    if not base.is_dir():
        return
    unused = [
        p
        for p in sorted(base.rglob("*.safetensors"))
        if not p.name.startswith(".") and p.resolve() not in used
    ]
    if unused:
        shown = ", ".join(str(p.relative_to(report.root)) for p in unused[:3])
        more = f", ... ({len(unused) - 3} more)" if len(unused) > 3 else ""
        report.add(
            "warning", base, f"{len(unused)} blob file(s) no workload refers to: {shown}{more}"
        )


# ---------------------------------------------------------------------------------------
# Traces


def _traces(
    report: Report,
    definitions: dict[str, tuple[Path, Definition]],
    solutions: dict[str, Solution],
) -> None:
    for path in dataset_files(report.root, "traces"):
        report.files["traces"] += 1
        for lineno, trace in _lines(report, path, "traces"):
            where = f"{path}:{lineno}"
            name = trace.definition
            if trace.is_workload_trace:
                report.add(
                    "error",
                    where,
                    "a workload line in traces/ (flashinfer-bench refuses it): workloads go "
                    "under workloads/",
                    name,
                )
                continue
            row = report.rows.setdefault(name, Row())
            row.traces += 1
            if trace.evaluation is not None and trace.evaluation.status.value == "PASSED":
                row.passed += 1
            if name not in definitions:
                report.add(
                    "error", where, f"a trace of {name!r}, which the dataset does not have", name
                )
            if trace.solution is not None and trace.solution not in solutions:
                report.add(
                    "error",
                    where,
                    f"a trace of solution {trace.solution!r}, which is not under solutions/",
                    name,
                )
            elif trace.solution is not None and solutions[trace.solution].definition != name:
                report.add(
                    "error",
                    where,
                    f"solution {trace.solution!r} is for "
                    f"{solutions[trace.solution].definition!r}, not {name!r}",
                    name,
                )


# ---------------------------------------------------------------------------------------
# Printing


def render(report: Report, limit: int | None = 40) -> str:
    """The per-definition table, the problems (``limit`` of them), and the verdict."""
    lines = [f"dataset {report.root}"]
    counts = ", ".join(
        f"{report.records[k]} {k} in {report.files[k]} file(s)"
        for k in ("definitions", "solutions", "workloads", "traces")
    )
    lines.append(f"  {counts}; {report.files['blobs']} blob file(s) referred to")
    header = ["definition", "solutions", "workloads", "traces", "passed", "errors", "warnings"]
    rows = [
        [
            name,
            str(r.solutions),
            str(r.workloads),
            str(r.traces),
            str(r.passed),
            str(r.errors),
            str(r.warnings),
        ]
        for name, r in sorted(report.rows.items())
    ]
    if rows:
        widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]

        def line(cells: list[str]) -> str:
            first = cells[0].ljust(widths[0])
            rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
            return "  ".join([first, *rest]).rstrip()

        lines += ["", line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]
    problems = sorted(report.problems, key=lambda p: (p.level != "error", p.where))
    if problems:
        shown = problems if limit is None else problems[:limit]
        lines += ["", *(str(p) for p in shown)]
        if len(shown) < len(problems):
            lines.append(f"... and {len(problems) - len(shown)} more (--all shows every one)")
    errors, warned = len(report.errors), len(report.warnings)
    verdict = "FAILED" if errors else "ok"
    lines += ["", f"validate: {verdict}: {errors} error(s), {warned} warning(s)"]
    return "\n".join(lines) + "\n"
