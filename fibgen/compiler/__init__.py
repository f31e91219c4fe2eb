"""The `.fidef` compiler: source files → checked IR (`ir.Module`) plus diagnostics."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fibgen.compiler.diagnostics import Diagnostic, Sources, error, has_errors
from fibgen.fsutil import PathRefused, confined, regular_file

if TYPE_CHECKING:  # the IR (pydantic) is imported when something is compiled, not before
    from fibgen.compiler import ir
    from fibgen.format.fi_apis import TracedApis


@dataclass(frozen=True)
class CompileResult:
    """What one compilation produced: the module (None on errors), diagnostics, sources."""

    module: ir.Module | None
    diagnostics: list[Diagnostic]
    sources: Sources

    @property
    def ok(self) -> bool:
        return self.module is not None


@dataclass(frozen=True)
class _Input:
    path: str  # as shown in diagnostics (what the user typed, joined with the file)
    stable: str  # as recorded in generated files (no absolute paths)


def discover(paths: list[str]) -> tuple[list[_Input], list[Diagnostic]]:
    """Expand directories into their `.fidef` files, sorted, with stable display names."""
    found: list[_Input] = []
    diags: list[Diagnostic] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            base = p.resolve().parent
            for f in sorted(p.rglob("*.fidef")):
                shown = os.path.join(raw, str(f.relative_to(p)))
                try:
                    # Links are followed inside the folder only, and what is read must be a
                    # file: a FIFO would block the read (Note [confined paths] in fsutil.py).
                    confined(p, f, "the folder")
                    regular_file(f)
                except PathRefused as exc:
                    diags.append(error(f"cannot read {shown}: {exc.reason}", None))
                    continue
                if f.is_symlink() and not f.exists():
                    target = os.readlink(f)
                    diags.append(
                        error(
                            f"cannot read {shown}: it is a symbolic link to {target}, which "
                            "does not exist",
                            None,
                        )
                    )
                    continue
                found.append(_Input(shown, f.resolve().relative_to(base).as_posix()))
        elif p.is_file():
            found.append(_Input(raw, p.name))
        elif p.exists():
            diags.append(error(f"cannot read {raw}: not a regular file", None))
        else:
            diags.append(error(f"no such file or directory: {raw}", None))
    seen: set[str] = set()
    unique = []
    for item in found:
        key = str(Path(item.path).resolve())
        if key not in seen:
            seen.add(key)
            unique.append(item)
    return unique, diags


def read_source(path: str) -> str:
    """Read a .fidef file byte-exactly (no newline translation: references keep their '\\r')."""
    with open(path, encoding="utf-8", newline="") as fh:
        return fh.read()


def compile_sources(
    items: list[tuple[str, str, str]],
    entry_points: Callable[[], TracedApis | None] | None = None,
) -> CompileResult:
    """Compile (display path, stable path, text) triples. ``entry_points`` gives FlashInfer's
    traced entry points (None where they are unknown), against which `unroutable` paths are
    checked; it is called only when the files declare some."""
    from fibgen.compiler import ir
    from fibgen.compiler.checks import Checker
    from fibgen.compiler.lower import lower
    from fibgen.compiler.parser import parse

    sources = Sources()
    diags: list[Diagnostic] = []
    files: list[ir.SourceFile] = []
    for path, stable, text in items:
        sources.add(path, text)
        tree, parse_diags = parse(text, path)
        diags.extend(parse_diags)
        if tree is None:
            continue
        sf, lower_diags = lower(tree, path)
        diags.extend(lower_diags)
        # Generated files name their source without absolute paths: keep the stable one.
        files.append(sf.model_copy(update={"path": stable}))
    checker = Checker(entry_points)
    definitions = checker.run(files)
    diags.extend(checker.diagnostics)
    if has_errors(diags):
        return CompileResult(None, diags, sources)
    module = ir.Module(files=tuple(files), definitions=tuple(definitions))
    return CompileResult(module, diags, sources)


def compile_paths(
    paths: list[str], entry_points: Callable[[], TracedApis | None] | None = None
) -> CompileResult:
    """Compile every `.fidef` file under the given files and directories (``entry_points``:
    as ``compile_sources``)."""
    inputs, diags = discover(paths)
    items = []
    for item in inputs:
        try:
            text = read_source(item.path)
        except (OSError, UnicodeDecodeError) as exc:
            diags.append(error(f"cannot read {item.path}: {exc}", None))
            continue
        items.append((item.path, item.stable, text))
    result = compile_sources(items, entry_points)
    if diags:
        all_diags = diags + result.diagnostics
        return CompileResult(None, all_diags, result.sources)
    return result
