"""`fibgen workloads`: synthetic workloads for a definition over a grid of var-axis values."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Union

from fibgen.cli.console import EXIT_FAIL, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:  # torch and pydantic load when the command runs, not when the CLI starts
    from fibgen.format import Definition
    from fibgen.runtime.inputs import InputSpec

# What the command needs of a definition: its input spec, op_type, dataset model and sidecar.
_Found = tuple["InputSpec", str, "Definition", dict]


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
        default=None,
        metavar="DIR",
        help=".fidef files or folders, or a dataset holding definitions/ "
        "(default: fibgen's built-in catalogue)",
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
    from fibgen.codegen.bench_extras import emit_bench_extras
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
    sidecar = f"definitions/{defn.op_type}/{defn.name}.fibgen"
    extras = next(
        (json.loads(f.text) for f in emit_bench_extras(result.module) if f.path == sidecar), {}
    )
    return InputSpec.from_ir(defn, family), defn.op_type, model, extras


def _from_dataset(name: str, path: str) -> Union[_Found, str]:
    from fibgen.format import FormatError, load_definition_files
    from fibgen.format.dataset import read_extras
    from fibgen.runtime.workloads import input_spec

    try:
        definitions = load_definition_files(path)
        if name not in definitions:
            return _unknown(name, sorted(definitions), f"{path}/definitions")
        file, defn = definitions[name]
        extras = read_extras(file)
    except FormatError as exc:
        return f"error: {exc}"
    return input_spec(defn, extras.get("hints")), defn.op_type, defn, extras


def _from_builtin(name: str) -> Union[_Found, str]:
    from fibgen.format import FormatError, load_definition
    from fibgen.format.dataset import read_extras
    from fibgen.paths import builtin_definition_file, catalogue_root
    from fibgen.runtime.workloads import input_spec

    file = builtin_definition_file(name)
    if file is None:
        known = sorted(p.stem for p in (catalogue_root() / "definitions").glob("*/*.json"))
        return _unknown(name, known, "fibgen's built-in catalogue")
    try:
        defn = load_definition(file)
        extras = read_extras(file)
    except FormatError as exc:
        return f"error: {exc}"
    return input_spec(defn, extras.get("hints")), defn.op_type, defn, extras


def _write_definition(root: Path, model: "Definition", extras: dict) -> str | None:
    """Put the definition and its sidecar beside the workloads; a note when the dataset's differ."""
    from fibgen.format import load_definition_files, semantic_equal, write_definition
    from fibgen.format.dataset import read_extras

    existing = load_definition_files(root).get(model.name)
    if existing is None:
        write_definition(root, model, extras)
        return None
    path, defn = existing
    notes = []
    if not semantic_equal(defn, model):
        notes.append("its definition differs from the one the workloads were made from")
    if extras and not read_extras(path):
        write_definition(root, defn, extras)
    elif extras and read_extras(path) != extras:
        notes.append("its sidecar's tolerance or hints differ")
    if notes:
        return f"note: kept {path} as it is: " + "; ".join(notes)
    return None


def cmd_workloads(args: argparse.Namespace) -> int:
    """Run `fibgen workloads`."""
    from fibgen.format import FormatError
    from fibgen.format.models import NAME_RULE, name_problem
    from fibgen.runtime.workloads import WorkloadError, parse_grid, write_synthetic

    # The name becomes a file name under the dataset (Note [safe names]).
    problem = name_problem(args.definition)
    if problem is not None:
        _eprint(f"error: DEFINITION {args.definition!r} {problem}; {NAME_RULE}")
        return EXIT_USAGE
    try:
        grid = parse_grid(args.axes)
    except WorkloadError as exc:
        _eprint(f"error: {exc}")
        return EXIT_USAGE
    if args.definitions is None:
        found: Union[_Found, str, None] = _from_builtin(args.definition)
    elif not os.path.exists(args.definitions):
        _eprint(f"error: no such file or directory: {args.definitions}")
        return EXIT_FAIL
    else:
        found = _from_fidef(args.definition, args.definitions)
        if found is None:
            if not (Path(args.definitions) / "definitions").is_dir():
                _eprint(
                    f"error: {args.definitions} holds no .fidef files and no definitions/ folder"
                )
                return EXIT_FAIL
            found = _from_dataset(args.definition, args.definitions)
    if isinstance(found, str):
        _eprint(found)
        return EXIT_FAIL
    spec, op_type, model, extras = found
    root = Path(args.output or os.environ.get("FIBGEN_DATASET_PATH") or ".")
    try:
        # Workloads first: a bad grid is found before anything is written. Then the
        # definition, without which flashinfer-bench refuses the workloads.
        result = write_synthetic(root, op_type, spec, grid, replace=args.replace, seed=args.seed)
        note = _write_definition(root, model, extras)
    except (WorkloadError, FormatError) as exc:
        _eprint(f"error: {exc}")
        return EXIT_FAIL
    except OSError as exc:
        _eprint(f"error: cannot write into {root}: {exc}")
        return EXIT_FAIL
    if note:
        _eprint(note)
    kept = f"; kept {result.kept} existing" if result.kept else ""
    print(f"wrote {result.added} workload(s) of {spec.name} to {result.path}{kept}")
    return EXIT_OK
