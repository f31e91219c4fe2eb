"""Lowering of instances: their values and the literals they are written with."""

from __future__ import annotations

import math

from lark import v_args
from lark.tree import Meta

from fibgen.compiler import ir
from fibgen.compiler.lower.base import LowerBase, Stmt


@v_args(meta=True)
class InstanceLowering(LowerBase):
    """Instances and their values, and the literals values are written with."""

    # ------------------------------------------------------------------ instances
    def instances_block(self, meta: Meta, c: list) -> Stmt:
        return Stmt("instances", tuple(c), self._span(meta), "instances")

    def instance(self, meta: Meta, c: list) -> ir.Instance:
        values = tuple(x for x in c if isinstance(x, ir.Assignment))
        tags: tuple[str, ...] = ()
        desc = reference = None
        reference_span = ir.NO_SPAN
        for x in c:
            if isinstance(x, Stmt) and x.field == "reference":
                reference, reference_span = x.value, x.span
            elif isinstance(x, Stmt):
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
