"""`fibgen scaffold-solution` and `fibgen pack`: writing a solution folder, and packing it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fibgen.cli.console import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from fibgen.cli.console import eprint as _eprint
from fibgen.codegen.scaffold import LANGUAGES


def _names_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the names given on the command line (each becomes a folder name)."""
    from fibgen.format.models.names import NAME_RULE, name_problem

    given = (("DEFINITION", args.definition), ("--author", args.author), ("--name", args.name))
    for flag, value in given:
        if value is not None and name_problem(value) is not None:
            return f"{flag} {value!r} {name_problem(value)}; {NAME_RULE}"
    return None


def _is_dataset(path: str) -> bool:
    """Whether ``path`` is a dataset (definitions/ of JSON) rather than `.fidef` sources."""
    folder = Path(path)
    return (
        folder.is_dir()
        and (folder / "definitions").is_dir()
        and next(folder.rglob("*.fidef"), None) is None
    )


def cmd_scaffold(args: argparse.Namespace) -> int:
    """Write the scaffold; print where, or the reason it was not written."""
    problem = _names_problem(args)
    if problem is not None:
        _eprint(f"error: {problem}")
        return EXIT_USAGE
    from fibgen.codegen.scaffold import DiagnosticsError, ScaffoldError, scaffold_solution

    output = Path(args.output)
    if output.exists() and not output.is_dir():
        _eprint(f"error: -o {args.output} is a file; give the folder of solutions")
        return EXIT_FAIL
    dataset_parts = _dataset_parts(output)
    if dataset_parts:
        # Written there, the solution would sit beside the dataset's folders, where neither
        # bench nor apply looks.
        target = Path(args.output) / "solutions"
        _eprint(
            f"error: {args.output} is a dataset (it has {', '.join(dataset_parts)}); bench and "
            f"apply find its solutions under {target}: use -o {target}"
        )
        return EXIT_FAIL
    definitions = args.definitions
    if definitions is not None and _is_dataset(definitions):
        # A dataset's definitions are JSON: imported as `fibgen import` would (as `fibgen
        # workloads --definitions DATASET` reads them).
        from fibgen.pipeline.importing import dataset_definition

        definitions = dataset_definition(definitions, args.definition)
        if isinstance(definitions, str):
            _eprint(definitions)
            return EXIT_FAIL
    try:
        result = scaffold_solution(
            args.definition,
            language=args.language,
            author=args.author,
            name=args.name,
            dps=args.dps,
            output=args.output,
            definitions=definitions,
            force=args.force,
        )
    except DiagnosticsError as exc:
        _eprint(str(exc))  # compiler diagnostics, each saying `error:` itself
        return EXIT_FAIL
    except ScaffoldError as exc:
        _eprint(f"error: {exc}")
        return EXIT_FAIL
    print(f"wrote {result.folder}: {result.solution_json.name}, {', '.join(result.sources)}")
    return EXIT_OK


def _dataset_parts(folder: Path) -> list[str]:
    """The dataset folders (definitions/, workloads/, traces/) ``folder`` holds, if any."""
    from fibgen.format.dataset import DATASET_FOLDERS

    return [f"{top}/" for top in DATASET_FOLDERS if top != "solutions" and (folder / top).is_dir()]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `scaffold-solution` and `pack` subcommands."""
    _register_scaffold(subparsers)
    register_pack(subparsers)


def _register_scaffold(subparsers: argparse._SubParsersAction) -> None:
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
        help=".fidef files or folders, or a dataset holding definitions/ (default: fibgen's "
        "built-in catalogue)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing solution folder")
    p.set_defaults(func=cmd_scaffold)


def _solution_folders(path: Path) -> list[Path]:
    """The Solution JSONs of the solution folders at or under ``path``."""
    if path.is_file() or (path / f"{path.name}.json").is_file():
        return [path / f"{path.name}.json" if path.is_dir() else path]
    found = []
    for where, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        name = os.path.basename(where)
        if f"{name}.json" in files:
            found.append(Path(where, f"{name}.json"))
    return sorted(found)


def cmd_pack(args: argparse.Namespace) -> int:
    """Write each solution folder's files into its Solution JSON; with --check, only compare."""
    from fibgen.format import FormatError, pack_solution

    found: list[Path] = []
    for item in args.paths:
        path = Path(item)
        if not path.exists():
            sys.stderr.write(f"error: no such file or folder: {item}\n")
            return 1
        folders = _solution_folders(path)
        if not folders:
            sys.stderr.write(
                f"error: no solution folder in {item} (a folder <name>/ holding <name>.json "
                "and its sources, as scaffold-solution writes it)\n"
            )
            return 1
        found += folders
    if args.output and len(found) != 1:
        sys.stderr.write(f"error: -o takes one solution folder, {len(found)} were given\n")
        return 2
    stale = []
    for json_path in found:
        try:
            packed = pack_solution(json_path, args.output, check=args.check)
        except FormatError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 1
        if packed.changed:
            stale.append(packed.path)
            print(f"{'stale' if args.check else 'packed'}: {packed.path}")
    if args.check and stale:
        sys.stderr.write(
            f"error: {len(stale)} Solution JSON(s) do not hold their folder's files; "
            f"run `fibgen pack {' '.join(args.paths)}`\n"
        )
        return 1
    print(f"{len(found) - len(stale)} of {len(found)} solution(s) already up to date")
    return 0


def register_pack(subparsers: argparse._SubParsersAction) -> None:
    """Add the `pack` subcommand."""
    p = subparsers.add_parser(
        "pack",
        help="write solution folders' files into their Solution JSON (to submit or share)",
        description=(
            "A solution folder (<name>/ with <name>.json and its sources) is read from its "
            "files by bench, the generated tests and apply. pack writes the files into the "
            "JSON, which then stands alone: what flashinfer-bench reads and what one submits. "
            "Every file in the folder is a source, except the JSON, hidden files, "
            "__pycache__ and build outputs."
        ),
    )
    p.add_argument(
        "paths", nargs="+", metavar="PATH", help="solution folders, their JSON, or folders of them"
    )
    p.add_argument("-o", "--output", metavar="FILE.json", help="write here instead (one solution)")
    p.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a JSON is stale"
    )
    p.set_defaults(func=cmd_pack)
