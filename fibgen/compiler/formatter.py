"""`fibgen fmt`: rewrite `.fidef` files in canonical form, never changing what they mean."""

from __future__ import annotations

import difflib
from typing import TextIO

from fibgen.compiler import discover, ir, read_source
from fibgen.compiler.diagnostics import Diagnostic, Sources, error, has_errors, render_all


def _parse(text: str, path: str) -> tuple[ir.SourceFile | None, list, list[Diagnostic]]:
    from fibgen.compiler.lower import lower_with_comments
    from fibgen.compiler.parser import parse_with_comments

    tree, diags, comments = parse_with_comments(text, path)
    if tree is None:
        return None, comments, diags
    sf, more, inner = lower_with_comments(tree, path)
    comments = sorted(comments + inner)
    diags = diags + more
    return (None if has_errors(diags) else sf), comments, diags


def format_text(text: str, path: str) -> tuple[str | None, list[Diagnostic]]:
    """The canonical text of a file, or None with diagnostics when it does not parse."""
    from fibgen.compiler.printer import print_file

    sf, comments, diags = _parse(text, path)
    if sf is None:
        return None, diags
    new = print_file(sf, comments, text)
    # The printer must never change meaning, and its output must be its own canonical form
    # (`fmt` then `fmt --check` passes): re-parse, compare and print again before anything is
    # written.
    again, again_comments, more = _parse(new, path)
    if again is None or again != sf:
        return None, diags + more + [_internal("formatting would change this file's meaning")]
    if print_file(again, again_comments, new) != new:
        return None, diags + [_internal("formatting this file again would change it")]
    return new, diags


def _internal(what: str) -> Diagnostic:
    return error(
        f"internal error: {what}; left as is",
        None,
        help="please report this file to the fibgen developers",
    )


def format_paths(paths: list[str], *, check: bool, out: TextIO, err: TextIO) -> int:
    """Format files in place (or, with check, report those that are not formatted)."""
    from pathlib import Path

    from fibgen.fsutil import atomic_write

    inputs, diags = discover(paths)
    sources = Sources()
    unformatted: list[str] = []
    failed = bool(diags)
    for item in inputs:
        try:
            text = read_source(item.path)
        except (OSError, UnicodeDecodeError) as exc:
            diags.append(error(f"cannot read {item.path}: {exc}", None))
            failed = True
            continue
        sources.add(item.path, text)
        new, file_diags = format_text(text, item.path)
        diags.extend(file_diags)
        if new is None:
            failed = True
            continue
        if new == text:
            continue
        unformatted.append(item.path)
        if check:
            out.writelines(
                difflib.unified_diff(
                    text.splitlines(keepends=True),
                    new.splitlines(keepends=True),
                    fromfile=f"a/{item.path}",
                    tofile=f"b/{item.path}",
                )
            )
        else:
            atomic_write(Path(item.path), new)
    rendered = render_all(diags, sources)
    if rendered:
        err.write(rendered)
    if check and unformatted:
        err.write(
            f"error: {len(unformatted)} file(s) not formatted: {', '.join(unformatted)}\n"
            "  = help: run `fibgen fmt` on them\n"
        )
        return 1
    if not check and unformatted:
        out.write(f"formatted {len(unformatted)} file(s)\n")
    elif not unformatted and not failed:
        out.write(f"{len(inputs)} file(s) already formatted\n")
    return 1 if failed else 0
