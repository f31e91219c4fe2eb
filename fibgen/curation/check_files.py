"""Checks of a dataset's files: its layout, and each definition and record against its schema."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

from fibgen.curation.findings import Report, Row, report_caught
from fibgen.format import FormatError, NotJSONError
from fibgen.format.dataset import DATASET_FOLDERS, EXTRAS_SUFFIX, dataset_files, read_extras
from fibgen.format.jsonio import jsonl_lines, load_definition, parse_trace_line
from fibgen.format.models import Definition, Trace

# What a dataset root may hold besides its four folders.
_OTHER_FOLDERS = ("blob",)

# ---------------------------------------------------------------------------------------
# Layout


def check_layout(report: Report) -> None:
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


def check_definitions(report: Report) -> dict[str, tuple[Path, Definition]]:
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
        # Counted in the definition's row, where the table shows it.
        report_caught(report, caught, defn.name)
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
            extras = read_extras(path, root=report.root)
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
# Record lines (workloads/ and traces/)


def read_lines(report: Report, path: Path, kind: str) -> Iterator[tuple[int, Trace]]:
    """Each record of a JSONL file with its line number, one line read at a time; bad lines
    are reported and left out."""
    try:
        for lineno, line in jsonl_lines(path):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    trace = parse_trace_line(line, path, lineno)
                except NotJSONError as exc:
                    report.add_line(
                        "error",
                        path,
                        lineno,
                        f"{exc.message} (column {exc.col}): a line torn by a writer stopped "
                        "mid-line? fibgen's readers skip it, flashinfer-bench refuses the file; "
                        "delete the line",
                    )
                    continue
                except FormatError as exc:
                    report.add_line("error", path, lineno, exc.message)
                    continue
            report_caught(report, caught, trace.definition)
            report.records[kind] += 1
            yield lineno, trace
    except OSError as exc:
        report.add("error", path, f"cannot read: {exc.strerror or exc}")
