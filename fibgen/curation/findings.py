"""What checking a dataset finds: problems, a row per definition, and the table of both."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Problem", "Report", "Row", "render"]


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
    # Problems of no definition (a stray file, a sidecar alone) get a row of their own, so
    # that the table's counts add up to the verdict's.
    other = [p for p in report.problems if p.definition not in report.rows]
    if other:
        errors = sum(p.level == "error" for p in other)
        rows.append(["(no definition)", "-", "-", "-", "-", str(errors), str(len(other) - errors)])
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
