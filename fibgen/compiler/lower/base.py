"""What every lowering method shares: spans, diagnostics, embedded Python expressions."""

from __future__ import annotations

import ast
from typing import Any

from lark import Transformer
from lark.tree import Meta

from fibgen.compiler import ir
from fibgen.compiler.diagnostics import Diagnostic, error
from fibgen.compiler.lower.text import PosToken
from fibgen.compiler.pysyntax import PythonSyntaxError, parse_python


class Stmt:
    """A family statement on its way into a Family: the field it sets and its value."""

    __slots__ = ("field", "value", "span", "keyword")

    def __init__(self, field: str, value: Any, span: ir.Span, keyword: str) -> None:
        self.field = field
        self.value = value
        self.span = span
        self.keyword = keyword


class LowerBase(Transformer):
    """What every lowering method uses: spans in this file, its diagnostics, embedded Python."""

    def __init__(self, path: str) -> None:
        super().__init__(visit_tokens=False)
        self.path = path
        self.diagnostics: list[Diagnostic] = []
        self.comments: list[tuple[int, int, str]] = []  # those the grammar cannot see

    # ------------------------------------------------------------------ helpers
    def _span(self, meta: Meta) -> ir.Span:
        if getattr(meta, "empty", True):
            return ir.Span(file=self.path, line=0, column=0, end_line=0, end_column=0)
        return ir.Span(
            file=self.path,
            line=meta.line,
            column=meta.column,
            end_line=meta.end_line,
            end_column=meta.end_column,
        )

    def _tok_span(self, tok: PosToken) -> ir.Span:
        return ir.Span(
            file=self.path,
            line=tok.line,
            column=tok.column,
            end_line=tok.end_line,
            end_column=tok.end_column,
        )

    def _at(self, line: int, column: int, width: int = 1) -> ir.Span:
        """A span on one line of this file."""
        return ir.Span(
            file=self.path, line=line, column=column, end_line=line, end_column=column + width
        )

    def _error(self, message: str, span: ir.Span, help: str | None = None) -> None:
        self.diagnostics.append(error(message, span, help))

    def _encodable(self, value: str, what: str, span: ir.Span) -> bool:
        """Whether ``value`` can be written to a UTF-8 file; an error at ``span`` if not."""
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            self._error(
                f"{what} holds the lone surrogate {value[exc.start]!r}, which no UTF-8 file "
                "can hold",
                span,
                help="write the character itself, or its \\U00XXXXXX escape",
            )
            return False
        return True

    def _expr(self, tok: PosToken) -> ir.Expr:
        text = str(tok).strip()
        span = self._tok_span(tok)
        span = span.model_copy(update={"end_column": span.column + len(text)})
        try:
            parse_python(text, "eval")
        except PythonSyntaxError as exc:
            line, col = span.line, span.column + max(0, (exc.offset or 1) - 1)
            if exc.lineno is not None and exc.lineno > 1:  # a statement over several lines
                line, col = span.line + exc.lineno - 1, max(1, exc.offset or 1)
            self._error(
                f"not a Python expression: {exc.msg}",
                self._at(line, col),
                help=f"in `{text if len(text) <= 80 else text[:77] + '...'}`",
            )
        return ir.Expr(text=text, span=span)

    def _call_args(self, tok: PosToken, what: str) -> ast.Call | None:
        text = str(tok)
        try:
            node = parse_python("f" + text, "eval").body
        except PythonSyntaxError as exc:
            col = tok.column + max(0, (exc.offset or 2) - 2)
            self._error(f"{what} is not valid Python: {exc.msg}", self._at(tok.line, col))
            return None
        assert isinstance(node, ast.Call)
        return node

    def _arg_span(self, tok: PosToken, node: ast.expr | ast.keyword) -> ir.Span:
        # Offsets inside the parenthesized text, shifted by the 'f' prefix used to parse it.
        line = tok.line + node.lineno - 1
        col = (tok.column + node.col_offset - 1) if node.lineno == 1 else node.col_offset + 1
        end = col + max(1, (node.end_col_offset or node.col_offset + 1) - node.col_offset)
        return self._at(line, col, end - col)

    def _params(self, tok: PosToken) -> tuple[ir.ApiParam, ...]:
        text = str(tok)
        source = f"def f{text}: pass"
        try:
            fn = parse_python(source).body[0]
        except PythonSyntaxError as exc:
            col = tok.column + max(0, (exc.offset or 6) - 6)
            self._error(
                f"not a Python parameter list: {exc.msg}",
                self._at(tok.line, col),
                help="write it as in a `def`, e.g. `(input, weight, eps=1e-6, out=None)`",
            )
            return ()
        assert isinstance(fn, ast.FunctionDef)
        a = fn.args
        out: list[ir.ApiParam] = []
        positional = a.posonlyargs + a.args
        defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
        for arg, default in zip(positional, defaults):
            out.append(self._param(tok, source, arg, "positional", default))
        if a.vararg:
            out.append(self._param(tok, source, a.vararg, "var_positional", None))
        for arg, default in zip(a.kwonlyargs, a.kw_defaults):
            out.append(self._param(tok, source, arg, "keyword_only", default))
        if a.kwarg:
            out.append(self._param(tok, source, a.kwarg, "var_keyword", None))
        return tuple(out)

    def _param(
        self, tok: PosToken, source: str, arg: ast.arg, kind: ir.ParamKind, default: ast.expr | None
    ) -> ir.ApiParam:
        col = tok.column + arg.col_offset - 5  # 'def f' prefix
        span = self._at(tok.line, col, len(arg.arg))
        return ir.ApiParam(
            name=arg.arg,
            kind=kind,
            default=None if default is None else _segment(source, default),
            span=span,
        )

    def _int(self, tok: PosToken) -> int:
        text = str(tok)
        if len(text) > _MAX_DIGITS:
            # Python's int() refuses over 4,300 digits; no size or index comes near this.
            self._error(
                f"integer literal of {len(text.lstrip('+-'))} digits is too long",
                self._tok_span(tok),
                help=f"integers in a .fidef have at most {_MAX_DIGITS} digits",
            )
            return 0
        return int(text)


def _segment(source: str, node: ast.expr) -> str:
    # Keep a default as written (`1e-6`, not `1e-06`): it is shown to users in generated code.
    if source.isascii() and "\n" not in source and "\r" not in source:
        # What get_source_segment gives for one line of ASCII (offsets count UTF-8 bytes),
        # without splitting the source into lines on every call: a parameter list of forty
        # defaults spent most of its lowering there.
        return source[node.col_offset : node.end_col_offset] or ast.unparse(node)
    return ast.get_source_segment(source, node) or ast.unparse(node)


_MAX_DIGITS = 1000
