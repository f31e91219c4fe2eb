"""Checks of traces: where they are, and the definitions and solutions each refers to."""

from __future__ import annotations

from pathlib import Path

from fibgen.curation.check_files import read_lines
from fibgen.curation.findings import Report, Row
from fibgen.format import Solution
from fibgen.format.dataset import dataset_files
from fibgen.format.models import Definition


def check_trace_files(
    report: Report,
    definitions: dict[str, tuple[Path, Definition]],
    solutions: dict[str, Solution],
) -> None:
    for path in dataset_files(report.root, "traces"):
        report.files["traces"] += 1
        for lineno, trace in read_lines(report, path, "traces"):
            name = trace.definition
            if trace.is_workload_trace:
                report.add_line(
                    "error",
                    path,
                    lineno,
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
                report.add_line(
                    "error",
                    path,
                    lineno,
                    f"a trace of {name!r}, which the dataset does not have",
                    name,
                )
            if trace.solution is not None and trace.solution not in solutions:
                report.add_line(
                    "error",
                    path,
                    lineno,
                    f"a trace of solution {trace.solution!r}, which is not under solutions/",
                    name,
                )
            elif trace.solution is not None and solutions[trace.solution].definition != name:
                report.add_line(
                    "error",
                    path,
                    lineno,
                    f"solution {trace.solution!r} is for "
                    f"{solutions[trace.solution].definition!r}, not {name!r}",
                    name,
                )
