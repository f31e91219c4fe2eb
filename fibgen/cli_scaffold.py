"""`fibgen scaffold-solution`: the command line over ``fibgen.scaffold``."""

from __future__ import annotations

import argparse
import sys

from fibgen.scaffold import LANGUAGES


def cmd_scaffold(args: argparse.Namespace) -> int:
    """Write the scaffold; print where, or the reason it was not written."""
    from fibgen.scaffold import ScaffoldError, scaffold_solution

    try:
        result = scaffold_solution(
            args.definition,
            language=args.language,
            author=args.author,
            name=args.name,
            dps=args.dps,
            output=args.output,
            definitions=args.definitions,
            force=args.force,
        )
    except ScaffoldError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    print(f"wrote {result.folder}: {result.solution_json.name}, {', '.join(result.sources)}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `scaffold-solution` subcommand."""
    p = subparsers.add_parser(
        "scaffold-solution", help="write a new solution folder for one definition"
    )
    p.add_argument("definition", metavar="DEFINITION", help="definition name, e.g. rmsnorm_h4096")
    p.add_argument("--language", required=True, choices=LANGUAGES)
    p.add_argument("--author", help="author folder and Solution author (default: login name)")
    p.add_argument("--name", help="solution name (default: <language>_<definition>)")
    p.add_argument(
        "--dps",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="destination-passing style: run(*inputs, *outputs) (default), or --no-dps: "
        "run(*inputs) returns the outputs",
    )
    p.add_argument("-o", "--output", default="solutions", help="output folder (default: solutions)")
    p.add_argument(
        "--definitions",
        default=None,
        metavar="DIR",
        help=".fidef files or folders (default: fibgen's built-in catalogue)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing solution folder")
    p.set_defaults(func=cmd_scaffold)
