"""The IR-level plan of a family's dispatcher: sources, targets, key readers, outputs, rules."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from fibgen.codegen.errors import GenerateError
from fibgen.codegen.python.dispatch.rules import RulePlan, RuleSpeller, captured_names, unparse
from fibgen.codegen.python.pyliteral import literal
from fibgen.compiler import ir

# torch spells every format dtype by its own name except fp4, which it only has packed in pairs.
TORCH_DTYPE = {d: f"torch.{d}" for d in ir.DTYPES} | {"float4_e2m1": "torch.float4_e2m1fn_x2"}


class DispatchGenError(GenerateError):
    """A family that cannot get a dispatcher; the message names the family and the reason."""


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


def signature_text(params: Iterable[ir.ApiParam]) -> str:
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
            parts.append(p.name if p.default is None else f"{p.name}={default_text(p.default)}")
    return ", ".join(parts)


def default_text(text: str) -> str:
    # A default that is not a literal (``ActivationType.Swiglu.value``) names something of the
    # API's module; the runtime puts in the real value once it finds the API.
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return f"ApiDefault({literal(text)})"
    return text


def forward_args(params: Iterable[ir.ApiParam]) -> str:
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


def py_literal(value: object) -> str:
    return literal(value)


def tuple_text(items: list[str]) -> str:
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


def dtype_constant(name: str) -> str:
    """A module-level name for a torch dtype: the hot path reads no attribute of torch."""
    return f"_{name.upper()}"


class FamilyPlan:
    """What one family's dispatcher must do, as expressions over the arguments of a call."""

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

    def reader(self, name: str) -> str:
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

    def assigned(self, name: str) -> str:
        """``reader(name)`` as the right-hand side of an assignment: without the outer
        parentheses a conditional needs inside another expression (black removes them)."""
        chain = self.reader(name)
        return chain[1:-1] if self._options(name)[0][1] is not None else chain

    # ------------------------------------------------------------------ outputs
    def dims(self, o: ir.Tensor, fields: tuple[str, ...], derived: bool = False) -> str | None:
        """Output ``o``'s shape for a call, or None where an axis cannot be read from it;
        ``derived``: a const axis given by an expression is computed (``_derived``) where
        nothing else reads it (Note [output buffers] in ``rules.py``)."""
        dims = []
        for axis in o.shape or ():
            declared = self.axes.get(axis)
            pinned = _pinned_literal(declared) if isinstance(declared, ir.ConstAxis) else None
            if axis in fields:
                dims.append(f"_k_{axis}")
            elif pinned is not None:
                dims.append(str(pinned))
            elif (scaled := self._scaled_field(axis, fields)) is not None:
                dims.append(scaled)
            elif isinstance(declared, ir.VarAxis) and declared.scalar:
                # The value of the scalar input of its name (Note [axes bound by a scalar]).
                dims.append(self.input_expr[axis])
            else:
                carriers = [
                    f"{expr}.shape[{t.shape.index(axis) - len(t.shape)}]"
                    for t, expr, req in self._tensors()
                    if req and t.shape is not None and axis in t.shape and t in self.f.inputs
                ]
                if carriers:
                    dims.append(carriers[0])
                elif derived and (expr := self._derived(axis, fields, ())) is not None:
                    dims.append(expr)
                else:
                    # Only a caller's buffer or a value-returning solution can serve this output.
                    return None
        return tuple_text(dims)

    def _derived(self, axis: str, fields: tuple[str, ...], seen: tuple[str, ...]) -> str | None:
        """A const axis given by an expression (``half_hidden = hidden_size / 2``) as an int
        expression over the key's fields, pinned literals and other such axes; None where it
        reads anything else. An axis's ``/`` is exact: ``//``."""
        declared = self.axes.get(axis)
        if not isinstance(declared, ir.ConstAxis) or declared.value is None or axis in seen:
            return None
        try:
            tree = ast.parse(declared.value.text, mode="eval").body
        except SyntaxError:
            return None
        names: dict[str, ast.expr] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                if node.id in fields:
                    names[node.id] = ast.Name(f"_k_{node.id}", ast.Load())
                    continue
                other = self.axes.get(node.id)
                literal_value = _pinned_literal(other) if isinstance(other, ir.ConstAxis) else None
                if literal_value is not None:
                    names[node.id] = ast.Constant(literal_value)
                    continue
                text = self._derived(node.id, fields, seen + (axis,))
                if text is None:
                    return None
                names[node.id] = ast.parse(text, mode="eval").body
            elif not isinstance(
                node, (ast.BinOp, ast.Constant, ast.Load, ast.operator, ast.UnaryOp, ast.USub)
            ):
                return None
            elif isinstance(node, ast.Constant) and not isinstance(node.value, int):
                return None

        class Spell(ast.NodeTransformer):
            def visit_Name(self, node: ast.Name) -> ast.AST:
                return names[node.id]

            def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
                self.generic_visit(node)
                if isinstance(node.op, ast.Div):
                    node.op = ast.FloorDiv()
                return node

        return unparse(Spell().visit(tree))

    def alloc(self, o: ir.Tensor, fields: tuple[str, ...], laid_out: bool = False) -> str:
        """An expression that allocates output ``o`` for a routed call (``laid_out``: one
        whose caller's buffer holds it as the API lays it out, Note [output buffers]).

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
        dims = self.dims(o, fields, derived=True)
        if dims is None:
            if laid_out:
                return f"_api.cannot_allocate({literal(o.name)}, laid_out=True)"
            return f"_api.cannot_allocate({literal(o.name)})"
        return f"torch.empty({dims}, dtype={self._dtype(o)}, device={self._device()})"

    def output_check(
        self, o: ir.Tensor, local: str, fields: tuple[str, ...]
    ) -> tuple[str, str] | None:
        """The condition output ``o`` held in ``local`` meets, and what is expected of it as
        ``(dtype, shape or None, device or None)`` (evaluated only when the condition fails,
        for the message); None for a scalar. What a value-returning solution returns is
        checked by it (Note [result check] in ``fibgen/runtime/checking/result_check.py``:
        ``_same`` checks dtype, shape and device), and so is a buffer the caller gives
        (Note [output buffers] in ``fibgen/codegen/python/dispatch/rules.py``).
        """
        if o.shape is None:
            return None
        dtype = self._dtype(o)
        if o.dtype.kind == "concrete" and o.dtype.name not in self.dtype_params:
            dtype = dtype_constant(o.dtype.name)
        required = [self.input_expr[t.name] for t in self.f.inputs if t.shape and not t.optional]
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
            shape = f"{same}.shape"
        else:
            dims = self.dims(o, fields, derived=True)
            shape = dims if dims is not None else "None"
        if required:
            sizes = shape if shape != "None" else str(len(o.shape))
            cond = f"_same({local}, {dtype}, {sizes}, {required[0]})"
            device = f"{required[0]}.device"
        else:
            # Nothing to take the device from: the dtype and the shape.
            parts = [f"isinstance({local}, _Tensor)", f"{local}.dtype is {dtype}"]
            parts.append(
                f"{local}.shape == {shape}"
                if shape != "None"
                else f"{local}.ndim == {len(o.shape)}"
            )
            cond = " and ".join(parts)
            device = "None"
        cond = f"{local} is None or {cond}" if o.optional else cond
        return cond, f"({dtype}, {shape}, {device})"

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
            return TORCH_DTYPE[ref.name]
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
            and not ((target := self.targets[o.name]) is not None and target[0] == "inplace")
        ]

    def _caller_tensor(self, o: ir.Tensor) -> str:
        """The caller's own tensor that output ``o`` is written into, as the API returns it.

        Where the input reads a whole argument, the argument itself, not the view a `let` may
        make of it (a layout converted for the definition would be returned converted); for an
        element of a tuple argument or a plan parameter, the tensor the input reads.
        """
        if o.target in self.run_names:
            param = o.target  # `_target` found an input that reads the whole argument
        else:
            t = next(t for t in self.f.inputs if t.name == o.target)
            src = t.source
            if src is None and t.name in self.run_names:
                param = t.name
            elif src is not None and not src.from_plan and src.index is None:
                param = src.param
            else:
                return self.input_expr[t.name]
        return self.defaulted_tensor(param) or param

    def defaulted_tensor(self, param: str) -> str | None:
        """For an argument a `default` rule fills in and no `let` converts, the local that
        holds the caller's tensor or, for a None, the one the rule made: what an API that
        writes into it returns. None for any other argument."""
        rules = [r for r in self.f.rules if getattr(r, "target", None) == param]
        if not any(isinstance(r, ir.Default) for r in rules):
            return None
        if any(isinstance(r, ir.Let) for r in rules):
            return None
        return self.run_var.get(param)

    def returned(self) -> tuple[list[str], list[tuple[str, str]]]:
        """What the function returns: always, and (output, flag) when a flag asks."""
        always = [expr for _, expr in self.returned_outputs()]
        named = set(self.f.returns.names) if self.f.returns is not None else set()
        # FlashInfer's convention: ``return_lse=True`` adds lse to the result.
        flagged = [
            (f"_o_{o.name}", flag)
            for o in self.f.outputs
            if (flag := self._flag(o)) is not None and o.name not in named
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

    def result_expr(self, r: ir.Result) -> str:
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

    def inplace_capable(self) -> bool:
        """Whether INPLACE routes are called (Note [in-place solutions] in
        fibgen/runtime/routing/state.py): the family has effects, and nothing to do after the
        solution but return its outputs."""
        _, flagged = self.returned()
        return (
            bool(self.f.effects)
            and not flagged
            and not any(isinstance(r, ir.Result) for r in self.f.rules)
        )

    # ------------------------------------------------------------------ rules
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
            return dtype_constant(ref.name)
        return f"{self.input_expr[ref.name]}.dtype" if ref.name in self.input_expr else None

    def laid_out(self) -> frozenset[str]:
        """The outputs whose caller's buffer a `result` rule writes in the API's layout: all
        but those it returns inside a list or tuple, as FlashInfer's MoEs return ``[output]``
        (Note [output buffers] in ``fibgen/codegen/python/dispatch/rules.py``)."""
        return frozenset(
            r.target
            for r in self.f.rules
            if isinstance(r, ir.Result)
            and not isinstance(ast.parse(r.expr.text, mode="eval").body, (ast.List, ast.Tuple))
        )

    def wrapped(self) -> frozenset[str]:
        """The outputs a `result` rule returns inside a list or tuple (``[output]``)."""
        results = frozenset(r.target for r in self.f.rules if isinstance(r, ir.Result))
        return results - self.laid_out()

    def rule_plan(self, fields: tuple[str, ...]) -> RulePlan:
        """The checks of the family's rules, of its input tensors and of the output buffers a
        caller gives (Note [rules])."""
        readers = {f: self.reader(f) for f in fields}
        speller = RuleSpeller(self.f, fields, self._axis_reader, readers)
        tensors = []
        for t in self.f.inputs:
            if t.shape is None:
                continue
            dtype = self._tensor_dtype(t, fields)
            if dtype is not None:
                tensors.append((t.name, self.input_expr[t.name], t.optional, dtype, t.shape))
        # Note [output buffers]: a buffer the caller gives is checked as a result is.
        buffers = []
        for o in self.f.outputs:
            target = self.targets[o.name]
            if target is None or target[0] != "buffer" or o.name in self.laid_out():
                continue
            check = self.output_check(o, target[1], fields)
            if check is not None:
                cond = check[0] if o.optional else f"{target[1]} is None or {check[0]}"
                buffers.append((o.name, cond))
        speller.tensor_checks(tensors, buffers)
        return speller.plan
