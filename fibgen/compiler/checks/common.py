"""What every check shares: where it reports, hints for names, the family's lookups."""

from __future__ import annotations

import ast
import difflib
import math
from dataclasses import dataclass
from typing import Iterable

from fibgen.compiler import ir
from fibgen.compiler.diagnostics import Diagnostic, error, warning
from fibgen.compiler.pysyntax import PythonSyntaxError, parse_python

# Names a rule, an effect or a derived const may use besides the family's own. (Constraints
# and hints have the narrower list of fibgen.format.expressions.BUILTIN_NAMES.)
EXPR_BUILTINS = frozenset(
    {"len", "int", "float", "min", "max", "abs", "sum", "all", "any", "round", "math", "bool"}
    | {n for n in dir(math) if not n.startswith("_")}
)


def closest(name: str, candidates: Iterable[str]) -> str | None:
    match = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return match[0] if match else None


def did_you_mean(name: str, candidates: Iterable[str], kind: str) -> str:
    # Sets have no stable order across runs; messages must be byte-identical.
    candidates = (
        list(candidates) if not isinstance(candidates, (set, frozenset)) else sorted(candidates)
    )
    close = closest(name, candidates)
    if close:
        return f"did you mean `{close}`?"
    if candidates:
        return f"declared {kind}: {', '.join(candidates)}"
    return f"no {kind} are declared"


def shown_text(text: str) -> str:
    """Text from the source as a message shows it: on one line, control characters escaped."""
    return text if text.isprintable() else repr(text)[1:-1]


def names_in(text: str) -> list[tuple[str, int]]:
    """Free names in an expression with their column offsets (attribute names excluded)."""
    try:
        tree = parse_python(text, "eval")
    except PythonSyntaxError:
        return []
    return [(n.id, n.col_offset) for n in ast.walk(tree) if isinstance(n, ast.Name)]


def sub_span(span: ir.Span, offset: int, width: int) -> ir.Span:
    col = span.column + offset
    return ir.Span(
        file=span.file, line=span.line, column=col, end_line=span.line, end_column=col + width
    )


@dataclass
class FamilyView:
    """Derived lookups for one family, computed once."""

    family: ir.Family
    axes: dict[str, ir.VarAxis | ir.ConstAxis]
    params: dict[str, ir.Param]
    dtype_params: dict[str, ir.DtypeParam]
    inputs: dict[str, ir.Tensor]
    outputs: dict[str, ir.Tensor]


class CheckerBase:
    """Where every check reports: the diagnostics of one run."""

    def __init__(self) -> None:
        self.diagnostics: list[Diagnostic] = []

    def err(self, message: str, span: ir.Span | None, help: str | None = None) -> None:
        self.diagnostics.append(error(message, span, help))

    def warn(self, message: str, span: ir.Span | None, help: str | None = None) -> None:
        self.diagnostics.append(warning(message, span, help))
