"""Reading a dataset: every definition, solution, workload and trace under its root."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fibgen.format.dataset.layout import PathLike, dataset_files
from fibgen.format.dataset.solution_folders import read_solution
from fibgen.format.errors import FormatError
from fibgen.format.jsonio import load_definition, parse_trace_line, read_text
from fibgen.format.models import Definition, Solution, Trace, Workload


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
