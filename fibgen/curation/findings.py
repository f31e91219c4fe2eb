"""What checking a dataset finds: problems, a row per definition, and the table of both."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Problem", "Report", "Row", "render"]


# Note [repeated problems]
# A problem can repeat on line after line of a record file: a key that a newer writer adds to
# every trace, traces of a solution the dataset does not have. A trace file grows to
# gigabytes, and one Problem a line would hold more than the file. So a problem of a line
# (``Report.add_line``) that its file had on an earlier line is counted on the first one
# (``Problem.more``), not kept again: what validate holds grows with the distinct problems,
# and it prints each once, with how many more lines have it. Counts (the table's per
# definition, the verdict's) are of every line.


@dataclass
class Problem:
    """One finding: ``error`` (a reader fails or a run would) or ``warning``; ``more``: the
    further lines of its file that have it (Note [repeated problems])."""

    level: str
    where: str
    message: str
    definition: str | None = None
    more: int = 0

    def __str__(self) -> str:
        text = f"{self.level}: {self.where}: {self.message}"
        if self.more:
            text += f" (and {self.more} more line(s) of this file)"
        return text


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
    # (level, file, message, definition) -> the problem of the first line that had it
    firsts: dict[tuple[str, str, str, str | None], Problem] = field(
        default_factory=dict, repr=False
    )

    @property
    def errors(self) -> list[Problem]:
        """The problems that are errors."""
        return [p for p in self.problems if p.level == "error"]

    @property
    def warnings(self) -> list[Problem]:
        """The problems that are warnings."""
        return [p for p in self.problems if p.level == "warning"]

    def count(self, level: str) -> int:
        """How many ``level`` problems were found, each line that has one counted."""
        return sum(1 + p.more for p in self.problems if p.level == level)

    def add(self, level: str, where: Any, message: str, definition: str | None = None) -> None:
        """Record a problem, counted in its definition's row."""
        self.problems.append(Problem(level, str(where), message, definition))
        self._counted(level, definition)

    def add_line(
        self, level: str, path: Any, line: int, message: str, definition: str | None = None
    ) -> None:
        """Record a problem of one line of a record file; one that an earlier line of the
        file had is counted there (Note [repeated problems])."""
        key = (level, str(path), message, definition)
        first = self.firsts.get(key)
        if first is None:
            self.firsts[key] = first = Problem(level, f"{path}:{line}", message, definition)
            self.problems.append(first)
        else:
            first.more += 1
        self._counted(level, definition)

    def _counted(self, level: str, definition: str | None) -> None:
        if definition is not None:
            row = self.rows.setdefault(definition, Row())
            if level == "error":
                row.errors += 1
            else:
                row.warnings += 1


def report_caught(report: Report, caught: list, definition: str | None = None) -> None:
    for w in caught:
        path, line = getattr(w.message, "path", "?"), getattr(w.message, "line", None)
        if line is None:
            report.add("warning", path, _warning_text(w), definition)
        else:
            report.add_line("warning", path, line, _warning_text(w), definition)


def _warning_text(w: Any) -> str:
    return getattr(w.message, "message", str(w.message))


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
    errors, warned = report.count("error"), report.count("warning")
    verdict = "FAILED" if errors else "ok"
    lines += ["", f"validate: {verdict}: {errors} error(s), {warned} warning(s)"]
    return "\n".join(lines) + "\n"
