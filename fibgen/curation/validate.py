"""`fibgen validate DATASET`: check a whole FlashInfer Trace dataset before anything runs on it.

Every file is read, and every problem is collected rather than the first one raised:

- schemas: each definition, solution, workload line and trace line against the format's
  models (unknown keys are warnings, as flashinfer-bench ignores them), and each sidecar;
- layout: files that no reader takes (a ``.json`` under workloads/, anything beside the
  four folders and blob/), duplicate definition and solution names (flashinfer-bench
  refuses a dataset that has them), workload lines in traces/ and results in workloads/;
- references: solutions, workloads and traces of definitions the dataset does not have,
  traces of solutions it does not have, workloads whose axes or inputs do not fit their
  definition;
- blobs: every safetensors input's file and tensor, with the shape and dtype its
  definition gives;
- solutions: a language fibgen runs, an entry that exists (Python sources parse and define
  it; C++/CUDA sources export it), a binding whose tools are installed, a solution folder
  whose JSON holds its files; with ``load``, each is imported or built.

The result is plain data (``Report``); ``render`` prints the per-definition table and the
problems. Blob headers are read as JSON; torch is imported only with ``load``, to load.

Each kind of check has its module, run here in order: ``check_files`` (layout, definitions,
record lines), ``check_solutions``, ``check_workloads`` (and blobs), ``check_traces``; what
they find goes into ``findings.Report``, which ``findings.render`` prints.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fibgen.curation.check_files import check_definitions, check_layout
from fibgen.curation.check_solutions import check_solution_entries
from fibgen.curation.check_traces import check_trace_files
from fibgen.curation.check_workloads import check_workload_files, unused_blobs
from fibgen.curation.findings import Report
from fibgen.format import FormatError
from fibgen.format.dataset import DATASET_FOLDERS

__all__ = ["validate_dataset"]


def validate_dataset(
    root: str | Path, *, load: bool = False, progress: Callable[[str], None] | None = None
) -> Report:
    """Check every file of the dataset at ``root`` (see the module's docstring).

    ``progress`` is told, a line at a time, what takes long: each solution ``load`` imports
    or builds, before it starts, and what loading it said (its warnings).
    """
    root = Path(root)
    report = Report(root)
    if not root.is_dir():
        report.add("error", root, "no such dataset folder")
        return report
    present = [name for name in DATASET_FOLDERS if (root / name).is_dir()]
    if not present:
        report.add(
            "error",
            root,
            "not a dataset: it has none of definitions/, solutions/, workloads/, traces/",
        )
        return report
    check_layout(report)
    try:
        definitions = check_definitions(report)
        solutions = check_solution_entries(report, definitions, load, progress)
        blobs = check_workload_files(report, definitions)
        check_trace_files(report, definitions, solutions)
        unused_blobs(report, blobs)
    except FormatError as exc:
        # A folder no reader may list (a symbolic link out of the dataset, a loop, a FIFO
        # named as a record): every command on the dataset stops there, and so does this.
        report.add("error", exc.path, exc.message)
    return report
