"""Python dispatch target: one module per family (and per dispatch group) plus the package.

Everything the dispatcher needs at call time is decided here, at generation time: how each
const value is read from the arguments, the table of known definitions, the name rule, how
the definition's inputs are spelled in terms of the API's parameters and how outputs go back
into the caller's buffers. The generated code follows Note [the dispatch contract] in
``fibgen/runtime/apply.py``.

Note [effects]
Some APIs write more than their definition exposes: FlashInfer's ``fused_add_rmsnorm`` leaves
``input + residual`` in ``residual`` and the normalized rows in ``input``, while the
definition (and so every solution) produces only the normalized rows. A family says so with
``effect residual = hidden_states + residual``. After a routed call the dispatcher evaluates
each effect's expression on the call's inputs, before any output is written back (the
write-back may overwrite an input the expression reads), then writes the outputs back and
copies each effect's value into its target. The fallback to the original API needs none of
this: the API does its own writes.
"""

from __future__ import annotations

import ast
import re
import string
from collections.abc import Iterable
from dataclasses import dataclass


from fibgen.codegen.dispatch_ops import OpView
from fibgen.codegen.dispatch_rules import RuleSpeller, captured_names, module_names, unparse
from fibgen.codegen.files import GeneratedFile, GenerateError, with_python_header
from fibgen.codegen.pyformat import format_python
from fibgen.codegen.pyliteral import inline_dict, literal
from fibgen.codegen.templates import render, source_label
from fibgen.compiler import ir

# torch spells every format dtype by its own name except fp4, which it only has packed in pairs.
_TORCH_DTYPE = {d: f"torch.{d}" for d in ir.DTYPES} | {"float4_e2m1": "torch.float4_e2m1fn_x2"}


class DispatchGenError(GenerateError):
    """A family that cannot get a dispatcher; the message names the family and the reason."""


@dataclass(frozen=True)
class FunctionView:
    """One generated function: name, parameter list, docstring and body lines."""

    name: str
    params: str
    doc: str
    body: tuple[str, ...]


@dataclass(frozen=True)
class ModuleView:
    """What the module template substitutes."""

    doc: str
    imports: tuple[str, ...]
    tables: tuple[str, ...]
    functions: tuple[FunctionView, ...]
    registration: tuple[str, ...]


# ---------------------------------------------------------------------------------------
# Signatures
# ---------------------------------------------------------------------------------------


def _params_of(family: ir.Family) -> tuple[ir.ApiParam, ...]:
    if family.api is not None:
        return family.api.params
    # Without an API: the inputs in order, then one keyword buffer per output.
    params = []
    seen_default = False
    for t in family.inputs:
        seen_default = seen_default or t.optional
        params.append(
            ir.ApiParam(name=t.name, kind="positional", default="None" if seen_default else None)
        )
    for t in family.outputs:
        params.append(ir.ApiParam(name=t.name, kind="keyword_only", default="None"))
    return tuple(params)


def _signature(params: Iterable[ir.ApiParam]) -> str:
    parts: list[str] = []
    star = False
    for p in params:
        if p.kind == "var_positional":
            parts.append(f"*{p.name}")
            star = True
        elif p.kind == "var_keyword":
            parts.append(f"**{p.name}")
        else:
            if p.kind == "keyword_only" and not star:
                parts.append("*")
                star = True
            parts.append(p.name if p.default is None else f"{p.name}={_default(p.default)}")
    return ", ".join(parts)


def _default(text: str) -> str:
    # A default that is not a literal (``ActivationType.Swiglu.value``) names something of the
    # API's module; the runtime puts in the real value once it finds the API.
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return f"ApiDefault({literal(text)})"
    return text


def _forward(params: Iterable[ir.ApiParam]) -> str:
    spell = {
        "positional": "{0}",
        "keyword_only": "{0}={0}",
        "var_positional": "*{0}",
        "var_keyword": "**{0}",
    }
    return ", ".join(spell[p.kind].format(p.name) for p in params)


# ---------------------------------------------------------------------------------------
# Families
# ---------------------------------------------------------------------------------------


def _literal(value: object) -> str:
    return literal(value)


def _tuple(items: list[str]) -> str:
    # No trailing comma beyond the one a 1-tuple needs: black would explode the tuple.
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _pinned_literal(axis: ir.ConstAxis) -> int | None:
    if axis.value is None:
        return None
    try:
        value = ast.literal_eval(axis.value.text)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, int) else None


@dataclass(frozen=True)
class _NameRule:
    """A format template over the key's names; dtype fields are spelled by their name part."""

    template: str
    fields: tuple[str, ...]


class _Family:
    """Computes the views of one family's dispatcher."""

    def __init__(self, family: ir.Family, definitions: list[ir.Definition], label: str) -> None:
        self.f = family
        self.defs = sorted(definitions, key=lambda d: d.name)
        self.label = label
        self.params = _params_of(family)
        self.run_names = {p.name for p in self.params}
        self.plan_params = family.plan.params if family.plan is not None else ()
        self.captured = captured_names(family)
        # Run-time names the rules rebind: `let` targets, keywords of a `**` parameter.
        self.run_var: dict[str, str] = {}
        for r in family.rules:
            if isinstance(r, (ir.Let, ir.Default)) and not r.target.startswith("plan."):
                self.run_var[r.target] = f"_l_{r.target}"
            elif isinstance(r, ir.Keywords) and not r.target.startswith("plan."):
                self.run_var.update((k.name, f"_w_{k.name}") for k in r.params)
        self.axes = {a.name: a for a in family.axes}
        self.dtype_params = {d.name for d in family.dtype_params}
        self.param_names = {p.name for p in family.params}
        self.input_expr = {t.name: self._source_expr(t) for t in family.inputs}
        self.targets = {o.name: self._target(o) for o in family.outputs}

    def error(self, message: str) -> DispatchGenError:
        return DispatchGenError(f"{self.f.span}: family {self.f.name}: {message}")

    # ------------------------------------------------------------------- sources
    def _plan_value(self, param: str) -> str:
        return f"_plan[{self.captured.index(param)}]"

    def _run_value(self, name: str) -> str:
        return self.run_var.get(name, name)

    def _source_expr(self, t: ir.Tensor) -> str:
        if self.f.api is None:
            return t.name
        src = t.source
        if src is None:
            if t.name in self.run_names or t.name in self.run_var:
                return self._run_value(t.name)
            if t.name in self.captured:
                return self._plan_value(t.name)
            raise self.error(f"input {t.name} is not a parameter of {self.f.api.path}; add `<-`")
        if src.from_plan:
            if src.param not in self.captured:
                raise self.error(f"input {t.name} reads plan.{src.param}, which plan lacks")
            base = self._plan_value(src.param)
        elif src.param in self.run_names or src.param in self.run_var:
            base = self._run_value(src.param)
        else:
            raise self.error(f"input {t.name} reads {src.param}, not a parameter of the API")
        return base if src.index is None else f"{base}[{src.index}]"

    def _target(self, o: ir.Tensor) -> tuple[str, str] | None:
        """("buffer", param) for a caller's buffer, ("inplace", expr) for an input."""
        if self.f.api is None:
            return ("buffer", o.name)
        if o.target is None:
            return None
        sources = {t.source.param: t for t in self.f.inputs if t.source and not t.source.from_plan}
        inputs = {t.name: t for t in self.f.inputs}
        if o.target in self.run_names:
            written = sources.get(o.target) or inputs.get(o.target)
            if written is not None and (written.source is None or written.source.index is None):
                # The input reads the whole argument (maybe through a view made by `let`):
                # writing into what the input reads writes into the caller's tensor.
                return ("inplace", self.input_expr[written.name])
            return ("buffer", o.target)
        if o.target in inputs:
            return ("inplace", self.input_expr[o.target])
        raise self.error(f"output {o.name} is written to {o.target}, not an API parameter")

    # ---------------------------------------------------------------- key readers
    def _tensors(self) -> list[tuple[ir.Tensor, str, bool]]:
        """(tensor, expression, required): inputs, then the caller's output buffers."""
        found = [(t, self.input_expr[t.name], not t.optional) for t in self.f.inputs]
        for o in self.f.outputs:
            target = self.targets[o.name]
            if target is not None and target[0] == "buffer":
                found.append((o, target[1], False))
        return found

    def _argument(self, name: str) -> str | None:
        if name in self.run_names or name in self.run_var:
            return self._run_value(name)
        if name in self.captured:
            return self._plan_value(name)
        return None

    def _options(self, name: str) -> list[tuple[str, str | None]]:
        """Ways to read a key field, in COMPAT.md's priority order.

        Each is (expression, the variable that must not be None for it, or None).
        """
        tensors = self._tensors()
        options: list[tuple[str, str | None]] = []
        if name in self.dtype_params:
            carriers = [
                (f"{expr}.dtype", expr, req)
                for t, expr, req in tensors
                if t.shape is not None and t.dtype.kind != "from" and t.dtype.name == name
            ]
        else:
            carriers = [
                (f"{expr}.shape[{t.shape.index(name) - len(t.shape)}]", expr, req)
                for t, expr, req in tensors
                if name in self.axes and t.shape is not None and name in t.shape
            ]
        options += [(e, None) for e, _, req in carriers if req][:1]
        scalar = next((t for t in self.f.inputs if t.name == name and t.shape is None), None)
        if scalar is not None and name not in self.dtype_params:
            expr = self.input_expr[scalar.name]
            options.append((expr, expr if scalar.optional else None))
        options += [(e, base) for e, base, req in carriers if not req]
        if name not in self.dtype_params and all(base is not None for _, base in options):
            argument = self._argument(name)
            if argument is not None:
                options.append((argument, None))
        return options

    def readable(self, name: str) -> bool:
        """Whether a field is read from every call (not only when an optional one is given)."""
        return any(base is None for _, base in self._options(name))

    def _reader(self, name: str) -> str:
        """The expression reading a key field: options chained, first unconditional last."""
        options = self._options(name)
        if not options:
            raise self.error(
                f"{name} names the definition but cannot be read from a call: no tensor "
                f"carries it and no argument is named {name}"
            )
        # The first unconditional option ends the chain; conditional ones wrap what follows.
        chain = "None"
        for expr, base in reversed(options):
            chain = expr if base is None else f"({expr} if {base} is not None else {chain})"
        return chain

    # ------------------------------------------------------------------ naming
    def name_rules(self) -> list[_NameRule]:
        """Candidate name rules, most likely first; the first that names every instance wins."""
        if self.f.name_template is not None:
            fields = tuple(
                dict.fromkeys(
                    f for _, f, _, _ in string.Formatter().parse(self.f.name_template) if f
                )
            )
            declared = set(self.axes) | self.param_names | self.dtype_params
            unknown = [f for f in fields if f not in declared]
            if unknown:
                raise self.error(f"name template names unknown {', '.join(unknown)}")
            return [_NameRule(self.f.name_template, fields)]
        escape = str.maketrans({"{": "{{", "}": "}}"})
        prefix = self.f.name.translate(escape)
        # As checks.definition_name spells them: named params, then named consts.
        parts = [
            (f"_{p.abbrev.translate(escape)}{{{p.name}}}", p.name)
            for p in self.f.params
            if p.abbrev is not None
        ]
        parts += [
            (f"_{a.abbrev.translate(escape)}{{{a.name}}}", a.name)
            for a in self.f.axes
            if isinstance(a, ir.ConstAxis) and a.abbrev is not None
        ]
        dtypes = [(f"_{{{d.name}}}", d.name) for d in self.f.dtype_params]
        orders = [parts + dtypes, dtypes + parts] if dtypes else [parts]
        return [
            _NameRule(prefix + "".join(p for p, _ in order), tuple(n for _, n in order))
            for order in orders
        ]

    def _values(self, d: ir.Definition) -> dict[str, object]:
        values: dict[str, object] = dict(d.consts)
        values.update(d.param_values)
        values.update(d.dtype_values)
        return values

    def _spell(self, rule: _NameRule, values: dict[str, object]) -> str:
        spelled = {
            f: ir.DTYPE_NAME_PART[values[f]] if f in self.dtype_params else values[f]
            for f in rule.fields
        }
        return rule.template.format(**spelled)

    def name_rule(self) -> _NameRule | None:
        """The rule that reproduces every instance's name; None when none does."""
        for rule in self.name_rules():
            try:
                if all(self._spell(rule, self._values(d)) == d.name for d in self.defs):
                    return rule
            except KeyError:
                continue
        return None

    def key_fields(self, rule: _NameRule | None) -> tuple[str, ...]:
        """What a call is routed by: the name's fields that are not pinned."""
        if rule is not None:
            fields = rule.fields
        else:
            # No rule names the instances: route by every named const and dtype parameter.
            fields = tuple(d.name for d in self.f.dtype_params) + tuple(
                a.name for a in self.f.axes if isinstance(a, ir.ConstAxis) and a.abbrev
            )
        return tuple(
            f
            for f in fields
            if not (
                f in self.axes and isinstance(self.axes[f], ir.ConstAxis) and self.axes[f].value
            )
        )

    def routable(self, fields: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
        """Fields every call carries: a field read only from an optional buffer is replaced
        by a pinned axis derived from it that an input carries (``input_size = 2 * h``).

        Also returns whether any field was replaced: the name rule then no longer applies.
        """
        out: list[str] = []
        replaced = False
        for f in fields:
            if not self.readable(f):
                for a in self.f.axes:
                    if (
                        isinstance(a, ir.ConstAxis)
                        and a.value is not None
                        and f
                        in {
                            n.id
                            for n in ast.walk(ast.parse(a.value.text))
                            if isinstance(n, ast.Name)
                        }
                        and a.name not in out
                        and self.readable(a.name)
                    ):
                        f, replaced = a.name, True
                        break
            out.append(f)
        return tuple(out), replaced

    def _key_literal(self, fields: tuple[str, ...], values: dict[str, object]) -> str:
        items = [
            _TORCH_DTYPE[str(values[f])] if f in self.dtype_params else _literal(values[f])
            for f in fields
        ]
        return items[0] if len(items) == 1 else _tuple(items)

    def known(self, fields: tuple[str, ...]) -> list[tuple[str, str]]:
        """(key literal, definition name) for every instance."""
        rows: dict[str, str] = {}
        for d in self.defs:
            values = self._values(d)
            missing = [f for f in fields if f not in values]
            if missing:
                raise self.error(f"definition {d.name} has no value for {', '.join(missing)}")
            key = self._key_literal(fields, values)
            if key in rows:
                raise self.error(
                    f"definitions {rows[key]} and {d.name} are routed by the same values"
                )
            rows[key] = d.name
        return list(rows.items())

    def name_function(self, rule: _NameRule, fields: tuple[str, ...]) -> FunctionView:
        """``_name(key)``: the rule applied to a key, for values no instance declares."""
        body = []
        if len(fields) == 1:
            body.append(f"{fields[0]} = key")
        elif fields:
            body.append(f"{', '.join(fields)} = key")
        for f in rule.fields:
            axis = self.axes.get(f)
            if isinstance(axis, ir.ConstAxis) and axis.value is not None:
                # Pinned: a literal, or an expression over the other fields.
                body.append(f"{f} = {axis.value.text}")
        for f in rule.fields:
            if f in self.dtype_params:
                body.append(f"{f} = _DTYPE_PARTS[{f}]")
        spelled = ", ".join(f"{f}={f}" for f in rule.fields)
        body.append(f"return {literal(rule.template)}.format({spelled})")
        return FunctionView("_name", "key", "The definition name of a key.", tuple(body))

    # -------------------------------------------------------------- dispatcher
    def _dims(self, o: ir.Tensor, fields: tuple[str, ...]) -> str | None:
        dims = []
        for axis in o.shape or ():
            declared = self.axes.get(axis)
            pinned = _pinned_literal(declared) if isinstance(declared, ir.ConstAxis) else None
            if axis in fields:
                dims.append(f"_k_{axis}")
            elif pinned is not None:
                dims.append(str(pinned))
            elif self._scaled_field(axis, fields) is not None:
                dims.append(self._scaled_field(axis, fields))
            else:
                carriers = [
                    f"{expr}.shape[{t.shape.index(axis) - len(t.shape)}]"
                    for t, expr, req in self._tensors()
                    if req and t.shape is not None and axis in t.shape and t in self.f.inputs
                ]
                if not carriers:
                    # Only a caller's buffer or a value-returning solution can serve this output.
                    return None
                dims.append(carriers[0])
        return _tuple(dims)

    def alloc(self, o: ir.Tensor, fields: tuple[str, ...]) -> str:
        """An expression that allocates output ``o`` for a routed call.

        Where a required input has the output's axes and dtype, ``torch.empty_like`` of it
        (contiguous): the dispatcher has checked that input's shape, and empty_like costs a
        fraction of ``torch.empty`` with a shape, a dtype and a device.
        """
        if o.shape is None:
            return "None"
        for t in self.f.inputs:
            if not t.optional and t.shape and t.shape == o.shape and t.dtype == o.dtype:
                expr = self.input_expr[t.name]
                return f"torch.empty_like({expr}, memory_format=torch.contiguous_format)"
        dims = self._dims(o, fields)
        if dims is None:
            return f"_api.cannot_allocate({literal(o.name)})"
        return f"torch.empty({dims}, dtype={self._dtype(o)}, device={self._device()})"

    def _scaled_field(self, axis: str, fields: tuple[str, ...]) -> str | None:
        """An axis a key field is pinned to a multiple of (``input_size = 2 * hidden_size``)."""
        for f in fields:
            declared = self.axes.get(f)
            if not isinstance(declared, ir.ConstAxis) or declared.value is None:
                continue
            try:
                tree = ast.parse(declared.value.text, mode="eval").body
            except SyntaxError:
                continue
            if not (isinstance(tree, ast.BinOp) and isinstance(tree.op, ast.Mult)):
                continue
            for a, b in ((tree.left, tree.right), (tree.right, tree.left)):
                if (
                    isinstance(a, ast.Name)
                    and a.id == axis
                    and isinstance(b, ast.Constant)
                    and isinstance(b.value, int)
                    and b.value > 0
                ):
                    return f"_k_{f} // {b.value}"
        return None

    def _dtype(self, o: ir.Tensor) -> str:
        ref = o.dtype
        # A dtype parameter is recognised by its name whatever kind the reference was given.
        if ref.kind != "from" and ref.name in self.dtype_params:
            return f"_k_{ref.name}"
        if ref.kind == "concrete":
            return _TORCH_DTYPE[ref.name]
        if ref.name not in self.input_expr:
            raise self.error(f"output {o.name} copies the dtype of {ref.name}, not an input")
        return f"{self.input_expr[ref.name]}.dtype"

    def _device(self) -> str:
        for t in self.f.inputs:
            if t.shape is not None and not t.optional:
                return f"{self.input_expr[t.name]}.device"
        raise self.error("no required tensor input to take the device of outputs from")

    def _flag(self, o: ir.Tensor) -> str | None:
        """The ``return_<buffer>`` parameter that asks for output ``o``, or None."""
        target = self.targets[o.name]
        if self.f.api is None or target is None or target[0] != "buffer":
            return None
        flag = f"return_{target[1]}"
        return flag if flag in self.run_names else None

    def returned_outputs(self) -> list[tuple[ir.Tensor, str]]:
        """(output, expression) of what the function always returns, in order.

        The family's ``returns`` where it has one (Note [returns] in ``fibgen/compiler/ir.py``),
        else every output not written into an input nor asked for by a flag. An output written
        into a buffer is returned as its local, which holds the caller's buffer once written
        back; one written into an input as the caller's tensor (``_caller_tensor``).
        """
        if self.f.returns is not None and self.f.api is not None:
            by_name = {o.name: o for o in self.f.outputs}
            out = []
            for name in self.f.returns.names:
                o = by_name.get(name)
                if o is None:
                    raise self.error(f"returns names {name}, not an output")
                target = self.targets[o.name]
                inplace = target is not None and target[0] == "inplace"
                out.append((o, self._caller_tensor(o) if inplace else f"_o_{o.name}"))
            return out
        return [
            (o, f"_o_{o.name}")
            for o in self.f.outputs
            if self._flag(o) is None
            and not (self.targets[o.name] is not None and self.targets[o.name][0] == "inplace")
        ]

    def _caller_tensor(self, o: ir.Tensor) -> str:
        """The caller's own tensor that output ``o`` is written into, as the API returns it.

        Where the input reads a whole argument, the argument itself, not the view a `let` may
        make of it (a layout converted for the definition would be returned converted); for an
        element of a tuple argument or a plan parameter, the tensor the input reads.
        """
        if o.target in self.run_names:
            return o.target  # `_target` found an input that reads the whole argument
        t = next(t for t in self.f.inputs if t.name == o.target)
        src = t.source
        if src is None and t.name in self.run_names:
            return t.name
        if src is not None and not src.from_plan and src.index is None:
            return src.param
        return self.input_expr[t.name]

    def _returned(self) -> tuple[list[str], list[tuple[str, str]]]:
        """What the function returns: always, and (output, flag) when a flag asks."""
        always = [expr for _, expr in self.returned_outputs()]
        named = set(self.f.returns.names) if self.f.returns is not None else set()
        # FlashInfer's convention: ``return_lse=True`` adds lse to the result.
        flagged = [
            (f"_o_{o.name}", self._flag(o))
            for o in self.f.outputs
            if self._flag(o) is not None and o.name not in named
        ]
        return always, flagged

    def _effect_expr(self, e: ir.Effect) -> str:
        """An effect's expression with the definition's inputs spelled as the call's arguments."""
        spelled = {
            name: ast.parse(expr, mode="eval").body for name, expr in self.input_expr.items()
        }

        class Spell(ast.NodeTransformer):
            def visit_Name(self, node: ast.Name) -> ast.AST:
                return spelled.get(node.id, node)

        tree = Spell().visit(ast.parse(e.expr.text, mode="eval"))
        return unparse(tree)

    def _result_expr(self, r: ir.Result) -> str:
        """A `result` rule's expression over the outputs, inputs and arguments of the call."""
        spelled = {o.name: f"_o_{o.name}" for o in self.f.outputs}
        for name, expr in self.input_expr.items():
            spelled.setdefault(name, expr)
        spelled.update((k, v) for k, v in self.run_var.items() if k not in spelled)
        nodes = {k: ast.parse(v, mode="eval").body for k, v in spelled.items()}

        class Spell(ast.NodeTransformer):
            def visit_Name(self, node: ast.Name) -> ast.AST:
                return nodes.get(node.id, node)

        return unparse(Spell().visit(ast.parse(r.expr.text, mode="eval")))

    def _defaults_to_none(self, param: str) -> bool:
        return any(p.name == param and p.default == "None" for p in self.params)

    def _axis_reader(self, name: str) -> str | None:
        """An axis read from the first required input tensor that carries it."""
        for t, expr, req in self._tensors():
            if req and t.shape is not None and name in t.shape and t in self.f.inputs:
                return f"{expr}.shape[{t.shape.index(name) - len(t.shape)}]"
        return None

    def _tensor_dtype(self, t: ir.Tensor, fields: tuple[str, ...]) -> str | None:
        ref = t.dtype
        if ref.kind != "from" and ref.name in self.dtype_params:
            return f"_k_{ref.name}" if ref.name in fields else None
        if ref.kind == "concrete":
            return _dtype_constant(ref.name)
        return f"{self.input_expr[ref.name]}.dtype" if ref.name in self.input_expr else None

    def rule_plan(self, fields: tuple[str, ...]) -> RulePlan:
        """The checks of the family's rules and of its input tensors (Note [rules])."""
        readers = {f: self._reader(f) for f in fields}
        speller = RuleSpeller(self.f, fields, self._axis_reader, readers)
        tensors = []
        for t in self.f.inputs:
            if t.shape is None:
                continue
            dtype = self._tensor_dtype(t, fields)
            if dtype is not None:
                tensors.append((t.name, self.input_expr[t.name], t.optional, dtype, t.shape))
        speller.tensor_checks(tensors)
        return speller.plan

    def _result_check(self, o: ir.Tensor, local: str, fields: tuple[str, ...]) -> str | None:
        """The condition a value-returning solution's output meets, or None for a scalar."""
        if o.shape is None:
            return None
        dtype = self._dtype(o)
        if o.dtype.kind == "concrete" and o.dtype.name not in self.dtype_params:
            dtype = _dtype_constant(o.dtype.name)
        parts = [f"isinstance({local}, _Tensor)", f"{local}.dtype is {dtype}"]
        # An input of the very same axes gives the expected shape in one comparison.
        same = next(
            (
                self.input_expr[t.name]
                for t in self.f.inputs
                if t.shape == o.shape and not t.optional
            ),
            None,
        )
        if same is not None:
            parts.append(f"{local}.shape == {same}.shape")
        else:
            dims = self._dims(o, fields)
            parts.append(
                f"{local}.shape == {dims}"
                if dims is not None
                else f"{local}.ndim == {len(o.shape)}"
            )
        # No device comparison on the hot path: a result on another device fails loudly at
        # its first use, while a wrong dtype or shape could broadcast or cast silently.
        cond = " and ".join(parts)
        return f"{local} is None or ({cond})" if o.optional else cond

    def dispatcher(self, fields: tuple[str, ...], plan: RulePlan) -> FunctionView:
        """The family's function: the body of Note [the dispatch contract]."""
        forward = _forward(self.params)
        body = [
            # Note [custom ops]: torch.compile traces the op, not the routing.
            "if _compiling():",
            f"    return _compiled({forward})",
            "if _api.direct is not None:",
            f"    return _api.direct({forward})",
        ]
        if self.f.plan is not None:
            instance = self.params[0].name
            body += [
                f"_plan = _plans.get({instance})",
                "if _plan is None:",
                f"    return _api.miss({forward})",
            ]
        # The lets the key needs, then the key: a call they fail on is a call not routed.
        readers = {f: self._reader(f) for f in fields}
        early, late = _split_lets(plan.call_lets, list(readers.values()))
        body += ["_r = -3", "try:"]
        body += _let_lines(early, "    ")
        if early:
            body.append("    _r = -3")
        for f in fields:
            body.append(f"    _k_{f} = {readers[f]}")
        if not fields:
            body.append("    pass")
        body += [
            "except Exception:",
            f"    return _api.refuse(None, _r, {forward})[1]({forward})",
        ]
        if not fields:
            key = "None"
        elif len(fields) == 1:
            key = f"_k_{fields[0]}"
        else:
            key = "(" + ", ".join(f"_k_{f}" for f in fields) + ")"
        body += [
            f"_key = {key}",
            "_route = _routes.get(_key)",
            "if _route is None:",
            "    _route = _api.resolve(_key)",
            "_kind, _fn, _tick, _v = _route",
            "if _kind == ORIGINAL:",
            "    _tick()",
            f"    return _fn({forward})",
        ]
        body.append("_r = _plan[-1]" if self.f.plan is not None else "_r = -1")
        if plan.call_checks or late:
            # The other lets, then every check; a let that raises is refused by its own rule.
            indent = "    " if self.f.plan is not None else ""
            if self.f.plan is not None:
                body.append("if _r == -1:")
            body.append(f"{indent}try:")
            body += _let_lines(late, indent + "    ")
            if late:
                body.append(f"{indent}    _r = -1")
            for i, check in enumerate(plan.call_checks):
                word = "if" if i == 0 else "elif"
                body += [
                    f"{indent}    {word} not ({check.condition}):",
                    f"{indent}        _r = {check.index}",
                ]
            body += [f"{indent}except Exception:"]
            if late:
                body += [f"{indent}    if _r == -1:", f"{indent}        _r = -2"]
            else:
                body.append(f"{indent}    _r = -2")
        body += [
            "if _r != -1:",
            f"    _kind, _fn, _tick = _api.refuse(_key, _r, {forward})",
            "    if _kind == ORIGINAL:",
            f"        return _fn({forward})",
            "_tick()",
        ]
        body += self._call_solution(fields, forward)
        body = self._cache_shapes(body)
        return FunctionView(self.f.name, _signature(self.params), self._doc(), tuple(body))

    def _cache_shapes(self, body: list[str]) -> list[str]:
        """Read each required input's shape once (Note [shape cache]).

        Note [shape cache]
        ~~~~~~~~~~~~~~~~~~
        A tensor's ``.shape`` costs about 0.1 µs (a new ``torch.Size``), ``.ndim`` about
        0.05 µs; the hit path read the shape of the key's tensor up to four times (key, rank,
        sizes, the result's expected shape). A required input whose size is read for the key
        has its shape taken once, first thing in the key's ``try`` (where an argument that is
        not a tensor fails as it did before), and every later ``expr.shape``/``expr.ndim``
        reads that. A required input that only the checks read more than once has its shape
        taken just before the first check (after the lets the checks may read): an argument
        that is not a tensor is then refused there, as a check that raises is (``_r = -2``).
        """
        key_at = next((i for i, line in enumerate(body) if line.startswith("    _k_")), None)
        if key_at is None:
            return body  # no key: nothing read before the checks
        key_end = body.index("except Exception:", key_at)
        required = [
            (f"_s_{t.name}", expr)
            for t, expr, req in self._tensors()
            if req and t in self.f.inputs and t.shape is not None
        ]
        cached = [
            (v, e) for v, e in required if any(f"{e}.shape[" in x for x in body[key_at:key_end])
        ]
        out = body[:key_at] + [f"    {var} = {expr}.shape" for var, expr in cached]
        for line in body[key_at:]:
            for var, expr in cached:
                line = _spelled(line, expr, var)
            out.append(line)
        # The checks' try: the first `try:` after the route is taken.
        checks_at = next(
            (i for i in range(key_end + 1, len(out)) if out[i].strip() == "try:"), None
        )
        if checks_at is None:
            return out
        end = next(i for i in range(checks_at, len(out)) if out[i].strip() == "except Exception:")
        # After the lets (which the checks may read), before the first check.
        first = next(
            (i for i in range(checks_at, end) if out[i].lstrip().startswith("if not (")), None
        )
        if first is None:
            return out
        checks = out[first:end]
        indent = out[first][: len(out[first]) - len(out[first].lstrip())]
        bound = []
        for var, expr in required:
            if (var, expr) in cached:
                continue
            reads = sum(
                len(_shape_pattern(expr, a).findall(x)) for x in checks for a in ("shape", "ndim")
            )
            if reads >= 2:
                bound.append(f"{indent}{var} = {expr}.shape")
                checks = [_spelled(x, expr, var) for x in checks]
        return out[:first] + bound + checks + out[end:]

    def _doc(self) -> str:
        if self.f.api is not None:
            return f"Route ``{self.f.api.path}`` to the solution registered for its definition."
        return f"Run family ``{self.f.name}``: a registered solution, else the reference."

    def inplace_capable(self) -> bool:
        """Whether INPLACE routes are called (Note [in-place solutions] in apply.py): the
        family has effects, and nothing to do after the solution but return its outputs."""
        _, flagged = self._returned()
        return (
            bool(self.f.effects)
            and not flagged
            and not any(isinstance(r, ir.Result) for r in self.f.rules)
        )

    def _call_inplace(self, fields: tuple[str, ...], inputs: str) -> list[str]:
        """The INPLACE branch: the API's own buffers, effects done by the solution."""
        if not self.inplace_capable():
            return []
        lines = ["elif _kind == INPLACE:"]
        for o in self.f.outputs:
            target = self.targets[o.name]
            local = f"_o_{o.name}"
            if target is not None and target[0] == "inplace":
                lines.append(f"    {local} = {target[1]}")
                continue
            alloc = self.alloc(o, fields)
            if target is not None:
                lines += [
                    f"    {local} = {target[1]}",
                    f"    if {local} is None:",
                    f"        {local} = {alloc}",
                ]
            else:
                lines.append(f"    {local} = {alloc}")
        buffers = "".join(f", {o.name}=_o_{o.name}" for o in self.f.outputs)
        lines.append(f"    _fn({inputs}{buffers}, inplace=True)")
        always, _ = self._returned()
        lines.append(f"    return {', '.join(always)}" if always else "    return None")
        return lines

    def _call_solution(self, fields: tuple[str, ...], forward: str) -> list[str]:
        """Call the route's solution, check what it returns, write the outputs back.

        A solution that raises or returns what the definition does not declare hands the
        call to ``_api.failed``, which gives the route of the fallback: the original API,
        whose result is returned, or the reference, which runs here in its place.
        """
        inputs = ", ".join(f"{t.name}={self.input_expr[t.name]}" for t in self.f.inputs)
        outs = [f"_o_{o.name}" for o in self.f.outputs]
        call = ["if _kind == RETURNS:"]
        if len(outs) == 1:
            call.append(f"    {outs[0]} = _fn({inputs})")
        else:
            call += [
                f"    _res = _fn({inputs})",
                f"    if not (isinstance(_res, tuple) and len(_res) == {len(outs)}):",
                "        _api.bad_result(_key, None, _res)",
            ]
            if outs:
                call.append(f"    {', '.join(outs)} = _res")
        for o in self.f.outputs:
            cond = self._result_check(o, f"_o_{o.name}", fields)
            if cond is not None:
                call += [
                    f"    if not ({cond}):",
                    f"        _api.bad_result(_key, {literal(o.name)}, _o_{o.name})",
                ]
        call += self._call_inplace(fields, inputs)
        call.append("else:")
        for o in self.f.outputs:
            target = self.targets[o.name]
            alloc = self.alloc(o, fields)
            if target is not None and target[0] == "buffer":
                # The caller's buffer, else a new one; as statements, which black leaves as
                # they are where it would split a long conditional expression.
                call += [
                    f"    _o_{o.name} = {target[1]}",
                    f"    if _o_{o.name} is None:",
                    f"        _o_{o.name} = {alloc}",
                ]
            else:
                call.append(f"    _o_{o.name} = {alloc}")
        buffers = "".join(f", {o.name}=_o_{o.name}" for o in self.f.outputs)
        call.append(f"    _fn({inputs}{buffers})")
        body = ["while True:", "    try:"]
        body += [f"        {line}" for line in call]
        body += [
            "        break",
            "    except Exception as _exc:",
            f"        _kind, _fn, _ = _api.failed(_key, _fn, _exc, {forward})",
            "        if _kind == ORIGINAL:",
            f"            return _fn({forward})",
        ]
        # `result` rules: outputs as the API returns them (Note [rules]).
        for r in self.f.rules:
            if isinstance(r, ir.Result):
                body.append(f"_o_{r.target} = {self._result_expr(r)}")
        # Note [effects]: computed before any write-back, stored after it.
        stores = []
        for e in self.f.effects:
            body.append(f"_e_{e.target} = {self._effect_expr(e)}")
            if self._defaults_to_none(e.target):
                stores += [f"if {e.target} is not None:", f"    {e.target}.copy_(_e_{e.target})"]
            else:
                stores.append(f"{e.target}.copy_(_e_{e.target})")
        for o in self.f.outputs:
            target = self.targets[o.name]
            if target is None:
                continue
            local = f"_o_{o.name}"
            produced = f" and {local} is not None" if o.optional else ""
            if target[0] == "buffer":
                body += [
                    f"if {target[1]} is not None{produced} and {local} is not {target[1]}:",
                    f"    {target[1]}.copy_({local})",
                    f"    {local} = {target[1]}",
                ]
            else:
                body += [
                    f"if {local} is not {target[1]}{produced}:",
                    f"    {target[1]}.copy_({local})",
                ]
        body += stores
        always, flagged = self._returned()
        if flagged:
            extra = " + ".join(f"(({local},) if {flag} else ())" for local, flag in flagged)
            # With nothing else returned, a call that asks for no flag returns None.
            rest = "_result" if always else "(_result or None)"
            body += [
                f"_result = {_tuple(always)} + {extra}",
                f"return _result[0] if len(_result) == 1 else {rest}",
            ]
        elif always:
            body.append(f"return {', '.join(always)}")
        else:
            body.append("return None")
        return body

    def trace_functions(self, plan: RulePlan) -> tuple[FunctionView, FunctionView]:
        """``_inputs`` and ``_var_axes``: what tracing records of a call.

        See Note [tracing hooks] in ``fibgen/runtime/tracing.py``.
        """
        instance = self.params[0].name if self.f.plan is not None else None
        body = [f"_plan = _plans[{instance}]"] if instance is not None else []
        body += [statement for _, statement in plan.call_lets]
        body.append(f"return {_tuple([self.input_expr[t.name] for t in self.f.inputs])}")
        inputs = FunctionView(
            "_inputs",
            _signature(self.params),
            "The definition's inputs of a call, in order.",
            tuple(body),
        )
        readers = []
        for axis in self.f.axes:
            if not isinstance(axis, ir.VarAxis):
                continue
            carriers = [
                (f"{t.name}.shape[{t.shape.index(axis.name) - len(t.shape)}]", t.optional)
                for t in self.f.inputs
                if t.shape is not None and axis.name in t.shape
            ]
            carriers.sort(key=lambda c: c[1])
            if not carriers:
                # No input carries it (the definition is invalid for flashinfer-bench too).
                continue
            # Required carriers first; an optional one is read only when it was given.
            chain = "None"
            for expr, optional in reversed(carriers):
                base = expr.partition(".")[0]
                chain = f"({expr} if {base} is not None else {chain})" if optional else expr
            readers.append(f"{literal(axis.name)}: {chain}")
        names = [t.name for t in self.f.inputs]
        axes = FunctionView(
            "_var_axes",
            ", ".join([*names, "**_buffers"]),
            "The var-axis values of a call, read from the shapes of its inputs.",
            ("return {" + ", ".join(readers) + "}",),
        )
        return inputs, axes

    def capture_function(self, plan: RulePlan) -> FunctionView:
        """``_capture``: keep what ``plan()`` received, and the first plan rule it fails.

        The runtime calls it after each successful ``plan()`` of a wrapper
        (Note [the dispatch contract]).
        """
        instance = self.plan_params[0].name
        values = [expr for _, expr in plan.captured]
        body = ["try:"]
        body += [f"    {line}" for line in plan.capture_lets]
        body.append("    _r = -1")
        for i, check in enumerate(plan.capture_checks):
            word = "if" if i == 0 else "elif"
            body += [f"    {word} not ({check.condition}):", f"        _r = {check.index}"]
        body += [
            f"    _plans[{instance}] = {_tuple(values + ['_r'])}",
            "except Exception:",
            "    # A plan rule that cannot be evaluated: runs after this plan are not routed.",
            f"    _plans[{instance}] = {_tuple(['None'] * len(values) + ['-2'])}",
        ]
        path = self.f.plan.path
        return FunctionView(
            "_capture",
            _signature(self.plan_params),
            f"Keep what ``{path}`` received for this wrapper, and the first plan rule it fails.",
            tuple(body),
        )

    def const_function(self, fields: tuple[str, ...], plan: RulePlan) -> FunctionView:
        """``_const_check(key, values)``: the first rule a definition fails, or -1."""
        body = []
        if len(fields) == 1:
            body.append(f"_k_{fields[0]} = _key")
        elif fields:
            body.append(f"{', '.join(f'_k_{f}' for f in fields)} = _key")
        for check in plan.const_checks:
            body += [f"if not ({check.condition}):", f"    return {check.index}"]
        body.append("return -1")
        return FunctionView(
            "_const_check",
            "_key, _v",
            "The first rule over the definition's values that fails, or -1.",
            tuple(body),
        )


def _shape_pattern(expr: str, attr: str) -> re.Pattern:
    """``expr.attr`` where ``expr`` stands alone (not the tail of a longer name or index)."""
    return re.compile(r"(?<![\w.\]])" + re.escape(expr) + r"\." + attr + r"\b")


def _spelled(line: str, expr: str, var: str) -> str:
    """``line`` reading the shape of ``expr`` from ``var`` (Note [shape cache])."""
    line = _shape_pattern(expr, "ndim").sub(lambda _: f"len({var})", line)
    return _shape_pattern(expr, "shape").sub(lambda _: var, line)


def _split_lets(
    lets: list[tuple[int, str]], needed_by: list[str]
) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The lets the key reads (and those they read), and the rest, which wait for a route."""
    needed = set(_LOCAL.findall(" ".join(needed_by)))
    early: list[tuple[int, str]] = []
    for index, statement in reversed(lets):
        target, _, value = statement.partition(" = ")
        if target in needed:
            early.append((index, statement))
            needed |= set(_LOCAL.findall(value))
    early.reverse()
    late = [item for item in lets if item not in early]
    return early, late


def _let_lines(lets: list[tuple[int, str]], indent: str) -> list[str]:
    lines = []
    last = None
    for index, statement in lets:
        if index != last:
            lines.append(f"{indent}_r = {index}")
            last = index
        lines.append(f"{indent}{statement}")
    return lines


_LOCAL = re.compile(r"\b_[lw]_[A-Za-z0-9_]+")


def _dtype_constant(name: str) -> str:
    """A module-level name for a torch dtype: the hot path reads no attribute of torch."""
    return f"_{name.upper()}"


# ---------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------

_RUNTIME_NAMES = ("ORIGINAL", "RETURNS", "register_api")


def _runtime_import(names: tuple[str, ...], signatures: Iterable[ir.ApiSignature | None]) -> str:
    """The runtime import line, with ApiDefault when a signature needs its placeholder."""
    params = [p for sig in signatures if sig is not None for p in sig.params]
    if any(p.default is not None and _default(p.default) != p.default for p in params):
        names = names + ("ApiDefault",)
    return f"from fibgen.runtime.apply import {', '.join(sorted(names))}"


def _dict_lines(name: str, rows: Iterable[tuple[str, str]]) -> list[str]:
    # One entry per line with a trailing comma, which black keeps; an empty one as black has it.
    rows = list(rows)
    if not rows:
        return [f"{name} = {{}}"]
    return [f"{name} = {{", *(f"    {k}: {v}," for k, v in rows), "}"]


def _family_module(
    family: ir.Family,
    definitions: list[ir.Definition],
    label: str,
    patch: bool,
    then: str | None,
    foreign: frozenset[str] = frozenset(),
    namespace: str = "fibgen",
) -> ModuleView:
    view = _Family(family, definitions, label)
    rule = view.name_rule()
    fields, replaced = view.routable(view.key_fields(rule))
    if replaced:
        # Routed by a derived size: only the instances' own values have names.
        rule = None
    plan = view.rule_plan(fields)
    dispatcher = view.dispatcher(fields, plan)
    functions = []
    tables = _dict_lines("_KNOWN", ((k, literal(n)) for k, n in view.known(fields)))
    if family.dtype_params:
        choices = sorted({c for d in family.dtype_params for c in d.choices})
        parts = ((_TORCH_DTYPE[c], literal(ir.DTYPE_NAME_PART[c])) for c in choices)
        tables += _dict_lines("_DTYPE_PARTS", parts)
    if rule is not None:
        functions.append(view.name_function(rule, fields))
    # References are embedded once per distinct text and compiled on first use only.
    texts: dict[str, str] = {}
    for d in view.defs:
        if d.reference is not None:
            texts.setdefault(d.reference, f"_REFERENCE_{len(texts)}")
    if family.reference is not None:
        texts.setdefault(family.reference, f"_REFERENCE_{len(texts)}")
    tables += [f"{const} = {literal(text)}" for text, const in texts.items()]
    tables += _dict_lines(
        "_REFERENCES",
        ((literal(d.name), texts[d.reference]) for d in view.defs if d.reference is not None),
    )
    # Note [rules]: what the checks are called, and the definition values they read.
    tables.append(f"_RULES = {literal(tuple(plan.names))}")
    described = {
        t.name: (
            (
                t.dtype.name
                if t.dtype.kind == "concrete" and t.dtype.name not in view.dtype_params
                else None
            ),
            list(t.shape),  # a list: the comma of a 1-tuple would make black explode it
        )
        for t in family.inputs
        if t.shape is not None
    }
    # One statement: format_python hands it to black whole when it is too long.
    tables.append("_TENSORS = " + inline_dict(described))
    if plan.values:
        rows = []
        for d in view.defs:
            given = dict(d.param_values)
            rows.append((literal(d.name), literal(tuple(given[p] for p in plan.values))))
        tables += _dict_lines("_VALUES", rows)
        declared = {p.name: p.default for p in family.params}
        defaults = tuple(declared.get(p) for p in plan.values)
        tables.append(f"_DEFAULTS = {literal(defaults) if None not in defaults else None}")
    if family.params:
        # Parameter values of a name no instance declares: its name's fields, else defaults.
        tables.append(
            "_PARAM_DEFAULTS = "
            + literal({p.name: p.default for p in family.params if p.default is not None})
        )
    if foreign:
        tables.append(f"_FOREIGN = frozenset({literal(tuple(sorted(foreign)))})")
    tables += _constants(family)
    runtime_names = _RUNTIME_NAMES + (("INPLACE",) if view.inplace_capable() else ())
    imports = ["import torch", "", _runtime_import(runtime_names, (family.api, family.plan))]
    # The math the rules use: `math.sqrt`, or a bare `sqrt` as in constraints.
    spelled = [line for fn in functions + [dispatcher] for line in fn.body]
    spelled += [c.condition for c in plan.capture_checks + plan.call_checks + plan.const_checks]
    spelled += plan.capture_lets + [line for _, line in plan.call_lets]
    maths = module_names([line.strip() for line in spelled])
    if "math" in maths:
        imports.insert(0, "import math")
    bare = sorted(maths - {"math"})
    if bare:
        imports.insert(imports.index("import torch") + 1, f"from math import {', '.join(bare)}")
    if plan.helpers:
        imports.append(f"from fibgen.runtime.rulefns import {', '.join(sorted(plan.helpers))}")
    options = [
        f"path={literal(family.api.path if family.api else None)}",
        f"patch={patch}",
        "known=_KNOWN",
        f"name_rule={'_name' if rule is not None else None}",
        f"inputs={literal(tuple(t.name for t in family.inputs))}",
        f"outputs={literal(tuple(t.name for t in family.outputs))}",
        "references=_REFERENCES",
        f"family_reference={texts.get(family.reference) if family.reference else None}",
        "rules=_RULES",
        "tensors=_TENSORS",
    ]
    if plan.values:
        options += ["values=_VALUES", "defaults=_DEFAULTS"]
    if family.params:
        options += [
            f"params={literal(tuple(p.name for p in family.params))}",
            "param_defaults=_PARAM_DEFAULTS",
            f"key_fields={literal(tuple(fields))}",
        ]
    if foreign:
        options.append("foreign=_FOREIGN")
    if view.inplace_capable():
        options.append("inplace=True")
    if plan.const_checks:
        functions.append(view.const_function(fields, plan))
        options.append("const_check=_const_check")
    registration = [
        f"_api = register_api({literal(label)}, {family.name}, {{options}})",
        "_routes = _api.routes",
    ]
    if family.plan is not None:
        functions.append(view.capture_function(plan))
        options += [f"plan_path={literal(family.plan.path)}", "capture=_capture"]
        # Plan-time arguments per wrapper instance, kept by the runtime under weak keys.
        registration.append("_plans = _api.plans")
    if then is not None:
        # Another family stands for the same API: a call this one cannot route goes there.
        imports.append(f"from . import {then} as _then")
        options.append(f"then=_then.{then}")
    functions += view.trace_functions(plan)
    options += [
        f"op_type={literal(family.op_type)}",
        "trace_inputs=_inputs",
        "trace_axes=_var_axes",
    ]
    functions.append(dispatcher)
    # Note [custom ops]: what torch.compile traces instead of the dispatcher.
    ops = OpView(view, fields, plan, _forward(view.params), _signature(view.params))
    functions.append(FunctionView(*ops.compiled()))
    if ops.reason is None:
        functions += [FunctionView(*ops.impl()), FunctionView(*ops.fake())]
        imports.append(
            "from fibgen.runtime.ops import decode as _decode, fresh as _fresh, pack as _pack"
        )
        registration += list(ops.registration(namespace, view.known(fields)))
    if family.api is not None:
        doc = f"Dispatcher of family {family.name}: routes ``{family.api.path}`` to solutions."
    else:
        doc = f"Dispatcher of family {family.name}: routes calls to solutions or the reference."
    registration[0] = registration[0].format(options=", ".join(options))
    return ModuleView(doc, tuple(imports), tuple(tables), tuple(functions), tuple(registration))


def _constants(family: ir.Family) -> list[str]:
    """Module-level names of the torch objects the hot path compares against."""
    names = sorted(
        {
            t.dtype.name
            for t in family.inputs + family.outputs
            if t.dtype.kind == "concrete"
            and t.dtype.name not in {d.name for d in family.dtype_params}
        }
    )
    # Dynamo folds is_dynamo_compiling to True where it traces; eagerly it is a function that
    # returns False, which costs a third of is_compiling's (which asks torch.jit first): 0.08
    # µs of a hit on the 2-core machine. (torch before 2.3 has only is_compiling.)
    compiling = (
        '_compiling = getattr(torch.compiler, "is_dynamo_compiling", None) '
        "or torch.compiler.is_compiling"
    )
    return ["_Tensor = torch.Tensor", compiling] + [
        f"{_dtype_constant(n)} = {_TORCH_DTYPE[n]}" for n in names
    ]


def _group_module(group: ir.DispatchGroup, families: dict[str, ir.Family]) -> ModuleView:
    members = []
    for case in group.cases:
        for name in case.families:
            family = families.get(name)
            if family is None:
                raise DispatchGenError(f"{group.span}: dispatch {group.name}: no family {name}")
            if family.api is None:
                raise DispatchGenError(
                    f"{group.span}: dispatch {group.name}: family {family.name} declares no api"
                )
        members.append((case, families[case.family]))
    first = members[0][1]
    api = first.api
    for _, family in members[1:]:
        if family.api != api:
            raise DispatchGenError(
                f"{group.span}: dispatch {group.name}: families {first.name} and {family.name} "
                "declare different APIs; a dispatch group stands for one API"
            )
    if group.selector not in api.param_names():
        raise DispatchGenError(
            f"{group.span}: dispatch {group.name}: selector {group.selector} is not a parameter "
            f"of {api.path}"
        )
    forward = _forward(api.params)
    body = (
        "if _api.direct is not None:",
        f"    return _api.direct({forward})",
        f"_family = _FAMILIES.get({group.selector})",
        "if _family is None:",
        f"    return _api.miss({forward})",
        f"return _family({forward})",
    )
    dispatcher = FunctionView(
        group.name,
        _signature(api.params),
        f"Route ``{api.path}`` by ``{group.selector}`` to its family's dispatcher.",
        body,
    )
    names = sorted({f.name for _, f in members})
    imports = (
        _runtime_import(("register_api",), (api,)),
        "",
        *(f"from . import {n} as _{n}" for n in names),
    )
    rows = ((literal(c.value), f"_{f.name}.{f.name}") for c, f in members)
    return ModuleView(
        f"Dispatcher of {api.path}: {group.selector} picks the family, which routes the call.",
        imports,
        tuple(_dict_lines("_FAMILIES", rows)),
        (dispatcher,),
        (f"_api = register_api({literal(api.path)}, {group.name}, path={literal(api.path)})",),
    )


def _package_module(apis: dict[str, str], definitions: dict[str, str]) -> ModuleView:
    tables = (
        *_dict_lines("APIS", ((literal(p), literal(m)) for p, m in sorted(apis.items()))),
        *_dict_lines(
            "DEFINITIONS", ((literal(d), literal(m)) for d, m in sorted(definitions.items()))
        ),
        "",
        "register_package(__name__, APIS, DEFINITIONS)",
    )
    return ModuleView(
        "Generated dispatchers: import a module to route its API to registered solutions.",
        ("from fibgen.runtime import register_package",),
        tables,
        (),
        (),
    )


def emit_python_dispatch(module: ir.Module, package: str) -> list[GeneratedFile]:
    """Generate ``python/<package>/`` for a compiled module: one file per family and group."""
    views, sources = plan_dispatch(module, package)
    names = sorted(views)
    # Written as black writes but for long statements, which format_python hands to black.
    texts = format_python(
        [render("python_dispatch.py.j2", view=views[n]) for n in names],
        written_in_black_style=True,
    )
    files = [
        GeneratedFile(
            f"python/{package}/{name}.py",
            with_python_header(text, source_label(sources[name])),
            source_label(sources[name]),
        )
        for name, text in zip(names, texts)
    ]
    return sorted(files, key=lambda f: f.path)


def plan_dispatch(module: ir.Module, package: str) -> tuple[dict[str, ModuleView], dict[str, str]]:
    """Decide every dispatcher module (raising DispatchGenError), without printing them.

    ``fibgen check`` runs this too, so that it reports what ``fibgen build`` would.
    """
    if not package.isidentifier():
        raise DispatchGenError(f"package name {package!r} is not a Python identifier")
    sources = {f.name: sf.path for sf in module.files for f in sf.families}
    sources |= {g.name: sf.path for sf in module.files for g in sf.dispatches}
    families = {f.name: f for f in module.families()}
    grouped = {name for g in module.dispatches() for case in g.cases for name in case.families}
    definitions: dict[str, list[ir.Definition]] = {name: [] for name in families}
    for d in module.definitions:
        definitions.setdefault(d.family, []).append(d)
    apis: dict[str, str] = {}
    by_definition: dict[str, str] = {}
    views: dict[str, ModuleView] = {}

    def claim(path: str, owner: str) -> None:
        if path in apis:
            raise DispatchGenError(
                f"{apis[path]} and {owner} both stand for {path}; a dispatch group cannot share "
                "its API with a family outside it"
            )
        apis[path] = owner

    # Families outside dispatch groups that stand for one API form a chain, in source order:
    # the first patches the API, and each passes the calls it cannot route to the next.
    chains: dict[str, list[str]] = {}
    for family in module.families():
        if family.api is not None and family.name not in grouped:
            chains.setdefault(family.api.path, []).append(family.name)
    # A dispatch case of several families chains them likewise; only its first is entered.
    case_chains = [
        list(case.families)
        for g in module.dispatches()
        for case in g.cases
        if len(case.families) > 1
    ]
    all_chains = list(chains.values()) + case_chains
    then = {a: b for chain in all_chains for a, b in zip(chain, chain[1:])}
    heads = {chain[0] for chain in chains.values()}
    # Names another family of the same API declares: a name rule never claims them.
    foreign: dict[str, frozenset[str]] = {}
    for chain in all_chains:
        for member in chain:
            foreign[member] = frozenset(
                d.name for other in chain if other != member for d in definitions[other]
            )
    for name in sorted(families):
        family = families[name]
        label = family.api.path if family.api is not None else f"{package}.{name}"
        views[name] = _family_module(
            family,
            definitions[name],
            label,
            name in heads,
            then.get(name),
            foreign.get(name, frozenset()),
            "fibgen" if package == "fibgen_kernels" else package,
        )
        if name in heads:
            claim(family.api.path, name)
        by_definition.update((d.name, name) for d in definitions[name])
    for group in sorted(module.dispatches(), key=lambda g: g.name):
        if group.name in views:
            raise DispatchGenError(f"{group.span}: dispatch {group.name}: a family has that name")
        views[group.name] = _group_module(group, families)
        claim(families[group.cases[0].family].api.path, group.name)
    # The package index gathers every file: an aggregate, whose source is left empty.
    views["__init__"] = _package_module(apis, by_definition)
    sources["__init__"] = ""
    return views, sources
