"""Lowering of declarations: params, axes and tensors."""

from __future__ import annotations

import ast
from typing import Any

from lark import Token, v_args
from lark.tree import Meta

from fibgen.compiler import ir
from fibgen.compiler.lower.base import LowerBase, Stmt
from fibgen.compiler.lower.text import PosToken
from fibgen.compiler.pysyntax import unparse


@v_args(meta=True)
class DeclarationLowering(LowerBase):
    """Params, axes and tensors, with their sources, targets and generation hints."""

    # ------------------------------------------------------------------ params
    def params_block(self, meta: Meta, c: list) -> Stmt:
        return Stmt("params", tuple(c), self._span(meta), "params")

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
    def axes_block(self, meta: Meta, c: list) -> Stmt:
        return Stmt("axes", tuple(c), self._span(meta), "axes")

    def var_axis(self, meta: Meta, c: list) -> ir.VarAxis:
        name, *rest = c
        scalar = any(isinstance(x, _VarScalar) for x in rest)
        desc = next((x for x in rest if isinstance(x, str)), None)
        return ir.VarAxis(name=str(name), scalar=scalar, description=desc, span=self._span(meta))

    def var_scalar(self, meta: Meta, c: list) -> "_VarScalar":
        return _VarScalar()

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

    # ------------------------------------------------------------------ tensors
    def inputs_block(self, meta: Meta, c: list) -> Stmt:
        return Stmt("inputs", tuple(c), self._span(meta), "inputs")

    def outputs_block(self, meta: Meta, c: list) -> Stmt:
        return Stmt("outputs", tuple(c), self._span(meta), "outputs")

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
        # Whether a bare name is a dtype or a dtype parameter is decided in checks/, which
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

    def _hint_expr(self, tok: PosToken, node: ast.expr) -> ir.Expr:
        span = self._arg_span(tok, node)
        text = unparse(node)
        if text is None:
            self._error("this expression is nested too deeply", span)
            text = "0"
        return ir.Expr(text=text, span=span)


class _ParamDefault:
    __slots__ = ("value",)

    def __init__(self, value: int | float | str | bool) -> None:
        self.value = value


class _Abbrev:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Optional:
    __slots__ = ()


class _VarScalar:
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
