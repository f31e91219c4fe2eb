"""Reports over a dataset's traces: per definition, how each solution did and which was best.

Traces are read at any depth under traces/ (flashinfer-bench's and fibgen's alike); of
several traces of one solution on one workload, the last one read counts.

Latencies of different hardware are never compared: each definition has one table per
hardware its traces were measured on (``evaluation.environment.hardware``; strings that
differ only in case and punctuation are one), and a trace supersedes only earlier ones of
the same hardware.

``summarize(root)`` reads ``traces/`` and returns plain data; ``render(summary, fmt)`` prints
it as text, Markdown or JSON; ``plot(summary, path)`` draws speedup per workload and
solution (needs matplotlib, the ``plot`` extra).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, NamedTuple

from fibgen.format import FormatError, FormatWarning, iter_traces
from fibgen.runtime.selection.hardware import normalize

FORMATS = ("text", "md", "json")


class ReportError(Exception):
    """A report that cannot be made: no traces, or no matplotlib for a plot."""


def _stats(values: list[float]) -> dict[str, float] | None:
    values = [v for v in values if v > 0]
    if not values:
        return None
    return {
        "geomean": math.exp(sum(math.log(v) for v in values) / len(values)),
        "min": min(values),
        "max": max(values),
    }


def _axes_text(axes: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in axes.items()) or "-"


class _Last(NamedTuple):
    """What a report keeps of the last trace of a solution on a workload and hardware: its
    figures, never the trace (Note [reports in bounded memory])."""

    status: str
    axes: dict[str, int]
    latency_ms: float = 0.0
    speedup: float = 0.0
    e2e_latency_ms: float | None = None
    reference_e2e_latency_ms: float | None = None


# Note [reports in bounded memory]
# A dataset's trace files grow with every run (a trace supersedes earlier ones of its
# solution, workload and hardware, which stay in the file): a gigabyte is a few hundred
# thousand runs of a few thousand. Holding every trace, as a list of models, took 10 times
# the files' size (benchmarks/README.md, "Reports and validation of large trace files"). So
# traces are read one line at a time (``iter_traces``) and only the figures of the last one
# per (definition, workload, solution, hardware) are kept: memory grows with those, not
# with the files. tests/test_bench.py holds a report of 4 times the lines to the memory of
# one.


def summarize(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Per definition and hardware: each solution's status counts and speedups, and the best
    per workload."""
    root = Path(root)
    # Said apart from an empty dataset: a mistyped path is not "run bench first".
    if not root.exists():
        raise ReportError(f"dataset folder {root} does not exist")
    if not root.is_dir():
        raise ReportError(f"{root} is not a folder; give the dataset folder that holds traces/")

    def skip(exc: FormatError) -> None:
        # One damaged line (a run killed while writing it) must not hide every other trace.
        column = f" (column {exc.col})" if exc.col is not None else ""
        warnings.warn(
            FormatWarning(exc.path, f"{exc.message}{column}; line skipped", exc.line),
            stacklevel=2,
        )

    # The last trace of a solution on a workload supersedes earlier ones (a run after a fix),
    # on the same hardware only: a CPU run says nothing about the H100 figures.
    latest: dict[tuple[str, str, str, str], _Last] = {}
    labels: dict[str, str] = {}
    groups: dict[str, str] = {}  # each hardware string's group, normalized once
    evaluated = 0
    for trace in iter_traces(root, on_bad=skip):
        evaluation = trace.evaluation
        if trace.solution is None or evaluation is None:
            continue
        evaluated += 1
        hw = evaluation.environment.hardware
        group = groups.get(hw)
        if group is None:
            group = groups[hw] = normalize(hw) or hw
        labels.setdefault(group, hw)
        key = (trace.definition, trace.workload.uuid, trace.solution, group)
        status = evaluation.status.value
        perf = evaluation.performance
        if perf is not None:  # PASSED: the format requires its figures
            last = _Last(
                status,
                trace.workload.axes,
                perf.latency_ms,
                perf.speedup_factor,
                perf.e2e_latency_ms,
                perf.reference_e2e_latency_ms,
            )
        else:
            last = _Last(status, trace.workload.axes)
        latest.pop(key, None)
        latest[key] = last
    if not evaluated:
        raise ReportError(f"no benchmark traces under {root}/traces; run `fibgen bench` first")
    tables: dict[tuple[str, str], Any] = {}
    for (name, uuid, solution, group), last in latest.items():
        d = tables.setdefault((name, group), {"solutions": {}, "workloads": {}})
        status = last.status
        s = d["solutions"].setdefault(
            solution,
            {"passed": 0, "failed": 0, "statuses": {}, "speedups": [], "e2e_speedups": []},
        )
        s["statuses"][status] = s["statuses"].get(status, 0) + 1
        w = d["workloads"].setdefault(uuid, {"uuid": uuid, "axes": last.axes})
        if status != "PASSED":
            s["failed"] += 1
            continue
        s["passed"] += 1
        s["speedups"].append(last.speedup)
        w.setdefault("speedups", {})[solution] = last.speedup
        if "best" not in w or last.latency_ms < w["latency_ms"]:
            w.update(best=solution, latency_ms=last.latency_ms, speedup=last.speedup)
        if last.e2e_latency_ms is not None and last.reference_e2e_latency_ms is not None:
            e2e = last.e2e_latency_ms
            if e2e > 0:
                s["e2e_speedups"].append(last.reference_e2e_latency_ms / e2e)
            if "best_e2e" not in w or e2e < w["e2e_latency_ms"]:
                w.update(best_e2e=solution, e2e_latency_ms=e2e)
    out: dict[str, Any] = {}
    for name, group in sorted(tables, key=lambda k: (k[0], labels[k[1]])):
        d = tables[(name, group)]
        solutions = {}
        for sol in sorted(d["solutions"]):
            s = d["solutions"][sol]
            solutions[sol] = {
                "passed": s["passed"],
                "failed": s["failed"],
                "statuses": dict(sorted(s["statuses"].items())),
                "speedup": _stats(s["speedups"]),
                "e2e_speedup": _stats(s["e2e_speedups"]),
            }
        workloads = sorted(
            d["workloads"].values(), key=lambda w: (sorted(w["axes"].items()), w["uuid"])
        )
        hardware = out.setdefault(name, {"hardware": {}})["hardware"]
        hardware[labels[group]] = {"solutions": solutions, "workloads": workloads}
    return {"definitions": out, "superseded": evaluated - len(latest)}


def _each(summary: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(definition, hardware, its solutions and workloads), one per table of the report."""
    return [
        (name, hw, d)
        for name, by in summary["definitions"].items()
        for hw, d in by["hardware"].items()
    ]


def _speedup(stats: dict[str, float] | None) -> tuple[str, str, str]:
    if stats is None:
        return ("-", "-", "-")
    return tuple(f"{stats[k]:.2f}x" for k in ("geomean", "min", "max"))  # type: ignore[return-value]


def _failures(statuses: dict[str, int]) -> str:
    failed = {k: v for k, v in statuses.items() if k != "PASSED"}
    return ", ".join(f"{k} {v}" for k, v in failed.items()) or "-"


def _tables(
    summary: dict[str, Any],
) -> list[tuple[str, list[str], list[list[str]], list[list[str]]]]:
    out = []
    for name, hw, d in _each(summary):
        rows = [
            [
                sol,
                str(s["passed"]),
                str(s["failed"]),
                _failures(s["statuses"]),
                *_speedup(s["speedup"]),
                _speedup(s.get("e2e_speedup"))[0],
            ]
            for sol, s in d["solutions"].items()
        ]
        best = [
            [
                w["uuid"],
                _axes_text(w["axes"]),
                w.get("best", "(none passed)"),
                f"{w['latency_ms']:.4g}" if "best" in w else "-",
                f"{w['speedup']:.2f}x" if "best" in w else "-",
                w.get("best_e2e", "-"),
                f"{w['e2e_latency_ms'] * 1e3:.4g}" if "best_e2e" in w else "-",
            ]
            for w in d["workloads"]
        ]
        out.append(
            (
                f"{name} on {hw}",
                [
                    "solution",
                    "passed",
                    "failed",
                    "failures",
                    "speedup geomean",
                    "min",
                    "max",
                    "e2e speedup geomean",
                ],
                rows,
                best,
            )
        )
    return out


# GPU time behind an L2 flush, and end to end in an eager loop (fibgen/bench/eager.py): the
# fastest kernel and the fastest call are not always the same solution.
BEST_HEADER = ["workload", "axes", "best solution", "latency ms", "speedup", "best e2e", "e2e µs"]


def _text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def render(summary: dict[str, Any], fmt: str = "text") -> str:
    """The summary as ``text``, ``md`` (Markdown) or ``json``."""
    if fmt == "json":
        return json.dumps(summary, indent=2, sort_keys=True) + "\n"
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}; use one of {', '.join(FORMATS)}")
    lines: list[str] = []
    if summary.get("superseded"):
        lines += [
            f"({summary['superseded']} earlier trace(s) superseded by a later run of the same "
            "solution on the same workload and hardware)",
            "",
        ]
    for name, header, rows, best in _tables(summary):
        if fmt == "md":
            lines += [
                f"## {name}",
                "",
                *_md_table(header, rows),
                "",
                *_md_table(BEST_HEADER, best),
                "",
            ]
        else:
            lines += [name, "", *_text_table(header, rows), "", *_text_table(BEST_HEADER, best), ""]
    return "\n".join(lines)


def plot(summary: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Draw speedup over the reference per workload, one line per solution, one panel per
    definition and hardware, into ``path`` (its suffix is the file type; its folder is made).

    The file is replaced whole or not at all.
    """
    import io

    from fibgen.fsutil import replace_atomically

    path = Path(path)
    fig = figure(summary)  # says how to install matplotlib when it is missing
    import matplotlib.pyplot as plt

    data = io.BytesIO()
    try:
        fig.savefig(data, format=path.suffix.lstrip(".").lower() or None)
    except ValueError as exc:  # a file type matplotlib does not draw
        raise ReportError(f"cannot draw {path}: {exc}") from None
    finally:
        plt.close(fig)
    try:
        replace_atomically(path, data.getvalue())
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from None


def figure(summary: dict[str, Any]) -> Any:
    """The matplotlib figure ``plot`` saves: speedups on a log axis, labelled plainly."""
    from fibgen.bench.plotting import PlotUnavailable, plain_log_formatter, pyplot

    try:
        plt = pyplot()
    except PlotUnavailable as exc:
        raise ReportError(str(exc)) from None
    panels = _each(summary)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3 * len(panels)), squeeze=False)
    for ax, (name, hw, d) in zip(axes[:, 0], panels):
        labels = [_axes_text(w["axes"]) for w in d["workloads"]]
        for sol in d["solutions"]:
            ys = [w.get("speedups", {}).get(sol, math.nan) for w in d["workloads"]]
            ax.plot(range(len(labels)), ys, marker="o", label=sol)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        # Ratios: 2x faster and 2x slower are the same distance from 1.
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain_log_formatter())
        ax.yaxis.set_minor_formatter(plain_log_formatter())
        ax.set_title(f"{name} on {hw}")
        ax.set_ylabel("speedup over reference (log scale)")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
