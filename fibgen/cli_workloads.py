"""`fibgen workloads`: synthetic workloads for a definition over a grid of var-axis values."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Union

from fibgen.cli import EXIT_FAIL, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:  # torch and pydantic load when the command runs, not when the CLI starts
    from fibgen.format import Definition
    from fibgen.runtime.inputs import InputSpec

# What the command needs of a definition: its input spec, op_type and dataset model.
_Found = tuple["InputSpec", str, "Definition"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `workloads` subcommand."""
    p = subparsers.add_parser(
        "workloads",
        help="write synthetic workloads for a definition over a grid of var-axis values",
        description=(
            "Write one workload per combination of the given var-axis values into a dataset "
            "(workloads/<op_type>/<definition>.jsonl). Inputs that random data would make "
            "invalid (indptr, indices, anything with a `gen` hint, integer tensors) are "
            "generated and stored as safetensors blobs; var axes not given are derived."
        ),
    )
    p.add_argument("definition", metavar="DEFINITION", help="definition name, e.g. rmsnorm_h4096")
    p.add_argument(
        "--axes",
        action="append",
        default=[],
        metavar="AXIS=V1,V2,...",
        help="values of one var axis; repeat for several axes (the cross product is written)",
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
        default="definitions",
        metavar="DIR",
        help=".fidef files or folders, or a dataset holding definitions/ (default: definitions)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the generated values (default 0)")
    p.add_argument("--replace", action="store_true", help="replace the definition's workload file")
    p.set_defaults(func=cmd_workloads)


def _eprint(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


def _unknown(name: str, known: list[str], where: str) -> str:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"\n  = help: did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""
    return f"error: no definition named `{name}` in {where}{hint}"


def _from_fidef(name: str, path: str) -> Union[_Found, str, None]:
    """The definition from `.fidef` sources; an error message; None when there are none."""
    from fibgen.codegen.definition_json import definition_dict
    from fibgen.compiler import compile_paths, discover
    from fibgen.compiler.diagnostics import render_all
    from fibgen.format import Definition
    from fibgen.runtime.inputs import InputSpec

    found, _ = discover([path])
    if not found:
        return None
    result = compile_paths([path])
    if result.module is None:
        return render_all(result.diagnostics, result.sources)
    by_name = {d.name: d for d in result.module.definitions}
    defn = by_name.get(name)
    if defn is None:
        return _unknown(name, sorted(by_name), path)
    family = next(f for f in result.module.families() if f.name == defn.family)
    model = Definition.model_validate(definition_dict(defn))
    return InputSpec.from_ir(defn, family), defn.op_type, model


def _from_dataset(name: str, path: str) -> Union[_Found, str]:
    from fibgen.format import FormatError, load_definitions
    from fibgen.runtime.workloads import input_spec

    try:
        definitions = load_definitions(path)
    except FormatError as exc:
        return f"error: {exc}"
    defn = definitions.get(name)
    if defn is None:
        return _unknown(name, sorted(definitions), f"{path}/definitions")
    return input_spec(defn), defn.op_type, defn


def cmd_workloads(args: argparse.Namespace) -> int:
    """Run `fibgen workloads`."""
    from fibgen.format import FormatError, definition_path, write_definition
    from fibgen.runtime.workloads import WorkloadError, parse_grid, write_synthetic

    try:
        grid = parse_grid(args.axes)
    except WorkloadError as exc:
        _eprint(f"error: {exc}")
        return EXIT_USAGE
    if not os.path.exists(args.definitions):
        _eprint(f"error: no such file or directory: {args.definitions}")
        return EXIT_FAIL
    found = _from_fidef(args.definition, args.definitions)
    if found is None:
        if not (Path(args.definitions) / "definitions").is_dir():
            _eprint(f"error: {args.definitions} holds no .fidef files and no definitions/ folder")
            return EXIT_FAIL
        found = _from_dataset(args.definition, args.definitions)
    if isinstance(found, str):
        _eprint(found)
        return EXIT_FAIL
    spec, op_type, model = found
    root = Path(args.output or os.environ.get("FIBGEN_DATASET_PATH") or ".")
    try:
        result = write_synthetic(root, op_type, spec, grid, replace=args.replace, seed=args.seed)
        # The dataset then holds what flashinfer-bench needs to load the workloads.
        if not definition_path(root, op_type, model.name).exists():
            write_definition(root, model)
    except (WorkloadError, FormatError) as exc:
        _eprint(f"error: {exc}")
        return EXIT_FAIL
    except OSError as exc:
        _eprint(f"error: cannot write into {root}: {exc}")
        return EXIT_FAIL
    kept = f"; kept {result.kept} existing" if result.kept else ""
    print(f"wrote {result.added} workload(s) of {spec.name} to {result.path}{kept}")
    return EXIT_OK
