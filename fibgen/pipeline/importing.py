"""`fibgen import`: flashinfer-bench definitions to `.fidef` families, checked by a rebuild.

The importer (`fibgen.compiler.importer`) turns flashinfer-bench definitions into `.fidef`
families; whether those families mean what the JSON meant is only known after compiling them
and dumping each definition as the JSON target does, so that check lives here, above both.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from fibgen.compiler import ir
from fibgen.compiler.importer import family_of, group_definitions
from fibgen.fsutil import atomic_write


def _load(inputs: list[str], err: TextIO) -> list | None:
    from fibgen.format.errors import FormatError
    from fibgen.format.jsonio import load_definition

    files: list[Path] = []
    for raw in inputs:
        p = Path(raw)
        if p.is_dir():
            files.extend(sorted(p.rglob("*.json")))
        elif p.is_file():
            files.append(p)
        else:
            err.write(f"error: no such file or directory: {raw}\n")
            return None
    defs = []
    failed = False
    names: dict[str, Path] = {}
    for f in files:
        try:
            d = load_definition(f)
        except FormatError as exc:
            err.write(f"error: {exc}\n")
            failed = True
            continue
        if d.name in names:
            err.write(f"error: {f}: definition `{d.name}` is also defined in {names[d.name]}\n")
            failed = True
            continue
        names[d.name] = f
        defs.append(d)
    if not files:
        err.write(f"error: no definition JSON found in {', '.join(inputs)}\n")
        return None
    return None if failed else defs


def _families(defs: list, output: Path) -> tuple[dict[str, str], int, ir.Module | str]:
    """The `.fidef` text per file of ``defs`` (one file per op_type), how many families, and
    the module they compile to, checked to build every definition again; or why not."""
    from fibgen.compiler import compile_sources
    from fibgen.compiler.diagnostics import render_all
    from fibgen.compiler.printer import print_file
    from fibgen.format.jsonio import semantic_equal

    groups = group_definitions(defs)
    by_op: dict[str, list[ir.Family]] = {}
    for g in groups:
        by_op.setdefault(g.members[0].op_type, []).append(family_of(g))
    texts = {
        f"{op}.fidef": print_file(ir.SourceFile(path=f"{op}.fidef", families=tuple(fams)))
        for op, fams in sorted(by_op.items())
    }
    result = compile_sources([(str(output / n), n, t) for n, t in texts.items()])
    if result.module is None:
        return (
            texts,
            len(groups),
            (
                render_all(result.diagnostics, result.sources)
                + "error: the imported families do not compile"
            ),
        )
    from fibgen.codegen.definition_json import definition_dict

    built = {d.name: definition_dict(d) for d in result.module.definitions}
    bad = [d.name for d in defs if d.name not in built or not semantic_equal(built[d.name], d)]
    if bad:
        return (
            texts,
            len(groups),
            (f"error: {len(bad)} definition(s) would not round-trip: {', '.join(bad[:5])}"),
        )
    return texts, len(groups), result.module


def dataset_definition(root: str | Path, name: str) -> ir.Module | str:
    """A module holding the definition ``name`` of the dataset at ``root`` (its JSON, imported
    as `fibgen import` does and checked the same way), or an error message.

    For the commands that take `.fidef` files or a dataset (`scaffold-solution
    --definitions DATASET`), as `fibgen workloads` does.
    """
    import difflib

    from fibgen.format import FormatError, load_definition_files

    try:
        found = load_definition_files(root)
    except FormatError as exc:
        return f"error: {exc}"
    if name not in found:
        close = difflib.get_close_matches(name, sorted(found), n=3)
        hint = f"\n  = help: did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""
        return f"error: no definition named `{name}` in {Path(root) / 'definitions'}{hint}"
    path, defn = found[name]
    _, _, module = _families([defn], Path(root))
    if isinstance(module, str):
        return f"{module}\n  = note: {path} cannot be used as a definition here"
    return module


def import_paths(inputs: list[str], output: Path, *, force: bool, out: TextIO, err: TextIO) -> int:
    """Import definition JSON files into `.fidef` files under `output`, one per op_type."""
    if output.exists() and not output.is_dir():
        err.write(f"error: -o {output} is a file; give the folder to write the .fidef files in\n")
        return 1
    defs = _load(inputs, err)
    if defs is None:
        return 1
    # Verify before writing anything: the written files must compile back to the input.
    texts, n_families, module = _families(defs, output)
    if isinstance(module, str):
        err.write(f"{module}; nothing was written\n")
        return 1
    existing = [n for n in texts if (output / n).exists()]
    if existing and not force:
        err.write(
            f"error: {output} already has {', '.join(existing)}; nothing was written\n"
            "  = help: pass --force to overwrite them\n"
        )
        return 1
    try:
        for name, text in texts.items():
            atomic_write(output / name, text)
    except OSError as exc:
        err.write(f"error: cannot write into {output}: {exc.strerror or exc}\n")
        return 1
    out.write(
        f"imported {len(defs)} definitions as {n_families} families into "
        f"{len(texts)} files in {output}\n"
    )
    return 0
