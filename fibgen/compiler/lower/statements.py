"""Lowering of the top level and of a family's one-line statements: op_type, api, returns..."""

from __future__ import annotations

import ast
import math
from typing import Any

from lark import Token, v_args
from lark.tree import Meta

from fibgen.compiler import ir
from fibgen.compiler.lower.base import LowerBase, Stmt
from fibgen.compiler.lower.text import PosToken, dedent_block
from fibgen.compiler.pysyntax import PythonSyntaxError, literal_string
from fibgen.format.tolerances import tolerance_problem


@v_args(meta=True)
class FamilyLowering(LowerBase):
    """The file, its families and dispatch groups, and each one-line family statement."""

    # ------------------------------------------------------------------ top level
    def start(self, meta: Meta, items: list) -> ir.SourceFile:
        families = tuple(i for i in items if isinstance(i, ir.Family))
        dispatches = tuple(i for i in items if isinstance(i, ir.DispatchGroup))
        unroutables = tuple(i for i in items if isinstance(i, ir.Unroutable))
        return ir.SourceFile(
            path=self.path,
            families=families,
            dispatches=dispatches,
            unroutables=unroutables,
            span=self._span(meta),
        )

    def family(self, meta: Meta, children: list) -> ir.Family:
        name_tok, *stmts = children
        fields: dict[str, Any] = {}
        seen: dict[str, Stmt] = {}
        for st in stmts:
            if st.field in ("dtype_params", "effects"):
                # Several `dtype` statements declare several parameters; likewise `effect`.
                fields[st.field] = fields.get(st.field, ()) + st.value
                continue
            if st.field in seen:
                self._error(
                    f"`{st.keyword}` given twice in family `{name_tok}`",
                    st.span,
                    help=f"the first is at {seen[st.field].span}",
                )
                continue
            seen[st.field] = st
            if st.field == "reference":
                fields["reference"], fields["reference_span"] = st.value, st.span
            elif st.field == "name_template":
                fields["name_template"], fields["name_template_span"] = st.value, st.span
            else:
                fields[st.field] = st.value
        if "op_type" not in fields:
            self._error(
                f"family `{name_tok}` has no `op_type`",
                self._tok_span(name_tok),
                help="add a line `op_type NAME`, e.g. `op_type rmsnorm`",
            )
            fields["op_type"] = str(name_tok)
        # A bare dtype name that is one of the family's dtype parameters refers to it.
        params = {dp.name for dp in fields.get("dtype_params", ())}
        if params:
            for key in ("inputs", "outputs"):
                fields[key] = tuple(
                    (
                        t.model_copy(update={"dtype": t.dtype.model_copy(update={"kind": "param"})})
                        if t.dtype.kind == "concrete" and t.dtype.name in params
                        else t
                    )
                    for t in fields.get(key, ())
                )
        return ir.Family(
            name=str(name_tok),
            name_span=self._tok_span(name_tok),
            span=self._span(meta),
            **fields,
        )

    # ------------------------------------------------------------------ family statements
    def op_type_stmt(self, meta: Meta, c: list) -> Stmt:
        return Stmt("op_type", str(c[0]), self._span(meta), "op_type")

    def description_stmt(self, meta: Meta, c: list) -> Stmt:
        return Stmt("description", c[0], self._span(meta), "description")

    def tags_stmt(self, meta: Meta, c: list) -> Stmt:
        return Stmt("tags", c[0], self._span(meta), "tags")

    def name_stmt(self, meta: Meta, c: list) -> Stmt:
        return Stmt("name_template", c[0], self._span(meta), "name")

    def reference_stmt(self, meta: Meta, c: list) -> Stmt:
        return Stmt("reference", c[0], self._span(meta), "reference")

    def requires_stmt(self, meta: Meta, c: list) -> Stmt:
        return Stmt("requires", tuple(str(t) for t in c), self._span(meta), "requires")

    def _signature(self, meta: Meta, c: list, keyword: str) -> Stmt:
        path, params_tok = c
        span = self._span(meta)
        sig = ir.ApiSignature(path=str(path), params=self._params(params_tok), span=span)
        return Stmt(keyword, sig, span, keyword)

    def api_stmt(self, meta: Meta, c: list) -> Stmt:
        return self._signature(meta, c, "api")

    def api_none_stmt(self, meta: Meta, c: list) -> Stmt | None:
        word, reason = c
        span = self._span(meta)
        if str(word) != "none":
            self._error(
                f"`api {word}` needs a parameter list",
                span,
                help='write `api pkg.mod.func(params...)`, or `api none "why"` for a family '
                "that stands for no API",
            )
        return Stmt("no_api", reason, span, "api none")

    def plan_stmt(self, meta: Meta, c: list) -> Stmt:
        return self._signature(meta, c, "plan")

    def returns_stmt(self, meta: Meta, c: list) -> Stmt:
        span = self._span(meta)
        names = tuple(str(t) for t in c)
        spans = tuple(self._tok_span(t) for t in c)
        if "none" in names:
            # `returns none`: the API returns None. Spelled as a word, like `api none`, since
            # an empty list would read as a statement left unfinished.
            if len(names) > 1:
                at = names.index("none")
                self._error(
                    "`none` in a list of outputs",
                    spans[at],
                    help="`returns none` stands alone: the API returns None; otherwise name "
                    "the outputs it returns",
                )
            names, spans = (), ()
        value = ir.Returns(names=names, name_spans=spans, span=span)
        return Stmt("returns", value, span, "returns")

    def effect_stmt(self, meta: Meta, c: list) -> Stmt:
        target, expr = c
        span = self._span(meta)
        effect = ir.Effect(
            target=str(target),
            target_span=self._tok_span(target),
            expr=self._expr(expr),
            span=span,
        )
        return Stmt("effects", (effect,), span, "effect")

    def dtype_stmt(self, meta: Meta, c: list) -> Stmt:
        name, *choices = c
        span = self._span(meta)
        value = ir.DtypeParam(name=str(name), choices=tuple(str(x) for x in choices), span=span)
        return Stmt("dtype_params", (value,), span, "dtype")

    def tolerance_stmt(self, meta: Meta, c: list) -> Stmt:
        span = self._span(meta)
        call = self._call_args(c[0], "tolerance")
        values: dict[str, float] = {}
        if call is not None:
            if call.args:
                self._error(
                    "tolerance takes keyword arguments only",
                    span,
                    help="write `tolerance(atol=1e-2, rtol=1e-2, matched=0.99)`",
                )
            for kw in call.keywords:
                if kw.arg not in ("atol", "rtol", "matched"):
                    self._error(
                        f"unknown tolerance `{kw.arg}`",
                        self._arg_span(c[0], kw),
                        help="known: atol, rtol, matched",
                    )
                    continue
                try:
                    value = float(ast.literal_eval(kw.value))
                except (ValueError, TypeError, SyntaxError, OverflowError, RecursionError):
                    value = math.nan
                if not math.isfinite(value):
                    self._error(
                        f"tolerance `{kw.arg}` must be a finite number",
                        self._arg_span(c[0], kw.value),
                    )
                    continue
                problem = tolerance_problem(kw.arg, value)
                if problem is not None:
                    self._error(
                        f"tolerance `{kw.arg}={_written(c[0], kw.value)}` {problem[0]}",
                        self._arg_span(c[0], kw.value),
                        help=problem[1],
                    )
                    continue
                values[kw.arg] = value
        return Stmt("tolerance", ir.Tolerance(span=span, **values), span, "tolerance")

    def tag_list(self, meta: Meta, c: list) -> tuple[str, ...]:
        return tuple(str(t) if isinstance(t, Token) and t.type == "TAG" else t for t in c)

    def string(self, meta: Meta, c: list) -> str:
        # A character reported here is left out of the value, so that the rest of the file is
        # checked as if it were not there (no second error about the same string).
        tok = c[0]
        text = str(tok)
        if "\0" in text:
            self._error(
                "a string cannot hold a NUL byte",
                self._char_span(tok, text.index("\0")),
                help="write it as the escape \\x00 if it is meant",
            )
            text = text.replace("\0", "")
        if tok.type in ("LONG_STRING", "LONG_STRING_SQ"):
            return dedent_block(text[3:-3])
        if "\r" in text:
            self._error(
                "a raw carriage return inside a one-line string",
                self._char_span(tok, text.index("\r")),
                help="write it as the escape \\r, or use a triple-quoted block",
            )
            text = text.replace("\r", "")
        try:
            value = literal_string(text)
        except PythonSyntaxError as exc:
            self._error(f"invalid string: {exc.msg}", self._tok_span(tok))
            return ""
        return value if self._encodable(value, "the string", self._tok_span(tok)) else ""

    def _char_span(self, tok: PosToken, index: int) -> ir.Span:
        """The span of the character at ``index`` of a token's text."""
        before = str(tok)[:index]
        line = tok.line + before.count("\n")
        column = (tok.column + index) if "\n" not in before else index - before.rindex("\n")
        return self._at(line, column)

    def dotted(self, meta: Meta, c: list) -> "_Dotted":
        return _Dotted(".".join(str(t) for t in c), self._span(meta))

    # ------------------------------------------------------------------ unroutable
    def unroutable(self, meta: Meta, c: list) -> ir.Unroutable:
        path, reason = c
        return ir.Unroutable(
            path=str(path), path_span=path.span, reason=reason, span=self._span(meta)
        )

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, meta: Meta, c: list) -> ir.DispatchGroup:
        name, selector, *cases = c
        return ir.DispatchGroup(
            name=str(name),
            name_span=self._tok_span(name),
            selector=str(selector),
            cases=tuple(cases),
            span=self._span(meta),
        )

    def case(self, meta: Meta, c: list) -> ir.DispatchCase:
        value, family, *also = c
        return ir.DispatchCase(
            value=value,
            family=str(family),
            also=tuple(str(f) for f in also),
            span=self._span(meta),
        )


class _Dotted(str):
    """A dotted path as written, with where it is written."""

    span: ir.Span

    def __new__(cls, text: str, span: ir.Span) -> "_Dotted":
        self = super().__new__(cls, text)
        self.span = span
        return self


def _written(tok: PosToken, node: ast.expr) -> str:
    """An argument of a parenthesized token as the file spells it (`-1e-3`, not `-0.001`)."""
    return ast.get_source_segment("f" + str(tok), node) or ast.unparse(node)
