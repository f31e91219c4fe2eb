"""Checks of a dataset's files: its layout, and each definition and record against its schema."""

from __future__ import annotations

import warnings
from pathlib import Path

from fibgen.curation.findings import Report, Row, _caught
from fibgen.format import FormatError
from fibgen.format.dataset import DATASET_FOLDERS, EXTRAS_SUFFIX, dataset_files, read_extras
from fibgen.format.jsonio import load_definition, parse_trace_line, read_text
from fibgen.format.models import Definition, Trace

# What a dataset root may hold besides its four folders.
_OTHER_FOLDERS = ("blob",)

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
