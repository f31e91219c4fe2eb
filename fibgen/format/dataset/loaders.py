"""Reading a dataset: every definition, solution, workload and trace under its root."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from fibgen.format.dataset.layout import PathLike, dataset_files
from fibgen.format.dataset.solution_folders import read_solution
from fibgen.format.errors import FormatError, FormatWarning, NotJSONError
from fibgen.format.jsonio import jsonl_lines, load_definition, parse_trace_line
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
    """All workloads under ``root/workloads`` (any depth), by definition name, in file order.

    A line that is not JSON (torn) is skipped with a FormatWarning (``iter_records``).
    """
    out: dict[str, list[Workload]] = {}
    for path in dataset_files(root, "workloads"):
        for lineno, trace in iter_records(path):
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

    See ``iter_traces``, which reads them one at a time.
    """
    return list(iter_traces(root, on_bad))


def iter_traces(
    root: PathLike, on_bad: Callable[[FormatError], None] | None = None
) -> Iterator[Trace]:
    """The traces under ``root/traces`` one at a time, in the order of ``load_traces``.

    Only one line is read at a time: a reader that keeps what it needs of each trace holds
    that, not the files, which grow to gigabytes. Bad lines are handled by ``iter_records``:
    with ``on_bad``, one damaged line (a run killed while writing it) does not hide every
    other trace of the dataset.
    """
    for path in dataset_files(root, "traces"):
        for _, trace in iter_records(path, on_bad):
            yield trace


def iter_records(
    path: PathLike, on_bad: Callable[[FormatError], None] | None = None
) -> Iterator[tuple[int, Trace]]:
    """Each record of a JSONL file with its line number (checks made after parsing still
    point at the line), read one line at a time.

    A line that is not JSON is skipped with a FormatWarning naming its file and line: it is
    a line torn by a writer stopped mid-line (Note [torn lines] in writers.py), and the
    records around it are whole. A line that is JSON but no record raises FormatError. With
    ``on_bad``, every bad line is handed to ``on_bad`` and skipped instead.
    """
    for lineno, line in jsonl_lines(path):
        try:
            trace = parse_trace_line(line, path, lineno)
        except NotJSONError as exc:
            if on_bad is not None:
                on_bad(exc)
                continue
            size = len(line.rstrip(b"\r\n"))
            warnings.warn(
                FormatWarning(
                    path,
                    f"skipped: not JSON ({size} bytes; a line torn by a writer stopped before "
                    "finishing it?)",
                    lineno,
                ),
                stacklevel=2,
            )
            continue
        except FormatError as exc:
            if on_bad is None:
                raise
            on_bad(exc)
            continue
        yield lineno, trace
