"""`fibgen validate`: check a whole dataset and print what is wrong with it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fibgen.cli.console import EXIT_FAIL, eprint


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `validate` subcommand."""
    p = subparsers.add_parser(
        "validate",
        help="check a whole dataset: schemas, layout, references, blobs, solutions",
        description=(
            "Read every file of DATASET and report every problem at once: files that do not "
            "parse (unknown keys are warnings), files no reader takes, duplicate names, "
            "solutions/workloads/traces of definitions or solutions the dataset does not have, "
            "workloads that do not fit their definition, missing blobs or tensors, and "
            "solutions whose entry is missing or whose tools are not installed. Prints a table "
            "per definition; exit 1 when there is an error. The first command to run on a "
            "dataset."
        ),
    )
    p.add_argument("dataset", metavar="DATASET", help="dataset folder")
    p.add_argument(
        "--load",
        action="store_true",
        help=(
            "also import every Python/Triton solution and build every C++/CUDA one, as bench "
            "and apply do; a line on stderr says which one is being loaded"
        ),
    )
    p.add_argument("--all", action="store_true", help="list every problem (default: 40)")
    p.set_defaults(func=cmd_validate)


def _not_a_dataset(dataset: str) -> str | None:
    """Why ``dataset`` is no dataset folder at all: said alone, not as a table of nothing."""
    from fibgen.format.dataset import DATASET_FOLDERS

    path = Path(dataset)
    if not path.exists():
        return f"dataset folder {dataset} does not exist"
    if not path.is_dir():
        return f"{dataset} is not a folder; give the dataset folder"
    if not any((path / name).is_dir() for name in DATASET_FOLDERS):
        return f"{dataset} is not a dataset: it has none of {', '.join(f'{n}/' for n in DATASET_FOLDERS)}"
    return None


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate; exit 1 when an error was found."""
    problem = _not_a_dataset(args.dataset)
    if problem is not None:
        eprint(f"error: {problem}")
        return EXIT_FAIL
    from fibgen.curation.findings import render
    from fibgen.curation.validate import validate_dataset

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.load:
        progress(f"validate: checking {args.dataset}; --load imports or builds each solution")
    report = validate_dataset(args.dataset, load=args.load, progress=progress)
    sys.stdout.write(render(report, None if args.all else 40))
    return 1 if report.errors else 0
