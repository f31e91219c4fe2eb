"""The on-disk layout of a FlashInfer Trace dataset: paths, loaders and atomic writers.

::

    <root>/definitions/<op_type>/<definition>.json
    <root>/solutions/<author>/<op_type>/<definition>/<solution>.json
    <root>/workloads/<op_type>/<definition>.jsonl
    <root>/traces/<author>/<op_type>/<definition>.jsonl
    <root>/blob/workloads/<op_type>/<definition>/<definition>_<uuid>.safetensors

Loaders walk the tree in sorted order so results do not depend on the file system, and they
check that each file sits where its content says it belongs. Writers replace files
atomically (a temporary file in the same directory, then ``os.replace``), so a reader never
sees half a file. torch and safetensors are imported only by the blob functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Union

from fibgen.format.errors import FormatError
from fibgen.fsutil import replace_atomically
from fibgen.format.jsonio import (
    dump_definition,
    dump_solution,
    dump_trace_line,
    load_definition,
    load_solution,
    parse_trace_line,
    read_text,
)
from fibgen.format.models import Definition, SafetensorsInput, Solution, Trace, Workload

if TYPE_CHECKING:
    import torch

PathLike = Union[str, Path]

# ---------------------------------------------------------------------------------------
# Paths


def _component(kind: str, value: str) -> str:
    # Names become path components; a name with a separator would write outside the layout.
    if (
        not value
        or value in (".", "..")
        or "/" in value
        or "\\" in value
        or "\0" in value
        or value != value.strip()
    ):
        raise ValueError(f"{kind} {value!r} cannot be used as a file or directory name")
    return value


def definition_path(root: PathLike, op_type: str, name: str) -> Path:
    """``<root>/definitions/<op_type>/<name>.json``."""
    return (
        Path(root)
        / "definitions"
        / _component("op_type", op_type)
        / f"{_component('definition name', name)}.json"
    )


def solution_path(
    root: PathLike, author: str, op_type: str, definition: str, solution: str
) -> Path:
    """``<root>/solutions/<author>/<op_type>/<definition>/<solution>.json``."""
    return (
        Path(root)
        / "solutions"
        / _component("author", author)
        / _component("op_type", op_type)
        / _component("definition name", definition)
        / f"{_component('solution name', solution)}.json"
    )


def workload_path(root: PathLike, op_type: str, definition: str) -> Path:
    """``<root>/workloads/<op_type>/<definition>.jsonl``."""
    return (
        Path(root)
        / "workloads"
        / _component("op_type", op_type)
        / f"{_component('definition name', definition)}.jsonl"
    )


def trace_path(root: PathLike, author: str, op_type: str, definition: str) -> Path:
    """``<root>/traces/<author>/<op_type>/<definition>.jsonl``."""
    return (
        Path(root)
        / "traces"
        / _component("author", author)
        / _component("op_type", op_type)
        / f"{_component('definition name', definition)}.jsonl"
    )


def blob_relpath(op_type: str, definition: str, uuid: str) -> str:
    """``blob/workloads/<op_type>/<definition>/<definition>_<uuid>.safetensors`` (POSIX)."""
    op = _component("op_type", op_type)
    name = _component("definition name", definition)
    return f"blob/workloads/{op}/{name}/{name}_{_component('workload uuid', uuid)}.safetensors"


def blob_path(root: PathLike, op_type: str, definition: str, uuid: str) -> Path:
    """The absolute location of a workload's safetensors blob under ``root``."""
    return Path(root) / blob_relpath(op_type, definition, uuid)


def resolve_dataset_path(root: PathLike, relpath: str) -> Path:
    """Resolve a path stored in the dataset (relative to ``root``); refuse ones that escape."""
    parts = relpath.replace("\\", "/").split("/")
    if relpath.startswith(("/", "\\")) or ".." in parts or (len(relpath) > 1 and relpath[1] == ":"):
        raise ValueError(f"dataset path {relpath!r} must be relative to the dataset root")
    return Path(root).joinpath(*[p for p in parts if p not in ("", ".")])


# ---------------------------------------------------------------------------------------
# Loaders


def _files(root: PathLike, top: str, pattern: str) -> list[Path]:
    base = Path(root) / top
    if not base.is_dir():
        return []
    return sorted(p for p in base.glob(pattern) if p.is_file())


def load_definitions(root: PathLike) -> dict[str, Definition]:
    """All definitions under ``root/definitions``, by name, in sorted path order."""
    out: dict[str, Definition] = {}
    where: dict[str, Path] = {}
    for path in _files(root, "definitions", "*/*.json"):
        defn = load_definition(path)
        if path.stem != defn.name or path.parent.name != defn.op_type:
            expected = f"definitions/{defn.op_type}/{defn.name}.json"
            raise FormatError(
                path, f"definition {defn.name!r} (op_type {defn.op_type!r}) belongs in {expected}"
            )
        if defn.name in out:
            raise FormatError(
                path, f"definition name {defn.name!r} is also used by {where[defn.name]}"
            )
        out[defn.name] = defn
        where[defn.name] = path
    return out


def load_workloads(root: PathLike) -> dict[str, list[Workload]]:
    """All workloads under ``root/workloads``, by definition name, in file order."""
    out: dict[str, list[Workload]] = {}
    for path in _files(root, "workloads", "*/*.jsonl"):
        workloads = []
        for lineno, trace in _numbered(path):
            if not trace.is_workload_trace:
                raise FormatError(
                    path,
                    "a workload file holds only workload lines "
                    '("solution": null, "evaluation": null); put results under traces/',
                    lineno,
                )
            if trace.definition != path.stem:
                raise FormatError(
                    path,
                    f"line is for definition {trace.definition!r}, but the file is for "
                    f"{path.stem!r}",
                    lineno,
                )
            workloads.append(trace.workload)
        if path.stem in out:
            raise FormatError(path, f"a second workload file for definition {path.stem!r}")
        out[path.stem] = workloads
    return out


def load_solutions(root: PathLike) -> list[Solution]:
    """All solutions under ``root/solutions``, in sorted path order."""
    out = []
    for path in _files(root, "solutions", "*/*/*/*.json"):
        solution = load_solution(path)
        author_dir = path.parent.parent.parent.name
        if (
            path.stem != solution.name
            or path.parent.name != solution.definition
            or author_dir != solution.author
        ):
            expected = (
                f"solutions/{solution.author}/<op_type>/{solution.definition}/{solution.name}.json"
            )
            raise FormatError(path, f"solution {solution.name!r} belongs in {expected}")
        out.append(solution)
    return out


def load_traces(root: PathLike) -> list[Trace]:
    """All traces under ``root/traces``, in sorted path order, then line order."""
    out = []
    for path in _files(root, "traces", "*/*/*.jsonl"):
        for lineno, trace in _numbered(path):
            if trace.definition != path.stem:
                raise FormatError(
                    path,
                    f"trace is for definition {trace.definition!r}, but the file is for "
                    f"{path.stem!r}",
                    lineno,
                )
            out.append(trace)
    return out


def _numbered(path: Path) -> list[tuple[int, Trace]]:
    # Keep each trace's line number: checks made after parsing still point at the line.
    return [
        (lineno, parse_trace_line(line, path, lineno))
        for lineno, line in enumerate(read_text(path).splitlines(), start=1)
        if line.strip()
    ]


# ---------------------------------------------------------------------------------------
# Writers


def write_bytes_atomic(path: PathLike, data: bytes) -> bool:
    """Write ``data`` to ``path`` atomically; return False when it already held exactly that."""
    path = Path(path)
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    replace_atomically(path, data, durable=True)
    return True


def write_text_atomic(path: PathLike, text: str) -> bool:
    """Write UTF-8 ``text`` to ``path`` atomically; return False when unchanged."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def append_lines_atomic(path: PathLike, lines: Iterable[str]) -> None:
    """Append lines (without newlines) to a JSONL file by atomically replacing it."""
    from filelock import FileLock

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = "".join(line + "\n" for line in lines).encode("utf-8")
    if not new:
        return
    # Read-modify-replace loses lines when two writers race; the lock serializes them.
    with FileLock(str(path.with_name(f".{path.name}.lock"))):
        try:
            old = path.read_bytes()
        except FileNotFoundError:
            old = b""
        if old and not old.endswith(b"\n"):
            old += b"\n"
        write_bytes_atomic(path, old + new)


def write_definition(root: PathLike, defn: Definition) -> Path:
    """Write a definition to its place in the layout; return its path."""
    path = definition_path(root, defn.op_type, defn.name)
    write_text_atomic(path, dump_definition(defn))
    return path


def write_solution(root: PathLike, solution: Solution, op_type: str) -> Path:
    """Write a solution to its place in the layout (the op_type of its definition)."""
    path = solution_path(root, solution.author, op_type, solution.definition, solution.name)
    write_text_atomic(path, dump_solution(solution))
    return path


def write_workloads(
    root: PathLike, op_type: str, definition: str, workloads: Iterable[Workload]
) -> Path:
    """Replace a definition's workload file with these workloads."""
    path = workload_path(root, op_type, definition)
    text = "".join(
        dump_trace_line(Trace(definition=definition, workload=w)) + "\n" for w in workloads
    )
    write_text_atomic(path, text)
    return path


def append_workloads(
    root: PathLike, op_type: str, definition: str, workloads: Iterable[Workload]
) -> Path:
    """Append workloads to a definition's workload file."""
    path = workload_path(root, op_type, definition)
    append_lines_atomic(
        path, (dump_trace_line(Trace(definition=definition, workload=w)) for w in workloads)
    )
    return path


def append_traces(root: PathLike, author: str, op_type: str, traces: Iterable[Trace]) -> list[Path]:
    """Append traces to ``traces/<author>/<op_type>/<definition>.jsonl``, one file per definition."""
    by_definition: dict[str, list[str]] = {}
    for trace in traces:
        by_definition.setdefault(trace.definition, []).append(dump_trace_line(trace))
    paths = []
    for definition, lines in by_definition.items():
        path = trace_path(root, author, op_type, definition)
        append_lines_atomic(path, lines)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------
# Safetensors blobs


def save_blob(
    root: PathLike,
    op_type: str,
    definition: str,
    uuid: str,
    tensors: Mapping[str, torch.Tensor],
) -> str:
    """Store a workload's tensors; return the relative path for ``SafetensorsInput.path``."""
    from safetensors.torch import save

    relpath = blob_relpath(op_type, definition, uuid)
    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})
    write_bytes_atomic(Path(root) / relpath, data)
    return relpath


def load_blob(root: PathLike, relpath: str) -> dict[str, torch.Tensor]:
    """Load every tensor of a safetensors blob stored under ``root``."""
    from safetensors.torch import load_file

    path = resolve_dataset_path(root, relpath)
    if not path.is_file():
        raise FormatError(path, "safetensors blob not found")
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise FormatError(path, f"not a readable safetensors file: {exc}") from None


def load_safetensors_input(root: PathLike, spec: SafetensorsInput) -> torch.Tensor:
    """The tensor a ``safetensors`` workload input points at."""
    tensors = load_blob(root, spec.path)
    if spec.tensor_key not in tensors:
        raise FormatError(
            resolve_dataset_path(root, spec.path),
            f"no tensor {spec.tensor_key!r} in the blob (it has: {', '.join(sorted(tensors))})",
        )
    return tensors[spec.tensor_key]
