"""Where `fibgen workloads` finds its definition, and how the definition joins the dataset.

A definition is found by name in `.fidef` sources (compiled here, with the dataset JSON and
sidecar the code generator would write for it), in a dataset's definitions/, or in fibgen's
built-in catalogue; what writing workloads needs of it is its input spec, op_type, dataset
model and sidecar. Errors come back as messages for the command line, which prints them.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:  # torch and pydantic load when the command runs, not when the CLI starts
    from fibgen.format import Definition
    from fibgen.runtime.inputs.make import InputSpec

# What the command needs of a definition: its input spec, op_type, dataset model and sidecar.
_Found = tuple["InputSpec", str, "Definition", dict]


def definition_for_workloads(name: str, definitions: str | None) -> Union[_Found, str]:
    """The definition ``name`` with what writing its workloads needs; else an error message.

    ``definitions``: `.fidef` files or folders, or a dataset holding definitions/; None is
    fibgen's built-in catalogue.
    """
    if definitions is None:
        return _from_builtin(name)
    if not os.path.exists(definitions):
        return f"error: no such file or directory: {definitions}"
    else:
        found = _from_fidef(name, definitions)
        if found is None:
            if not (Path(definitions) / "definitions").is_dir():
                return f"error: {definitions} holds no .fidef files and no definitions/ folder"
            found = _from_dataset(name, definitions)
    return found


def _unknown(name: str, known: list[str], where: str) -> str:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"\n  = help: did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""
    return f"error: no definition named `{name}` in {where}{hint}"


def _from_fidef(name: str, path: str) -> Union[_Found, str, None]:
    """The definition from `.fidef` sources; an error message; None when there are none."""
    from fibgen.compiler import compile_paths, discover
    from fibgen.compiler.diagnostics import render_all

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
    # Found: what makes its inputs (torch) is imported only now.
    from fibgen.codegen.definition_json import definition_dict
    from fibgen.codegen.python.bench_extras import emit_bench_extras
    from fibgen.format import Definition
    from fibgen.runtime.inputs.make import InputSpec

    family = next(f for f in result.module.families() if f.name == defn.family)
    model = Definition.model_validate(definition_dict(defn))
    sidecar = f"definitions/{defn.op_type}/{defn.name}.fibgen"
    extras: dict = next(
        (json.loads(f.text) for f in emit_bench_extras(result.module) if f.path == sidecar), {}
    )
    return InputSpec.from_ir(defn, family), defn.op_type, model, extras


def _from_dataset(name: str, path: str) -> Union[_Found, str]:
    from fibgen.format import FormatError, load_definition_files
    from fibgen.format.dataset import read_extras

    try:
        definitions = load_definition_files(path)
        if name not in definitions:
            return _unknown(name, sorted(definitions), f"{path}/definitions")
        file, defn = definitions[name]
        extras = read_extras(file, root=path)
    except FormatError as exc:
        return f"error: {exc}"
    from fibgen.curation.workloads import input_spec

    return input_spec(defn, extras.get("hints")), defn.op_type, defn, extras


def _from_builtin(name: str) -> Union[_Found, str]:
    from fibgen.paths import builtin_definition_file, builtin_definition_names

    # Looked up before torch (input_spec) is imported: a mistyped name is answered at once.
    file = builtin_definition_file(name)
    if file is None:
        return _unknown(name, sorted(builtin_definition_names()), "fibgen's built-in catalogue")
    from fibgen.curation.workloads import input_spec
    from fibgen.format import FormatError, load_definition
    from fibgen.format.dataset import read_extras

    try:
        defn = load_definition(file)
        extras = read_extras(file)
    except FormatError as exc:
        return f"error: {exc}"
    return input_spec(defn, extras.get("hints")), defn.op_type, defn, extras


def add_definition(root: Path, model: "Definition", extras: dict) -> str | None:
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
    if extras and not read_extras(path, root=root):
        write_definition(root, defn, extras)
    elif extras and read_extras(path, root=root) != extras:
        notes.append("its sidecar's tolerance or hints differ")
    if notes:
        return f"note: kept {path} as it is: " + "; ".join(notes)
    return None
