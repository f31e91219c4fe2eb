"""`fibgen workloads`: synthetic workloads for a definition over a grid of var-axis values."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from fibgen.cli.console import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from fibgen.cli.console import eprint as _eprint


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `workloads` subcommand."""
    p = subparsers.add_parser(
        "workloads",
        help="write synthetic workloads for a definition over a grid of var-axis values",
        description=(
            "Write one workload per combination of the given var-axis values into a dataset "
            "(workloads/<op_type>/<definition>.jsonl), and the definition with its .fibgen "
            "sidecar beside them (definitions/<op_type>/), so that the dataset is complete. "
            "Inputs that random data would make invalid (indptr, indices, anything with a "
            "`gen` hint, integer tensors) are generated and stored as safetensors blobs; var "
            "axes not given are derived."
        ),
    )
    p.add_argument("definition", metavar="DEFINITION", help="definition name, e.g. rmsnorm_h4096")
    p.add_argument(
        "--axes",
        action="append",
        default=[],
        metavar="AXIS=V1,V2,...",
        help="values of one var axis; repeat for several axes (the cross product is written); "
        "without it, one workload at the values input generation derives (it says which)",
    )
    p.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="DATASET",
        help="dataset folder (default: $FIBGEN_DATASET_PATH, else the current folder)",
    )
    p.add_argument(
        "--definitions",
        default=None,
        metavar="DIR",
        help=".fidef files or folders, or a dataset holding definitions/ "
        "(default: fibgen's built-in catalogue)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the generated values (default 0)")
    p.add_argument("--replace", action="store_true", help="replace the definition's workload file")
    p.set_defaults(func=cmd_workloads)


def cmd_workloads(args: argparse.Namespace) -> int:
    """Run `fibgen workloads`."""
    from fibgen.curation.grid import GridError, parse_grid
    from fibgen.format.models.names import NAME_RULE, name_problem

    # The command line first, before torch is imported. The name becomes a file name under
    # the dataset (Note [safe names]).
    problem = name_problem(args.definition)
    if problem is not None:
        _eprint(f"error: DEFINITION {args.definition!r} {problem}; {NAME_RULE}")
        return EXIT_USAGE
    try:
        grid = parse_grid(args.axes)
    except GridError as exc:
        _eprint(f"error: {exc}")
        return EXIT_USAGE
    root = Path(args.output or os.environ.get("FIBGEN_DATASET_PATH") or ".")
    if root.exists() and not root.is_dir():
        _eprint(f"error: the dataset {root} is a file, not a folder")
        return EXIT_FAIL

    from fibgen.pipeline.workload_definitions import add_definition, definition_for_workloads

    found = definition_for_workloads(args.definition, args.definitions)
    if isinstance(found, str):
        _eprint(found)
        return EXIT_FAIL
    spec, op_type, model, extras = found
    from fibgen.curation.synthetic import write_synthetic
    from fibgen.curation.workloads import WorkloadError
    from fibgen.format import FormatError

    try:
        # Workloads first: a bad grid is found before anything is written. Then the
        # definition, without which flashinfer-bench refuses the workloads.
        result = write_synthetic(root, op_type, spec, grid, replace=args.replace, seed=args.seed)
        note = add_definition(root, model, extras)
    except (WorkloadError, FormatError) as exc:
        _eprint(f"error: {exc}")
        return EXIT_FAIL
    except OSError as exc:
        _eprint(f"error: cannot write into {root}: {exc}")
        return EXIT_FAIL
    if note:
        _eprint(note)
    if not grid and result.values:
        # Nothing chosen: say what was, and how to choose.
        shown = ", ".join(f"{a}={','.join(map(str, v))}" for a, v in result.values.items())
        first = next(iter(result.values))
        _eprint(
            f"note: no --axes given: wrote the workload at {shown}, the values input "
            f"generation derives; --axes {first}=V1,V2,... chooses"
        )
    kept = f"; kept {result.kept} existing" if result.kept else ""
    print(f"wrote {result.added} workload(s) of {spec.name} to {result.path}{kept}")
    return EXIT_OK
