"""The on-disk layout of a FlashInfer Trace dataset: paths, loaders and atomic writers.

::

    <root>/definitions/<op_type>/<definition>.json
    <root>/solutions/<author>/<op_type>/<definition>/<solution>.json
    <root>/workloads/<op_type>/<definition>.jsonl
    <root>/traces/<op_type>/<definition>.jsonl
    <root>/blob/workloads/<op_type>/<definition>/<definition>_<uuid>.safetensors

Note [dataset depth]
flashinfer-bench's ``TraceSet.from_path`` reads every ``*.json`` / ``*.jsonl`` at any depth
under each of the four folders, and its own writers do not agree on one depth (traces go to
``traces/<op_type>/<definition>.jsonl`` from ``add_traces``, ``traces/<definition>.jsonl``
from a merge). So the loaders here read any depth too and take a record's definition from
its content, never from where the file sits; the writers use flashinfer-bench's depths
(above). Names starting with a dot (temporary files, locks) are skipped. Loaders walk in
sorted order, so results do not depend on the file system.

Note [solution folders]
A solution folder is ``<name>/`` holding the Solution JSON ``<name>.json`` and the solution's
source files, as ``fibgen scaffold-solution`` writes it. Its files are the truth:
``read_solution`` takes the sources from them (every file in the folder but the JSON, hidden
names, ``__pycache__`` and build outputs), so an edit is used by bench, tests and apply as
soon as it is saved. ``pack_solution`` writes them into the JSON, which then stands alone
(what flashinfer-bench reads, and what one submits). A Solution JSON elsewhere, or in a
folder that does not hold its entry file, is self-contained as it is.

Writers replace files atomically (a temporary file in the same directory, then
``os.replace``), so a reader never sees half a file. torch and safetensors are imported only
by the blob functions.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

from fibgen.format.errors import FormatError, FormatWarning
from fibgen.fsutil import replace_atomically
from fibgen.format.jsonio import (
    dump_definition,
    dump_solution,
    dump_trace_line,
    load_definition,
    load_solution,
    parse_json,
    parse_trace_line,
    read_text,
    solution_to_json,
    validate_obj,
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


def trace_path(root: PathLike, op_type: str, definition: str) -> Path:
    """``<root>/traces/<op_type>/<definition>.jsonl``, where flashinfer-bench's add_traces writes."""
    return (
        Path(root)
        / "traces"
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
    """Resolve a path stored in the dataset (relative to ``root``); refuse ones that escape.

    The text is checked first (absolute, ``..``, NUL), then the file system: with symbolic
    links followed, the path must still lie inside the dataset root, so that a link in the
    dataset (a blob, or a folder above it) cannot make bench read a file elsewhere. Returns
    the path under ``root`` as written, which messages show.
    """
    parts = relpath.replace("\\", "/").split("/")
    if relpath.startswith(("/", "\\")) or ".." in parts or (len(relpath) > 1 and relpath[1] == ":"):
        raise ValueError(f"dataset path {relpath!r} must be relative to the dataset root")
    if "\0" in relpath:
        raise ValueError(f"dataset path {relpath!r} contains a NUL byte")
    path = Path(root).joinpath(*[p for p in parts if p not in ("", ".")])
    try:
        real_root = Path(root).resolve()
        real = path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise ValueError(f"dataset path {relpath!r} cannot be resolved: {exc}") from None
    if real != real_root and real_root not in real.parents:
        raise ValueError(
            f"dataset path {relpath!r} leads outside the dataset through a symbolic link; "
            "a stored file must lie inside the dataset root"
        )
    return path


# ---------------------------------------------------------------------------------------
# Loaders


DATASET_FOLDERS = {
    "definitions": ".json",
    "solutions": ".json",
    "workloads": ".jsonl",
    "traces": ".jsonl",
}


def dataset_files(root: PathLike, top: str) -> list[Path]:
    """Every record file under ``root/<top>`` at any depth, sorted (Note [dataset depth])."""
    suffix = DATASET_FOLDERS[top]
    base = Path(root) / top
    if not base.is_dir():
        return []
    found = []
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend(Path(folder, f) for f in files if f.endswith(suffix) and not f.startswith("."))
    return sorted(found)


def load_definitions(root: PathLike) -> dict[str, Definition]:
    """All definitions under ``root/definitions`` (any depth), by name, in sorted path order."""
    return {name: defn for name, (_, defn) in load_definition_files(root).items()}


def load_definition_files(root: PathLike) -> dict[str, tuple[Path, Definition]]:
    """Like ``load_definitions``, with the file each definition came from."""
    out: dict[str, tuple[Path, Definition]] = {}
    for path in dataset_files(root, "definitions"):
        defn = load_definition(path)
        if defn.name in out:
            raise FormatError(
                path, f"definition name {defn.name!r} is also used by {out[defn.name][0]}"
            )
        out[defn.name] = (path, defn)
    return out


def load_workloads(root: PathLike) -> dict[str, list[Workload]]:
    """All workloads under ``root/workloads`` (any depth), by definition name, in file order."""
    out: dict[str, list[Workload]] = {}
    for path in dataset_files(root, "workloads"):
        for lineno, trace in _numbered(path):
            if not trace.is_workload_trace:
                raise FormatError(
                    path,
                    "a workload file holds only workload lines "
                    '("solution": null, "evaluation": null); put results under traces/',
                    lineno,
                )
            out.setdefault(trace.definition, []).append(trace.workload)
    return out


def load_solutions(root: PathLike) -> list[Solution]:
    """All solutions under ``root/solutions`` (any depth), in sorted path order.

    A solution folder's sources come from its files (Note [solution folders]).
    """
    return [solution for _, solution in load_solution_files(root)]


def load_solution_files(root: PathLike) -> list[tuple[Path, Solution]]:
    """Like ``load_solutions``, with the JSON file of each solution."""
    return [(path, read_solution(path)) for path in dataset_files(root, "solutions")]


def load_traces(root: PathLike, on_bad: Callable[[FormatError], None] | None = None) -> list[Trace]:
    """All traces under ``root/traces`` (any depth), in sorted path order, then line order.

    A line that does not parse raises FormatError naming its file and line; with ``on_bad``
    it is handed to ``on_bad`` and skipped instead, so that one damaged line (a run killed
    while writing it) does not hide every other trace of the dataset.
    """
    return [trace for path in dataset_files(root, "traces") for _, trace in _numbered(path, on_bad)]


# ---------------------------------------------------------------------------------------
# Solution folders (Note [solution folders])

# What a solution folder holds besides its sources: caches and build outputs.
_NOT_SOURCES = ("__pycache__",)
_NOT_SOURCE_SUFFIXES = (".pyc", ".pyo", ".o", ".so", ".a", ".dylib", ".dll", ".lock", ".tmp")


def is_solution_folder(path: PathLike, solution: Solution) -> bool:
    """Whether the Solution JSON at ``path`` sits in its own solution folder."""
    path = Path(path)
    folder = path.parent
    return (
        folder.name == solution.name
        and path.stem == solution.name
        and (folder / solution.spec.entry_file).is_file()
    )


def folder_sources(path: PathLike) -> dict[str, str]:
    """The source files of the solution folder of the JSON at ``path``, by relative path."""
    path = Path(path)
    folder = path.parent
    sources: dict[str, str] = {}
    for where, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _NOT_SOURCES)
        for name in sorted(files):
            file = Path(where, name)
            if name.startswith(".") or name.endswith(_NOT_SOURCE_SUFFIXES) or file == path:
                continue
            rel = file.relative_to(folder).as_posix()
            try:
                text = file.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise FormatError(
                    file, "not UTF-8 text; a solution folder holds only its source files"
                ) from None
            except OSError as exc:
                raise FormatError(file, f"cannot read: {exc.strerror or exc}") from None
            if not text:
                raise FormatError(
                    file, "empty; a Solution cannot hold an empty source (delete it or fill it)"
                )
            sources[rel] = text
    return dict(sorted(sources.items()))


def read_solution(path: PathLike) -> Solution:
    """The Solution at ``path``, with a solution folder's sources read from its files."""
    solution = load_solution(path)
    if not is_solution_folder(path, solution):
        return solution
    sources = folder_sources(path)
    if sources == {s.path: s.content for s in solution.sources}:
        return solution
    obj = solution_to_json(solution)
    obj["sources"] = [{"path": p, "content": c} for p, c in sources.items()]
    return validate_obj(Solution, obj, path)


def is_stale(path: PathLike) -> bool:
    """Whether a solution folder's files differ from the sources its JSON holds."""
    solution = load_solution(path)
    return is_solution_folder(path, solution) and (
        folder_sources(path) != {s.path: s.content for s in solution.sources}
    )


@dataclass(frozen=True)
class Packed:
    """What ``pack_solution`` did: the JSON written (or checked) and whether it changed."""

    path: Path
    solution: Solution
    changed: bool


def pack_solution(path: PathLike, output: PathLike | None = None, *, check: bool = False) -> Packed:
    """Write a solution folder's sources into its Solution JSON (or into ``output``).

    ``path`` is the folder or its JSON. With ``check`` nothing is written; ``changed`` says
    whether the JSON is stale. Raises FormatError when ``path`` is not a solution folder.
    """
    path = Path(path)
    json_path = path / f"{path.name}.json" if path.is_dir() else path
    if not json_path.is_file():
        raise FormatError(path, f"no solution folder here: expected {json_path.name} in it")
    stored = load_solution(json_path)
    if not is_solution_folder(json_path, stored):
        raise FormatError(
            json_path,
            f"not a solution folder: the JSON of solution {stored.name!r} must be "
            f"{stored.name}/{stored.name}.json, beside its entry file {stored.spec.entry_file}",
        )
    solution = read_solution(json_path)
    target = json_path if output is None else Path(output)
    text = dump_solution(solution)
    try:
        current = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = None
    changed = current != text
    if changed and not check:
        write_text_atomic(target, text)
    return Packed(target, solution, changed)


def _numbered(
    path: Path, on_bad: Callable[[FormatError], None] | None = None
) -> list[tuple[int, Trace]]:
    # Keep each trace's line number: checks made after parsing still point at the line.
    out = []
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((lineno, parse_trace_line(line, path, lineno)))
        except FormatError as exc:
            if on_bad is None:
                raise
            on_bad(exc)
    return out


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


# Note [torn lines]
# A JSONL writer stopped in the middle of a line (killed, out of disk; flashinfer-bench and
# the tracer append in place) leaves a last line without its newline that is not JSON.
# Appending after it would glue the next record to it and lose both, and a reader that stops
# at the first bad line would lose the whole file. So every appender here drops such a torn
# last line first and says so (it never was a record: its writer did not finish it), a last
# line that is whole JSON without its newline only gets the newline, and readers that can go
# on (``load_traces(..., on_bad=...)``) name each bad line by file and line and skip it.


def _torn_tail(data: bytes) -> tuple[int, int] | None:
    """(offset, line number) of a torn last line of JSONL ``data``, or None (Note [torn lines])."""
    if not data or data.endswith(b"\n"):
        return None
    start = data.rfind(b"\n") + 1
    try:
        json.loads(data[start:].decode("utf-8"))
        return None
    except ValueError:  # not UTF-8 or not JSON: cut off mid-line
        return start, data.count(b"\n", 0, start) + 1


def _torn_message(data: bytes, torn: tuple[int, int]) -> str:
    return (
        f"dropped a torn last line ({len(data) - torn[0]} bytes, not JSON): its writer was "
        "stopped before finishing it"
    )


def drop_torn_last_line(path: PathLike) -> str | None:
    """Drop a torn last line of a JSONL file (Note [torn lines]); what was done, or None."""
    from filelock import FileLock

    path = Path(path)
    if not path.is_file():
        return None  # nothing to repair; and no lock file beside a path that is not there
    with FileLock(str(path.with_name(f".{path.name}.lock"))):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        torn = _torn_tail(data)
        if torn is None:
            return None
        write_bytes_atomic(path, data[: torn[0]])
        return str(FormatWarning(path, _torn_message(data, torn), torn[1]))


def append_lines_atomic(path: PathLike, lines: Iterable[str]) -> None:
    """Append lines (without newlines) to a JSONL file by atomically replacing it.

    A torn last line is dropped first, with a FormatWarning (Note [torn lines]).
    """
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
        torn = _torn_tail(old)
        if torn is not None:
            warnings.warn(FormatWarning(path, _torn_message(old, torn), torn[1]), stacklevel=2)
            old = old[: torn[0]]
        elif old and not old.endswith(b"\n"):
            old += b"\n"
        write_bytes_atomic(path, old + new)


def write_definition(root: PathLike, defn: Definition, extras: dict | None = None) -> Path:
    """Write a definition to its place in the layout, and its sidecar when given; its path."""
    path = definition_path(root, defn.op_type, defn.name)
    if extras:
        # The sidecar first: a definition never sits without the hints it was made with.
        write_text_atomic(sidecar_path(path), dump_extras(extras))
    write_text_atomic(path, dump_definition(defn))
    return path


# ---------------------------------------------------------------------------------------
# Sidecars: what flashinfer-bench's definition has no field for

# Beside ``<name>.json``: ``<name>.fibgen`` holds ``{"tolerance": {...}, "hints": {...}}``,
# a family's `tolerance(...)` and its inputs' `gen` hints. Not `.json`, so that
# flashinfer-bench's loader, which reads every JSON file under definitions/, skips it.
EXTRAS_SUFFIX = ".fibgen"


def sidecar_path(definition_file: PathLike) -> Path:
    """The sidecar beside a definition JSON file."""
    return Path(definition_file).with_suffix(EXTRAS_SUFFIX)


def read_extras(definition_file: PathLike) -> dict:
    """The sidecar of the definition JSON at ``definition_file``; empty when there is none."""
    path = sidecar_path(definition_file)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise FormatError(path, f"cannot read: {exc.strerror or exc}") from None
    data = parse_json(text, path)
    problems = []
    if not isinstance(data, dict):
        problems.append("expected a JSON object with 'tolerance' and 'hints'")
    else:
        for key, value in data.items():
            if key not in ("tolerance", "hints"):
                problems.append(f"unknown key {key!r} (allowed keys: tolerance, hints)")
            elif not isinstance(value, dict):
                problems.append(f"{key}: expected an object")
    if problems:
        raise FormatError(path, "; ".join(problems))
    return data


def dump_extras(extras: dict) -> str:
    """Canonical text of a sidecar (what ``fibgen build`` writes)."""
    return json.dumps(extras, indent=2, sort_keys=True) + "\n"


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


def append_traces(root: PathLike, op_type: str, traces: Iterable[Trace]) -> list[Path]:
    """Append traces to ``traces/<op_type>/<definition>.jsonl``, one file per definition."""
    by_definition: dict[str, list[str]] = {}
    for trace in traces:
        by_definition.setdefault(trace.definition, []).append(dump_trace_line(trace))
    paths = []
    for definition, lines in by_definition.items():
        path = trace_path(root, op_type, definition)
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
