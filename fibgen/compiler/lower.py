"""Lower a Lark tree to the family-level IR, one Transformer method per grammar rule.

Lowering checks only what it needs to build well-formed nodes (Python syntax of embedded
expressions and parameter lists, duplicate statements); semantic checks live in checks.py.
"""

from __future__ import annotations

import ast
import math
import re
import textwrap
from typing import Any

from lark import Token, Transformer, Tree, v_args
from lark.tree import Meta

from fibgen.compiler import ir
from fibgen.compiler.diagnostics import Diagnostic, error
from fibgen.compiler.pysyntax import (
    PythonSyntaxError,
    literal_string,
    literal_value,
    parse_python,
    unparse,
)


class _Stmt:
    """A family statement on its way into a Family: the field it sets and its value."""

    __slots__ = ("field", "value", "span", "keyword")

    def __init__(self, field: str, value: Any, span: ir.Span, keyword: str) -> None:
        self.field = field
        self.value = value
        self.span = span
        self.keyword = keyword


def dedent_block(body: str) -> str:
    """The text of a triple-quoted block, exactly as `printer.long_string` wrote it.

    In the block form (opening quotes end their line, closing quotes start theirs) the framing
    newline and the closing line's indentation are dropped and the common indentation of the
    non-blank lines is removed; everything else is kept byte for byte, so references survive
    a round trip with their blank lines, trailing whitespace and final newline.
    """
    lines = body.split("\n")
    if len(lines) == 1:
        return body.strip()
    if lines[0].strip():
        # Text starts on the opening line: keep that line, dedent the rest on its own.
        return (lines[0].strip() + "\n" + textwrap.dedent("\n".join(lines[1:]))).rstrip()
    lines = lines[1:]
    if lines and not lines[-1].strip():
        lines = lines[:-1]
    margin = None
    for line in lines:
        if line.strip():
            indent = line[: len(line) - len(line.lstrip(" \t"))]
            margin = indent if margin is None else _common_prefix(margin, indent)
    margin = margin or ""
    return "\n".join(
        line[len(margin) :] if line.startswith(margin) else line.lstrip(" \t") for line in lines
    )


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


@v_args(meta=True)
class Lower(Transformer):
    """Lark tree → ir.SourceFile for one file."""

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

    def _tok_span(self, tok: Token) -> ir.Span:
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

    def _expr(self, tok: Token) -> ir.Expr:
        text = str(tok).strip()
        span = self._tok_span(tok)
        span = span.model_copy(update={"end_column": span.column + len(text)})
        try:
            parse_python(text, "eval")
        except PythonSyntaxError as exc:
            line, col = span.line, span.column + max(0, (exc.offset or 1) - 1)
            if (exc.lineno or 1) > 1:  # a statement over several lines
                line, col = span.line + exc.lineno - 1, max(1, exc.offset or 1)
            self._error(
                f"not a Python expression: {exc.msg}",
                self._at(line, col),
                help=f"in `{text if len(text) <= 80 else text[:77] + '...'}`",
            )
        return ir.Expr(text=text, span=span)

    def _call_args(self, tok: Token, what: str) -> ast.Call | None:
        text = str(tok)
        try:
            node = parse_python("f" + text, "eval").body
        except PythonSyntaxError as exc:
            col = tok.column + max(0, (exc.offset or 2) - 2)
            self._error(f"{what} is not valid Python: {exc.msg}", self._at(tok.line, col))
            return None
        assert isinstance(node, ast.Call)
        return node

    def _arg_span(self, tok: Token, node: ast.AST) -> ir.Span:
        # Offsets inside the parenthesized text, shifted by the 'f' prefix used to parse it.
        line = tok.line + node.lineno - 1
        col = (tok.column + node.col_offset - 1) if node.lineno == 1 else node.col_offset + 1
        end = col + max(1, (node.end_col_offset or node.col_offset + 1) - node.col_offset)
        return self._at(line, col, end - col)

    # ------------------------------------------------------------------ top level
    def start(self, meta: Meta, items: list) -> ir.SourceFile:
        families = tuple(i for i in items if isinstance(i, ir.Family))
        dispatches = tuple(i for i in items if isinstance(i, ir.DispatchGroup))
        return ir.SourceFile(
            path=self.path, families=families, dispatches=dispatches, span=self._span(meta)
        )

    def family(self, meta: Meta, children: list) -> ir.Family:
        name_tok, *stmts = children
        fields: dict[str, Any] = {}
        seen: dict[str, _Stmt] = {}
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
        return ir.Family(name=str(name_tok), span=self._span(meta), **fields)

    # ------------------------------------------------------------------ family statements
    def op_type_stmt(self, meta: Meta, c: list) -> _Stmt:
        return _Stmt("op_type", str(c[0]), self._span(meta), "op_type")

    def description_stmt(self, meta: Meta, c: list) -> _Stmt:
        return _Stmt("description", c[0], self._span(meta), "description")

    def tags_stmt(self, meta: Meta, c: list) -> _Stmt:
        return _Stmt("tags", c[0], self._span(meta), "tags")

    def name_stmt(self, meta: Meta, c: list) -> _Stmt:
        return _Stmt("name_template", c[0], self._span(meta), "name")

    def reference_stmt(self, meta: Meta, c: list) -> _Stmt:
        return _Stmt("reference", c[0], self._span(meta), "reference")

    def requires_stmt(self, meta: Meta, c: list) -> _Stmt:
        return _Stmt("requires", tuple(str(t) for t in c), self._span(meta), "requires")

    def _signature(self, meta: Meta, c: list, keyword: str) -> _Stmt:
        path, params_tok = c
        span = self._span(meta)
        sig = ir.ApiSignature(path=path, params=self._params(params_tok), span=span)
        return _Stmt(keyword, sig, span, keyword)

    def api_stmt(self, meta: Meta, c: list) -> _Stmt:
        return self._signature(meta, c, "api")

    def api_none_stmt(self, meta: Meta, c: list) -> _Stmt | None:
        word, reason = c
        span = self._span(meta)
        if str(word) != "none":
            self._error(
                f"`api {word}` needs a parameter list",
                span,
                help='write `api pkg.mod.func(params...)`, or `api none "why"` for a family '
                "that stands for no API",
            )
        return _Stmt("no_api", reason, span, "api none")

    def plan_stmt(self, meta: Meta, c: list) -> _Stmt:
        return self._signature(meta, c, "plan")

    def returns_stmt(self, meta: Meta, c: list) -> _Stmt:
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
        return _Stmt("returns", value, span, "returns")

    def effect_stmt(self, meta: Meta, c: list) -> _Stmt:
        target, expr = c
        span = self._span(meta)
        effect = ir.Effect(
            target=str(target),
            target_span=self._tok_span(target),
            expr=self._expr(expr),
            span=span,
        )
        return _Stmt("effects", (effect,), span, "effect")

    def _params(self, tok: Token) -> tuple[ir.ApiParam, ...]:
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
        self, tok: Token, source: str, arg: ast.arg, kind: str, default: ast.expr | None
    ) -> ir.ApiParam:
        col = tok.column + arg.col_offset - 5  # 'def f' prefix
        span = self._at(tok.line, col, len(arg.arg))
        return ir.ApiParam(
            name=arg.arg,
            kind=kind,
            default=None if default is None else _segment(source, default),
            span=span,
        )

    def dtype_stmt(self, meta: Meta, c: list) -> _Stmt:
        name, *choices = c
        span = self._span(meta)
        value = ir.DtypeParam(name=str(name), choices=tuple(str(x) for x in choices), span=span)
        return _Stmt("dtype_params", (value,), span, "dtype")

    def tolerance_stmt(self, meta: Meta, c: list) -> _Stmt:
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
                values[kw.arg] = value
        return _Stmt("tolerance", ir.Tolerance(span=span, **values), span, "tolerance")

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
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            self._error(
                f"the string holds the lone surrogate {value[exc.start]!r}, which no UTF-8 "
                "file can hold",
                self._tok_span(tok),
                help="write the character itself, or its \\U00XXXXXX escape",
            )
            return ""
        return value

    def _char_span(self, tok: Token, index: int) -> ir.Span:
        """The span of the character at ``index`` of a token's text."""
        before = str(tok)[:index]
        line = tok.line + before.count("\n")
        column = (tok.column + index) if "\n" not in before else index - before.rindex("\n")
        return self._at(line, column)

    def dotted(self, meta: Meta, c: list) -> str:
        return ".".join(str(t) for t in c)

    # ------------------------------------------------------------------ params
    def params_block(self, meta: Meta, c: list) -> _Stmt:
        return _Stmt("params", tuple(c), self._span(meta), "params")

    def param(self, meta: Meta, c: list) -> ir.Param:
        name, *rest = c
        abbrev = next((x for x in rest if isinstance(x, _Abbrev)), None)
        default = next((x for x in rest if isinstance(x, _ParamDefault)), None)
        desc = next((x for x in rest if isinstance(x, str)), None)
        return ir.Param(
            name=str(name),
            abbrev=abbrev.text if abbrev else None,
            default=default.value if default else None,
            description=desc,
            span=self._span(meta),
        )

    def param_default(self, meta: Meta, c: list) -> "_ParamDefault":
        return _ParamDefault(c[0])

    def abbrev(self, meta: Meta, c: list) -> "_Abbrev":
        return _Abbrev(str(c[0]))

    # ------------------------------------------------------------------ axes
    def axes_block(self, meta: Meta, c: list) -> _Stmt:
        return _Stmt("axes", tuple(c), self._span(meta), "axes")

    def var_axis(self, meta: Meta, c: list) -> ir.VarAxis:
        name, *rest = c
        return ir.VarAxis(
            name=str(name), description=rest[0] if rest else None, span=self._span(meta)
        )

    def const_axis(self, meta: Meta, c: list) -> ir.ConstAxis:
        name, *rest = c
        abbrev = value = desc = None
        for x in rest:
            if isinstance(x, _Abbrev):
                abbrev = x.text
            elif isinstance(x, ir.Expr):
                value = x
            else:
                desc = x
        return ir.ConstAxis(
            name=str(name), abbrev=abbrev, value=value, description=desc, span=self._span(meta)
        )

    def const_value(self, meta: Meta, c: list) -> ir.Expr:
        return self._expr(c[0])

    # ------------------------------------------------------------------ constraints
    def constraints_block(self, meta: Meta, c: list) -> _Stmt:
        return _Stmt("constraints", self._constraints(c[0]), self._span(meta), "constraints")

    def _constraints(self, block: Token) -> tuple[ir.Expr, ...]:
        return tuple(self._expr(tok) for tok in self._block_lines(block))

    def _block_lines(self, block: Token) -> list[Token]:
        """The statements of a `{ ... }` block token: one per line or per ';'.

        Comments are cut off here and kept for `fibgen fmt`. A statement whose brackets are
        still open at the end of a line goes on over the next lines.
        """
        out: list[Token] = []
        text = str(block)[1:-1]
        pending: tuple[int, int, str] | None = None  # (line, column, text) of an open statement
        for n, line in enumerate(text.split("\n")):
            lineno = block.line + n
            base = (block.column + 1) if n == 0 else 1
            code, hash_at = _split_comment(line)
            if hash_at is not None:
                self.comments.append((lineno, base + hash_at, line[hash_at:].rstrip()))
            if pending is not None:
                start_line, start_col, so_far = pending
                joined = so_far + "\n" + code.rstrip()
                if _open_brackets(joined) > 0:
                    pending = (start_line, start_col, joined)
                    continue
                pending = None
                out.append(_token(joined, start_line, start_col))
                continue
            offset = 0
            pieces = _split_statements(code)
            for i, piece in enumerate(pieces):
                stripped = piece.strip()
                if stripped:
                    col = base + offset + (len(piece) - len(piece.lstrip()))
                    if i == len(pieces) - 1 and _open_brackets(stripped) > 0:
                        pending = (lineno, col, piece.strip())
                    else:
                        out.append(_token(stripped, lineno, col))
                offset += len(piece) + 1
        if pending is not None:
            out.append(_token(pending[2], pending[0], pending[1]))
        return out

    # ------------------------------------------------------------------ rules
    def rules_block(self, meta: Meta, c: list) -> _Stmt:
        rules = tuple(r for r in map(self._rule, self._block_lines(c[0])) if r is not None)
        return _Stmt("rules", rules, self._span(meta), "rules")

    def _rule(self, tok: Token) -> ir.Rule | None:
        text = str(tok)
        span = self._at(tok.line, tok.column, len(text.split("\n")[0]))
        m = _RULE_KEYWORD.match(text)
        if m is None:
            assignment = _RULE_TARGET.match(text)
            if assignment is not None and assignment.end() < len(text):
                self._error(
                    "a rule is a condition, not an assignment",
                    span,
                    help=f"compare with `==`: `{assignment.group(1)} == "
                    f"{text[assignment.end():].strip()}`; or write `let` to set a value",
                )
                return None
            return ir.Require(expr=self._expr(tok), span=span)
        keyword, rest = m.group(1), m.group(2)
        rest_tok = _token(rest, tok.line, tok.column + m.start(2))
        if keyword == "ignore":
            return self._ignore(rest_tok, span)
        if keyword in ("default", "let", "result"):
            target = _RULE_TARGET.match(rest)
            if target is None:
                self._error(
                    f"`{keyword}` needs a name and a value",
                    span,
                    help=f"write `{keyword} NAME = EXPRESSION`, e.g. "
                    "`default plan.sm_scale = 1 / sqrt(plan.head_dim)`",
                )
                return None
            name_span = self._at(rest_tok.line, rest_tok.column, len(target.group(1)))
            expr_tok = _token(rest[target.end() :], rest_tok.line, rest_tok.column + target.end())
            cls = {"default": ir.Default, "let": ir.Let, "result": ir.Result}[keyword]
            return cls(
                target=target.group(1),
                target_span=name_span,
                expr=self._expr(expr_tok),
                span=span,
            )
        found = _KEYWORDS_RULE.match(rest)
        if found is None:
            self._error(
                "`keywords` needs a `**` parameter, the function it forwards to and its "
                "keyword parameters",
                span,
                help="write `keywords plan.kwargs = pkg.Class._impl(window_left=-1, ...)`",
            )
            return None
        params_tok = Token(
            "PARAMS",
            found.group(3),
            line=rest_tok.line,
            column=rest_tok.column + found.start(3),
            end_line=rest_tok.line,
            end_column=rest_tok.column + found.end(3),
        )
        return ir.Keywords(
            target=found.group(1),
            target_span=self._at(rest_tok.line, rest_tok.column, len(found.group(1))),
            path=found.group(2),
            params=self._params(params_tok),
            span=span,
        )

    def _ignore(self, tok: Token, span: ir.Span) -> ir.Ignore | None:
        text = str(tok)
        quote_at = text.find('"')
        names_text = text if quote_at < 0 else text[:quote_at]
        reason = None
        if quote_at >= 0:
            try:
                reason = literal_value(text[quote_at:].strip())
            except PythonSyntaxError:
                reason = None
            if not isinstance(reason, str):
                self._error(
                    "the reason of `ignore` must be one string",
                    self._at(tok.line, tok.column + quote_at, len(text) - quote_at),
                    help='write `ignore enable_pdl "a launch option"`',
                )
                return None
        names: list[str] = []
        spans: list[ir.Span] = []
        offset = 0
        for part in names_text.split(","):
            name = part.strip()
            col = tok.column + offset + (len(part) - len(part.lstrip()))
            offset += len(part) + 1
            if not _RULE_NAME.fullmatch(name):
                self._error(
                    f"`{name}` is not a parameter name" if name else "`ignore` names nothing",
                    self._at(tok.line, col, max(1, len(name))),
                    help='write `ignore NAME, plan.NAME ... "why"`',
                )
                return None
            names.append(name)
            spans.append(self._at(tok.line, col, len(name)))
        return ir.Ignore(names=tuple(names), name_spans=tuple(spans), reason=reason, span=span)

    # ------------------------------------------------------------------ tensors
    def inputs_block(self, meta: Meta, c: list) -> _Stmt:
        return _Stmt("inputs", tuple(c), self._span(meta), "inputs")

    def outputs_block(self, meta: Meta, c: list) -> _Stmt:
        return _Stmt("outputs", tuple(c), self._span(meta), "outputs")

    def tensor(self, meta: Meta, c: list) -> ir.Tensor:
        name, *rest = c
        fields: dict[str, Any] = {}
        for x in rest:
            if isinstance(x, _Optional):
                fields["optional"] = True
            elif isinstance(x, ir.DtypeRef):
                fields["dtype"] = x
            elif isinstance(x, _Shape):
                fields["shape"] = x.dims
                fields["dim_spans"] = x.spans
            elif isinstance(x, ir.Source):
                fields["source"] = x
            elif isinstance(x, _Target):
                fields["target"] = x.name
            elif isinstance(x, ir.GenHint):
                fields["gen"] = x
            else:
                fields["description"] = x
        return ir.Tensor(name=str(name), span=self._span(meta), **fields)

    def optional(self, meta: Meta, c: list) -> "_Optional":
        return _Optional()

    def dtype_name(self, meta: Meta, c: list) -> ir.DtypeRef:
        # Whether a bare name is a dtype or a dtype parameter is decided in checks.py, which
        # knows the family's parameters; here it is recorded as written.
        return ir.DtypeRef(kind="concrete", name=str(c[0]), span=self._span(meta))

    def dtype_from(self, meta: Meta, c: list) -> ir.DtypeRef:
        return ir.DtypeRef(kind="from", name=str(c[0]), span=self._span(meta))

    def dims(self, meta: Meta, c: list) -> "_Shape":
        return _Shape(tuple(str(t) for t in c), tuple(self._tok_span(t) for t in c))

    def scalar(self, meta: Meta, c: list) -> "_Shape":
        return _Shape(None, ())

    def source(self, meta: Meta, c: list) -> ir.Source:
        from_plan = any(isinstance(x, _PlanPrefix) for x in c)
        names = [x for x in c if isinstance(x, Token)]
        index = next((x for x in c if isinstance(x, int)), None)
        return ir.Source(
            param=str(names[0]), index=index, from_plan=from_plan, span=self._span(meta)
        )

    def plan_prefix(self, meta: Meta, c: list) -> "_PlanPrefix":
        return _PlanPrefix()

    def index(self, meta: Meta, c: list) -> int:
        return self._int(c[0])

    def target(self, meta: Meta, c: list) -> "_Target":
        return _Target(str(c[0]))

    def gen(self, meta: Meta, c: list) -> ir.GenHint:
        kind, params = c
        span = self._span(meta)
        call = self._call_args(params, f"generation hint `{kind}`")
        if call is None:
            return ir.GenHint(kind=str(kind), span=span)
        args = tuple(self._hint_expr(params, a) for a in call.args)
        kwargs = tuple(
            (str(kw.arg), self._hint_expr(params, kw.value))
            for kw in call.keywords
            if kw.arg is not None
        )
        return ir.GenHint(kind=str(kind), args=args, kwargs=kwargs, span=span)

    def _hint_expr(self, tok: Token, node: ast.expr) -> ir.Expr:
        span = self._arg_span(tok, node)
        text = unparse(node)
        if text is None:
            self._error("this expression is nested too deeply", span)
            text = "0"
        return ir.Expr(text=text, span=span)

    # ------------------------------------------------------------------ instances
    def instances_block(self, meta: Meta, c: list) -> _Stmt:
        return _Stmt("instances", tuple(c), self._span(meta), "instances")

    def instance(self, meta: Meta, c: list) -> ir.Instance:
        values = tuple(x for x in c if isinstance(x, ir.Assignment))
        tags: tuple[str, ...] = ()
        desc = reference = None
        reference_span = ir.NO_SPAN
        for x in c:
            if isinstance(x, _Stmt) and x.field == "reference":
                reference, reference_span = x.value, x.span
            elif isinstance(x, _Stmt):
                tags = x.value
            elif isinstance(x, str):
                desc = x
        return ir.Instance(
            values=values,
            tags=tags,
            description=desc,
            reference=reference,
            reference_span=reference_span,
            span=self._span(meta),
        )

    def assignment(self, meta: Meta, c: list) -> ir.Assignment:
        key, value = c
        return ir.Assignment(key=str(key), value=value, span=self._span(meta))

    def int_lit(self, meta: Meta, c: list) -> int:
        return self._int(c[0])

    def _int(self, tok: Token) -> int:
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

    def float_lit(self, meta: Meta, c: list) -> float:
        value = float(c[0])
        if not math.isfinite(value):
            self._error(f"number `{c[0]}` is out of the range of a float", self._tok_span(c[0]))
            return 0.0
        return value

    def str_lit(self, meta: Meta, c: list) -> str:
        return c[0]

    def name_lit(self, meta: Meta, c: list) -> str | bool:
        text = str(c[0])
        return {"true": True, "false": False, "True": True, "False": False}.get(text, text)

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, meta: Meta, c: list) -> ir.DispatchGroup:
        name, selector, *cases = c
        return ir.DispatchGroup(
            name=str(name), selector=str(selector), cases=tuple(cases), span=self._span(meta)
        )

    def case(self, meta: Meta, c: list) -> ir.DispatchCase:
        value, family, *also = c
        return ir.DispatchCase(
            value=value,
            family=str(family),
            also=tuple(str(f) for f in also),
            span=self._span(meta),
        )


def _segment(source: str, node: ast.expr) -> str:
    # Keep a default as written (`1e-6`, not `1e-06`): it is shown to users in generated code.
    if source.isascii() and "\n" not in source and "\r" not in source:
        # What get_source_segment gives for one line of ASCII (offsets count UTF-8 bytes),
        # without splitting the source into lines on every call: a parameter list of forty
        # defaults spent most of its lowering there.
        return source[node.col_offset : node.end_col_offset] or ast.unparse(node)
    return ast.get_source_segment(source, node) or ast.unparse(node)


class _ParamDefault:
    __slots__ = ("value",)

    def __init__(self, value: int | float | str | bool) -> None:
        self.value = value


_MAX_DIGITS = 1000


class _Abbrev:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Optional:
    __slots__ = ()


class _PlanPrefix:
    __slots__ = ()


class _Shape:
    __slots__ = ("dims", "spans")

    def __init__(self, dims: tuple[str, ...] | None, spans: tuple[ir.Span, ...]) -> None:
        self.dims = dims
        self.spans = spans


class _Target:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_RULE_KEYWORD = re.compile(r"(ignore|default|let|result|keywords)\b\s*(.*)\Z", re.S)
_RULE_NAME = re.compile(r"(?:plan\.)?[A-Za-z_][A-Za-z0-9_]*")
_RULE_TARGET = re.compile(r"((?:plan\.)?[A-Za-z_][A-Za-z0-9_]*)\s*=(?!=)\s*")
_KEYWORDS_RULE = re.compile(
    r"((?:plan\.)?[A-Za-z_][A-Za-z0-9_]*)\s*=\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(\(.*\))\s*\Z", re.S
)


def _token(text: str, line: int, column: int) -> Token:
    first = text.split("\n")[0]
    return Token(
        "EXPR", text, line=line, column=column, end_line=line, end_column=column + len(first)
    )


def _code_positions(line: str):
    """(index, character) of each character of a line that is outside string literals."""
    quote = None
    escaped = False
    for i, ch in enumerate(line):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        else:
            yield i, ch


def _split_comment(line: str) -> tuple[str, int | None]:
    """Split a line at a '#' that is not inside a string literal."""
    for i, ch in _code_positions(line):
        if ch == "#":
            return line[:i], i
    return line, None


def _open_brackets(text: str) -> int:
    """How many brackets are open at the end of ``text`` (outside string literals)."""
    depth = 0
    for _, ch in _code_positions(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
    return depth


def _split_statements(code: str) -> list[str]:
    """Split a line at the ';' that are outside string literals and brackets."""
    cuts, depth = [], 0
    for i, ch in _code_positions(code):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == ";" and depth <= 0:
            cuts.append(i)
    bounds = zip([-1] + cuts, cuts + [len(code)])
    return [code[start + 1 : end] for start, end in bounds]


def lower(tree: Tree, path: str) -> tuple[ir.SourceFile, list[Diagnostic]]:
    """Lower one parsed file."""
    source_file, diags, _ = lower_with_comments(tree, path)
    return source_file, diags


def lower_with_comments(
    tree: Tree, path: str
) -> tuple[ir.SourceFile, list[Diagnostic], list[tuple[int, int, str]]]:
    """Lower one parsed file, also returning comments found inside tokens (constraints)."""
    lowering = Lower(path)
    source_file = lowering.transform(tree)
    return source_file, lowering.diagnostics, lowering.comments
