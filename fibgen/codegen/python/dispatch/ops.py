"""The custom-op side of a dispatcher: what torch.compile traces (Note [custom ops] in
``fibgen/runtime/routing/ops.py``).

For a family whose API is a plain function (no plan/run wrapper, no ``*args``/``**kwargs``,
no tuple arguments, no output that a flag adds), three functions are generated:

* ``_compiled``, with the API's signature: the lets and the dtype and rank checks of the
  call (a call they reject runs eagerly, ``_api.outside()``), the key, the buffers the API
  fills (allocated when the caller gave none), and one call of the op;
* ``_op_impl``: rebuilds the call from the op's arguments and runs the dispatcher eagerly,
  so the routing is decided at run time; it returns the outputs that are not buffers;
* ``_op_fake``: those outputs' shapes and dtypes, from the definition's axes.

Other families get a ``_compiled`` that runs the dispatcher eagerly, outside the graph.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from fibgen.codegen.python.pyliteral import literal
from fibgen.compiler import ir


@dataclass(frozen=True)
class OpFunctions:
    """Function views (name, params, doc, body) and the lines that register the ops."""

    functions: tuple[tuple[str, str, str, tuple[str, ...]], ...]
    registration: tuple[str, ...]


def _tuple(items: list[str]) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


class OpView:
    """Computes the op functions of one family from its dispatcher's plan (``FamilyPlan``)."""

    def __init__(self, view, fields: tuple[str, ...], plan, forward: str, signature: str) -> None:
        self.v = view
        self.f = view.f
        self.fields = fields
        self.plan = plan
        self.forward = forward
        self.signature = signature
        self.reason = self._unsupported()

    # ------------------------------------------------------------------ shape of the op
    def _unsupported(self) -> str | None:
        f = self.f
        if f.plan is not None:
            return "a plan/run wrapper"
        if any(p.kind in ("var_positional", "var_keyword") for p in self.v.params):
            return "*args or **kwargs"
        if any(t.source is not None and t.source.index is not None for t in f.inputs):
            return "a tuple argument"
        always, flagged = self.v.returned()
        if flagged:
            return "an output a flag asks for"
        for o in f.outputs:
            target = self.v.targets[o.name]
            if o.name in self.v.laid_out() and target is not None and target[0] == "buffer":
                return f"output {o.name} is written into the caller's buffer in the API's layout"
            if o.shape is None or (
                (target is None or target[0] == "buffer") and self.v.dims(o, self.fields) is None
            ):
                return f"output {o.name} has no shape the call gives"
        return None

    def _written(self) -> list[str]:
        """API parameters the call writes: output buffers, in-place inputs, effects."""
        out = []
        for o in self.f.outputs:
            target = self.v.targets[o.name]
            if target is None:
                continue
            param = target[1] if target[0] == "buffer" else self._param_of(target[1])
            if param is not None and param not in out:
                out.append(param)
        for e in self.f.effects:
            if e.target not in out:
                out.append(e.target)
        return out

    def _param_of(self, expr: str) -> str | None:
        """The API parameter an input expression reads (through a let's variable too)."""
        for p in self.v.params:
            if expr == p.name or expr == self.v.run_var.get(p.name):
                return p.name
        return None

    def _slots(self) -> list[tuple[str, bool]]:
        """(parameter, written) for every tensor argument of the op, in the API's order."""
        written = self._written()
        read = set()
        for t in self.f.inputs:
            if t.shape is None:
                continue
            param = t.source.param if t.source is not None else t.name
            if any(p.name == param for p in self.v.params):
                read.add(param)
        return [
            (p.name, p.name in written)
            for p in self.v.params
            if p.name in written or p.name in read
        ]

    def _values(self) -> list[str]:
        """The outputs the API returns that are not buffers of the caller: the op's result."""
        return [expr for o, expr in self.v.returned_outputs() if self.v.targets[o.name] is None]

    def schema(self) -> str:
        letters = iter(string.ascii_lowercase)
        args = []
        for name, written in self._slots():
            args.append(f"Tensor({next(letters)}!) {name}" if written else f"Tensor? {name}")
        args += ["SymInt[] ints", "float[] floats", "str args"]
        values = self._values()
        ret = (
            "()"
            if not values
            else "Tensor" if len(values) == 1 else _tuple(["Tensor"] * len(values))
        )
        return f"({', '.join(args)}) -> {ret}"

    # ------------------------------------------------------------------ functions
    def _packed(self) -> list[str]:
        """Each parameter's place in ``args``: tensors travel as op arguments instead."""
        slots = dict(self._slots())
        out = []
        for p in self.v.params:
            if slots.get(p.name):  # written: always a tensor argument
                continue
            if p.name in slots:
                out.append(f"(None if isinstance({p.name}, _Tensor) else {p.name})")
            else:
                out.append(p.name)
        return out

    def _unpack(self) -> list[str]:
        """Statements that rebuild the API's arguments inside the op (impl and fake)."""
        slots = dict(self._slots())
        lines = ["_a = _decode(args, ints, floats)"]
        i = 0
        for p in self.v.params:
            if slots.get(p.name):
                continue
            if p.name in slots:
                lines.append(f"if {p.name} is None:")
                lines.append(f"    {p.name} = _a[{i}]")
            else:
                lines.append(f"{p.name} = _a[{i}]")
            i += 1
        return lines

    def _lets(self) -> list[str]:
        return [statement for _, statement in self.plan.call_lets]

    def _key(self) -> list[str]:
        lines = [f"_k_{f} = {self.v.assigned(f)}" for f in self.fields]
        if not self.fields:
            key = "None"
        elif len(self.fields) == 1:
            key = f"_k_{self.fields[0]}"
        else:
            key = _tuple([f"_k_{f}" for f in self.fields])
        return lines + [f"_key = {key}"]

    def _alloc(self, o: ir.Tensor) -> str:
        return self.v.alloc(o, self.fields)

    def compiled(self) -> tuple[str, str, str, tuple[str, ...]]:
        doc = "The dispatcher as torch.compile traces it: one custom op (Note [custom ops])."
        if self.reason is not None:
            doc = f"Under torch.compile: the dispatcher, run eagerly ({self.reason})."
            return ("_compiled", self.signature, doc, (f"return _api.outside()({self.forward})",))
        # Traced, not caught: an argument that is not a tensor is rejected before its shape
        # is read for the key, and the dtypes and ranks after (a dtype may be in the key).
        tensors = [
            f"isinstance({self.v.input_expr[t.name]}, _Tensor)"
            for t in self.f.inputs
            if t.shape is not None and not t.optional
        ]
        # An output buffer is checked by the dispatcher the op runs (Note [output buffers]):
        # its check calls `_same`, which the compiler would not trace into.
        checks = [
            f"({c.condition})"
            for c in self.plan.call_checks
            if self.plan.names[c.index].startswith("tensor:") and c.index not in self.plan.buffers
        ]
        body = [f"_a = {_tuple(self._packed())}"]
        body += self._lets()
        body += [
            "_p = _pack(_a)",
            f"if not ({' and '.join(tensors + ['_p is not None'])}):",
            f"    return _api.outside()({self.forward})",
        ]
        body += self._key()
        if checks:
            body += [
                f"if not ({' and '.join(checks)}):",
                f"    return _api.outside()({self.forward})",
            ]
        body.append("_op = _OPS.get(_key, _FAMILY_OP)")
        buffers = {}
        for o in self.f.outputs:
            target = self.v.targets[o.name]
            if target is None or target[0] != "buffer":
                continue
            local = f"_o_{o.name}"
            buffers[target[1]] = local
            body += [
                f"{local} = {target[1]}",
                f"if {local} is None:",
                f"    {local} = {self._alloc(o)}",
            ]
        args = []
        for name, written in self._slots():
            if written:
                # An in-place argument a `default` rule fills in: the tensor it made.
                args.append(buffers.get(name) or self.v.defaulted_tensor(name) or name)
            else:
                args.append(f"{name} if isinstance({name}, _Tensor) else None")
        values = self._values()
        call = f"_op({', '.join(args + ['_p[0]', '_p[1]', '_p[2]'])})"
        if values:
            target = values[0] if len(values) == 1 else ", ".join(values)
            body.append(f"{target} = {call}")
        else:
            body.append(call)
        # An output a `result` rule returns in a list: the op wrote the caller's buffer, which
        # the list holds (Note [output buffers]).
        for r in self.f.rules:
            if isinstance(r, ir.Result) and r.target in self.v.wrapped():
                body.append(f"_o_{r.target} = {self.v.result_expr(r)}")
        always, _ = self.v.returned()
        if not always:
            body.append("return None")
        else:
            body.append(f"return {', '.join(always)}")
        return ("_compiled", self.signature, doc, tuple(body))

    def _op_params(self) -> str:
        return ", ".join([name for name, _ in self._slots()] + ["ints", "floats", "args"])

    def impl(self) -> tuple[str, str, str, tuple[str, ...]]:
        body = self._unpack()
        values = self._values()
        always, _ = self.v.returned()
        tensors = ", ".join(name for name, _ in self._slots())
        body.append(f"_res = {self.f.name}({self.forward})")
        if values:
            if len(always) == 1:
                body.append(f"return _fresh(_res, {tensors})")
            else:
                picked = [f"_fresh(_res[{always.index(v)}], {tensors})" for v in values]
                body.append(
                    f"return {picked[0]}" if len(picked) == 1 else f"return {', '.join(picked)}"
                )
        else:
            body.append("return None")
        return (
            "_op_impl",
            self._op_params(),
            "The op at run time: the dispatcher, eagerly, on the call the op stands for.",
            tuple(body),
        )

    def fake(self) -> tuple[str, str, str, tuple[str, ...]]:
        values = self._values()
        body = self._unpack() + self._lets()
        if values:
            body += self._key()
            by_name = {o.name: o for o in self.f.outputs}
            for local in values:
                body.append(f"{local} = {self._alloc(by_name[local[3:]])}")
            for r in self.f.rules:
                if isinstance(r, ir.Result) and f"_o_{r.target}" in values:
                    body.append(f"_o_{r.target} = {self.v.result_expr(r)}")
            body.append(f"return {', '.join(values)}")
        else:
            body.append("return None")
        return (
            "_op_fake",
            self._op_params(),
            "The op's outputs for torch.compile: shapes and dtypes from the definition's axes.",
            tuple(body),
        )

    def registration(self, namespace: str, known: list[tuple[str, str]]) -> tuple[str, ...]:
        if self.reason is not None:
            return ()
        rows = ", ".join(f"{k}: {literal(n)}" for k, n in known)
        return (
            f"_OPS, _FAMILY_OP = _api.define_ops({literal(namespace)}, "
            f"{literal(self.schema())}, _op_impl, _op_fake, {{{rows}}}, "
            f"{literal(self.f.name)})",
        )
