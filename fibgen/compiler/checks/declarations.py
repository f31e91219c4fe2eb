"""Checks of a family's declarations: axes, parameters, tensors, dtypes, hints, constraints."""

from __future__ import annotations

import keyword
import re

from fibgen.compiler import ir
from fibgen.compiler.checks.common import (
    CheckerBase,
    FamilyView,
    closest,
    did_you_mean,
    names_in,
    sub_span,
)
from fibgen.compiler.checks.names import module_name_problem
from fibgen.format.expressions import (
    BUILTIN_NAMES,
    HELP,
    ExpressionError,
    check_expression,
    expression_names,
)

_REQUIRES = re.compile(r"^sm_?(\d{2,3})a?$")
_INTEGER_DTYPES = ("int64", "int32", "int16", "int8")


def _scalar_of_var(axis: ir.VarAxis | ir.ConstAxis, t: ir.Tensor) -> bool:
    """Whether input ``t`` shares its name with var axis ``axis`` as the scalar that binds it
    (or is meant to: `_var_axes_bound` reports what is wrong with it)."""
    return isinstance(axis, ir.VarAxis) and (axis.scalar or t.shape is None)


def _hint_signatures() -> dict | None:
    try:
        from fibgen.format.hints import HINT_SIGNATURES
    except ImportError:  # the hint table is optional for the compiler
        return None
    return HINT_SIGNATURES


class DeclarationChecks(CheckerBase):
    """Names declared once, shapes over declared axes, dtypes, generation hints, constraints."""

    def _declarations(self, fam: ir.Family) -> FamilyView:
        problem = module_name_problem(fam.name)
        if problem is not None:
            self.err(
                f"family name `{fam.name}` {problem}",
                fam.name_span if fam.name_span.line > 0 else fam.span,
                help=f"the family's dispatcher is the module and function `{fam.name}` of the "
                "generated package: choose another name",
            )
        axes: dict[str, ir.VarAxis | ir.ConstAxis] = {}
        for ax in fam.axes:
            if ax.name in axes:
                self.err(
                    f"axis `{ax.name}` is declared twice",
                    ax.span,
                    help=f"the first is at {axes[ax.name].span}",
                )
            else:
                axes[ax.name] = ax
        abbrevs: dict[str, ir.Node] = {}
        for ax in fam.axes:
            if isinstance(ax, ir.ConstAxis) and ax.abbrev:
                if ax.abbrev in abbrevs and abbrevs[ax.abbrev] is not ax:
                    self.err(
                        f"abbreviation `{ax.abbrev}` is used by two consts",
                        ax.span,
                        help="each name part needs its own abbreviation",
                    )
                abbrevs[ax.abbrev] = ax
        params: dict[str, ir.Param] = {}
        for p in fam.params:
            if p.name in params or p.name in axes:
                self.err(
                    f"parameter `{p.name}` clashes with another declaration",
                    p.span,
                    help="parameters, axes and tensors need distinct names",
                )
            params[p.name] = p
        dtype_params: dict[str, ir.DtypeParam] = {}
        for dp in fam.dtype_params:
            if dp.name in dtype_params:
                self.err(f"dtype parameter `{dp.name}` is declared twice", dp.span)
            dtype_params[dp.name] = dp
            for choice in dp.choices:
                if choice not in ir.DTYPES:
                    self.err(
                        f"unknown dtype `{choice}` in `dtype {dp.name}`",
                        dp.span,
                        help=f"allowed dtypes: {', '.join(ir.DTYPES)}",
                    )
        inputs: dict[str, ir.Tensor] = {}
        for t in fam.inputs:
            if t.name in inputs:
                self.err(
                    f"input `{t.name}` is declared twice",
                    t.span,
                    help=f"the first is at {inputs[t.name].span}",
                )
            inputs[t.name] = t
        outputs: dict[str, ir.Tensor] = {}
        for t in fam.outputs:
            if t.name in outputs:
                self.err(
                    f"output `{t.name}` is declared twice",
                    t.span,
                    help=f"the first is at {outputs[t.name].span}",
                )
            elif t.name in inputs:
                source = inputs[t.name].source
                self.err(
                    f"`{t.name}` is both an input and an output",
                    t.span,
                    help="give the output its own name; an in-place kernel writes back "
                    f"with `-> {source.param if source else t.name}`",
                )
            outputs[t.name] = t
        for name in list(inputs) + list(outputs):
            if name in axes and name in inputs and _scalar_of_var(axes[name], inputs[name]):
                continue  # an axis bound by its scalar (Note [axes bound by a scalar])
            if name in axes:
                self.err(
                    f"tensor `{name}` has the name of an axis",
                    (inputs.get(name) or outputs[name]).span,
                    help="constraints refer to both by name, so they must differ",
                )
        # These names become parameters and variables of generated Python.
        named: list[tuple[str, ir.VarAxis | ir.ConstAxis | ir.Param | ir.Tensor]] = [
            ("an axis", a) for a in fam.axes
        ]
        named += [("a parameter", p) for p in fam.params]
        named += [("an input", t) for t in fam.inputs] + [("an output", t) for t in fam.outputs]
        for what, node in named:
            if keyword.iskeyword(node.name):
                self.err(
                    f"`{node.name}` is a Python keyword and cannot name {what}",
                    node.span,
                    help="generated Python uses this name as a variable: choose another",
                )
        return FamilyView(fam, axes, params, dtype_params, inputs, outputs)

    def _tensors(self, v: FamilyView) -> None:
        for t in v.family.inputs + v.family.outputs:
            is_output = t.name in v.outputs and v.outputs[t.name] is t
            self._dtype(v, t)
            for i, dim in enumerate(t.shape or ()):
                if dim not in v.axes:
                    self.err(
                        f"unknown axis `{dim}` in the shape of `{t.name}`",
                        t.dim_spans[i] if i < len(t.dim_spans) else t.span,
                        help=did_you_mean(dim, v.axes, "axes"),
                    )
            if is_output:
                if t.gen is not None:
                    self.err(
                        f"output `{t.name}` has a generation hint",
                        t.gen.span,
                        help="only inputs are generated",
                    )
            elif t.target is not None:
                self.err(
                    f"input `{t.name}` has a write-back target `-> {t.target}`",
                    t.span,
                    help="`->` belongs to outputs; an input is read with `<-`",
                )
            if t.gen is not None:
                self._hint(v, t)

    def _dtype(self, v: FamilyView, t: ir.Tensor) -> None:
        ref = t.dtype
        if ref.kind == "from":
            if ref.name not in v.inputs:
                self.err(
                    f"`dtype({ref.name})` names no input",
                    ref.span,
                    help=did_you_mean(ref.name, v.inputs, "inputs"),
                )
            elif v.inputs[ref.name].dtype.kind == "from":
                self.err(
                    f"`dtype({ref.name})` refers to an input whose dtype is itself copied",
                    ref.span,
                    help="copy from an input with a declared dtype",
                )
        elif ref.name not in ir.DTYPES and ref.name not in v.dtype_params:
            close = closest(ref.name, list(ir.DTYPES) + list(v.dtype_params))
            self.err(
                f"unknown dtype `{ref.name}` for `{t.name}`",
                ref.span,
                help=(f"did you mean `{close}`? " if close else "")
                + f"allowed dtypes: {', '.join(ir.DTYPES)}",
            )

    def _hint(self, v: FamilyView, t: ir.Tensor) -> None:
        hint = t.gen
        assert hint is not None
        known = self._expr_names(v)
        for expr in list(hint.args) + [e for _, e in hint.kwargs]:
            # A hint's argument is kept as Python prints it, not as written: a problem in it
            # is shown on the whole argument.
            if not self._in_language(expr, "a generation hint", whole=True):
                continue
            for name, offset in names_in(expr.text):
                if name not in known:
                    self.err(
                        f"unknown name `{name}` in the generation hint of `{t.name}`",
                        sub_span(expr.span, offset, len(name)),
                        help=did_you_mean(name, known - BUILTIN_NAMES, "names"),
                    )
        table = _hint_signatures()
        if table is None:
            return
        sig = table.get(hint.kind)
        if sig is None:
            self.err(
                f"unknown generation hint `{hint.kind}`",
                hint.span,
                help=did_you_mean(hint.kind, sorted(table), "hints"),
            )
            return
        positional = tuple(getattr(sig, "positional", ()))
        keywords = tuple(getattr(sig, "keywords", ()))
        required = tuple(getattr(sig, "required", ()))
        if len(hint.args) > len(positional):
            self.err(
                f"`{hint.kind}` takes at most {len(positional)} positional argument"
                f"{'s' if len(positional) != 1 else ''}",
                hint.span,
                help=f"signature: {hint.kind}({', '.join(positional + keywords)})",
            )
        given = set(positional[: len(hint.args)]) | {k for k, _ in hint.kwargs}
        for key, _ in hint.kwargs:
            if key not in positional and key not in keywords:
                self.err(
                    f"`{hint.kind}` has no argument `{key}`",
                    hint.span,
                    help=f"signature: {hint.kind}({', '.join(positional + keywords)})",
                )
        for key in required:
            if key not in given:
                self.err(
                    f"`{hint.kind}` needs the argument `{key}`",
                    hint.span,
                    help=f"signature: {hint.kind}({', '.join(positional + keywords)})",
                )
        named = dict(zip(positional, hint.args)) | dict(hint.kwargs)
        for key in getattr(sig, "tensor_params", ()):
            if key in named and not named[key].text.isidentifier():
                self.err(
                    f"`{key}` of `{hint.kind}` names an input, not `{named[key].text}`",
                    named[key].span,
                    help=f"write `{key}=NAME`, NAME an input of `{v.family.name}`",
                )

    def _expr_names(self, v: FamilyView) -> set[str]:
        return set(v.axes) | set(v.params) | set(v.inputs) | set(v.outputs) | BUILTIN_NAMES

    def _in_language(self, expr: ir.Expr, what: str, whole: bool = False) -> bool:
        """Whether an expression is in the checked language of constraints and hints (Note
        [checked expressions] in fibgen/format/expressions.py); an error where it is not."""
        try:
            check_expression(expr.text, what)
        except ExpressionError as exc:
            if exc.message.startswith("not an expression"):
                return False  # a syntax error, which lowering reported
            span = expr.span if whole else _in_expr(expr.span, exc.line, exc.column, exc.width)
            self.err(exc.message, span, help=HELP)
            return False
        return True

    def _var_axes_bound(self, v: FamilyView) -> None:
        carriers: dict[str, tuple[ir.Tensor, int]] = {}
        for t in v.family.inputs:
            for i, d in enumerate(t.shape or ()):
                carriers.setdefault(d, (t, i))
        for ax in v.family.axes:
            if not isinstance(ax, ir.VarAxis):
                continue
            if ax.scalar:
                self._scalar_axis(v, ax, carriers.get(ax.name))
            elif ax.name in carriers and ax.name in v.inputs and v.inputs[ax.name].shape is None:
                tensor = carriers[ax.name][0]
                self.err(
                    f"tensor `{ax.name}` has the name of an axis",
                    v.inputs[ax.name].span,
                    help=f"var axis `{ax.name}` is read from the shape of `{tensor.name}`; a "
                    "scalar input named like it would be read as its value too: rename the "
                    "input",
                )
            elif ax.name not in carriers:
                scalar = v.inputs.get(ax.name)
                if scalar is not None and scalar.shape is None:
                    self.err(
                        f"var axis `{ax.name}` is bound by no input shape",
                        ax.span,
                        help=f"to take its value from the scalar input `{ax.name}`, write "
                        f"`{ax.name} : var scalar`",
                    )
                    continue
                self.err(
                    f"var axis `{ax.name}` is bound by no input shape",
                    ax.span,
                    help="a var axis takes its value from an input's shape at run time; "
                    "use it in an input's shape, make it `const`, or bind it by an integer "
                    f"scalar input of its name with `{ax.name} : var scalar`",
                )

    def _scalar_axis(
        self, v: FamilyView, ax: ir.VarAxis, carrier: tuple[ir.Tensor, int] | None
    ) -> None:
        """``n : var scalar``: the input ``n`` is a required integer scalar without a generation
        hint, and no input's shape carries ``n`` too (Note [axes bound by a scalar])."""
        t = v.inputs.get(ax.name)
        if t is None:
            where = " (it is an output)" if ax.name in v.outputs else ""
            self.err(
                f"var axis `{ax.name}` is bound by the scalar input `{ax.name}`, but "
                f"`{v.family.name}` has no input `{ax.name}`{where}",
                ax.span,
                help=f"declare it among the inputs, `{ax.name} : int32 scalar`, where the "
                "API passes it",
            )
            return
        if t.shape is not None:
            self.err(
                f"var axis `{ax.name}` is bound by the scalar input `{ax.name}`, but input "
                f"`{ax.name}` is a tensor",
                t.span,
                help=f"declare `{ax.name} : int32 scalar`, or drop `scalar` from the axis and "
                "use it in a tensor's shape",
            )
            return
        if t.dtype.kind != "concrete" or t.dtype.name not in _INTEGER_DTYPES:
            shown = t.dtype.name if t.dtype.kind == "concrete" else f"dtype({t.dtype.name})"
            if t.dtype.kind == "concrete" and t.dtype.name in v.dtype_params:
                shown = f"the dtype parameter {t.dtype.name}"
            self.err(
                f"var axis `{ax.name}` is bound by the scalar input `{ax.name}`, whose dtype "
                f"`{shown}` is not an integer",
                t.dtype.span,
                help=f"an axis is a size: declare the input with an integer dtype "
                f"({', '.join(_INTEGER_DTYPES)})",
            )
        if t.optional:
            self.err(
                f"var axis `{ax.name}` is bound by the scalar input `{ax.name}`, which is "
                "optional",
                t.span,
                help="a call without it would leave the axis without a value: make the input "
                f"required (a rule `default {ax.name} = ...` says what an API's None stands "
                "for)",
            )
        if t.gen is not None:
            self.err(
                f"the scalar input `{ax.name}` binds var axis `{ax.name}` and cannot have a "
                "generation hint",
                t.gen.span,
                help="input generation makes it equal to the axis; bound the axis with a "
                f"constraint such as `{ax.name} >= 1` instead",
            )
        if carrier is not None:
            tensor, i = carrier
            self.err(
                f"var axis `{ax.name}` has two sources: the scalar input `{ax.name}` and the "
                f"shape of `{tensor.name}`",
                tensor.dim_spans[i] if i < len(tensor.dim_spans) else tensor.span,
                help="the two may disagree at run time: drop `scalar` to read the axis from "
                f"the shape of `{tensor.name}`, or give this dimension its own axis",
            )

    def _constraints(self, v: FamilyView) -> None:
        known = self._expr_names(v)
        for c in v.family.constraints:
            if not self._in_language(c, "a constraint"):
                continue
            for name, line, column in expression_names(c.text):
                if name not in known:
                    self.err(
                        f"unknown name `{name}` in constraint",
                        _in_expr(c.span, line, column, len(name)),
                        help=did_you_mean(name, known - BUILTIN_NAMES, "names"),
                    )

    def _requires(self, fam: ir.Family) -> None:
        for req in fam.requires:
            if not _REQUIRES.match(req):
                self.err(
                    f"unknown requirement `{req}`",
                    fam.span,
                    help="write a minimum compute capability such as `sm90` or `sm100`",
                )


def _in_expr(span: ir.Span, line: int, column: int, width: int) -> ir.Span:
    """The span of a place in an expression, given at (line, column) of its text: a constraint
    over several lines keeps each continued line as the file has it, from column 1."""
    if line == 1:
        return sub_span(span, column - 1, width)
    at = span.line + line - 1
    return ir.Span(file=span.file, line=at, column=column, end_line=at, end_column=column + width)
