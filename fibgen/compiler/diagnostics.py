"""Compiler-style diagnostics: what went wrong, where, and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # diagnostics are imported on paths that must not pay for pydantic
    from fibgen.compiler.ir import Span

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Diagnostic:
    severity: Severity
    message: str
    span: Span | None
    help: str | None = None
    notes: tuple[str, ...] = field(default=())

    def sort_key(self) -> tuple:
        if self.span is None:
            return ("", 0, 0, self.message)
        return (self.span.file, self.span.line, self.span.column, self.message)


def error(message: str, span: Span | None, help: str | None = None) -> Diagnostic:
    """Make an error diagnostic."""
    return Diagnostic("error", message, span, help)


def warning(message: str, span: Span | None, help: str | None = None) -> Diagnostic:
    """Make a warning diagnostic."""
    return Diagnostic("warning", message, span, help)


class Sources:
    """The text of every file read in a run, to quote lines in diagnostics."""

    def __init__(self) -> None:
        self._lines: dict[str, list[str]] = {}
        self._shown: dict[tuple[str, int], str] = {}

    def add(self, path: str, text: str) -> None:
        # Lines as the lexer counts them: at '\n' only (splitlines also splits at '\x0c',
        # '\u2028' and others, which a string may hold).
        self._lines[path] = [line.removesuffix("\r") for line in text.split("\n")]

    def line(self, path: str, line: int) -> str | None:
        lines = self._lines.get(path)
        if lines is None or not 1 <= line <= len(lines):
            return None
        return lines[line - 1]

    def shown(self, path: str, line: int) -> str | None:
        """A line as diagnostics quote it (tabs expanded, control characters made visible),
        prepared once: a line that holds many errors is scanned once, not once per error."""
        key = (path, line)
        if key not in self._shown:
            text = self.line(path, line)
            if text is None:
                return None
            self._shown[key] = _visible(text.expandtabs(4).rstrip())
        return self._shown[key]


_MAX_SHOWN = 120


def _visible(line: str) -> str:
    """A quoted source line as a terminal can show it: a control character (a NUL, a raw
    carriage return) becomes its one-column symbol, so the caret below still lines up."""
    if line.isprintable():
        return line
    return "".join(
        (
            ch
            if ch.isprintable()
            else chr(0x2400 + ord(ch)) if ord(ch) < 0x20 else "\u2421" if ch == "\x7f" else "\ufffd"
        )
        for ch in line
    )


def render(diag: Diagnostic, sources: Sources | None = None) -> str:
    """Render one diagnostic like a compiler: header, location, quoted line, caret, help."""
    out = [f"{diag.severity}: {diag.message}"]
    span = diag.span
    if span is not None and span.line > 0:
        out.append(f" --> {span.file}:{span.line}:{span.column}")
        text = sources.shown(span.file, span.line) if sources else None
        if text is not None:
            gutter = " " * len(str(span.line))
            column = span.column
            if len(text) > _MAX_SHOWN:
                # Very long lines (an instance with many tags) are cut around the column.
                start = max(0, column - 1 - _MAX_SHOWN // 3)
                window = text[start : start + _MAX_SHOWN]
                text = (
                    ("..." if start else "")
                    + window
                    + ("..." if start + _MAX_SHOWN < len(text) else "")
                )
                column = column - start + (3 if start else 0)
            if span.end_line == span.line and span.end_column > span.column:
                width = span.end_column - span.column
            else:
                width = max(1, len(text) - column + 1)
            width = max(1, min(width, max(1, len(text) - column + 1)))
            out.append(f"{gutter} |")
            out.append(f"{span.line} | {text}")
            out.append(f"{gutter} | {' ' * (column - 1)}{'^' * width}")
    elif span is not None:
        out.append(f" --> {span.file}")
    for note in diag.notes:
        out.append(f"  = note: {note}")
    if diag.help:
        out.append(f"  = help: {diag.help}")
    return "\n".join(out)


def render_all(diags: list[Diagnostic], sources: Sources | None = None) -> str:
    """Render diagnostics sorted by position, with a summary line."""
    ordered = sorted(diags, key=Diagnostic.sort_key)
    blocks = [render(d, sources) for d in ordered]
    n_err = sum(d.severity == "error" for d in diags)
    n_warn = len(diags) - n_err
    parts = []
    if n_err:
        parts.append(f"{n_err} error{'s' if n_err != 1 else ''}")
    if n_warn:
        parts.append(f"{n_warn} warning{'s' if n_warn != 1 else ''}")
    if parts:
        blocks.append(" and ".join(parts) + " emitted")
    return "\n\n".join(blocks) + "\n" if blocks else ""


def has_errors(diags: list[Diagnostic]) -> bool:
    """True when any diagnostic is an error."""
    return any(d.severity == "error" for d in diags)
