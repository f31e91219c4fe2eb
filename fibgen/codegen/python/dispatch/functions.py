"""The functions of a family's dispatcher module, printed from its plan and its key."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fibgen.codegen.python.dispatch.key import FamilyKey, NameRule
from fibgen.codegen.python.dispatch.plan import (
    forward_args,
    signature_text,
    tuple_text,
)
from fibgen.codegen.python.dispatch.rules import RulePlan
from fibgen.codegen.python.pyliteral import literal
from fibgen.compiler import ir


@dataclass(frozen=True)
class FunctionView:
    """One generated function: name, parameter list, docstring and body lines."""

    name: str
    params: str
    doc: str
    body: tuple[str, ...]


# Note [result codes]
# A dispatcher keeps in `_r` the index of the rule a call fails, or one of these codes, which
# the runtime reads back (fibgen/runtime/routing/refusals.py). Each is written in the
# generated code as its number and its name in a comment: a name looked up there would cost
# the hit path a global load per use.
PASSED = "-1  # PASSED"  # every rule holds
UNEVALUABLE = "-2  # UNEVALUABLE"  # a rule raised while it was checked
NO_KEY = "-3  # NO_KEY"  # the key, or a `let` before it, could not be computed
IF_PASSED = "if _r == -1:  # PASSED"
IF_NOT_PASSED = "if _r != -1:  # not PASSED"


class Family(FamilyKey):
    """Prints the functions of one family's dispatcher module from its plan and its key."""

    # -------------------------------------------------------------- dispatcher
    def dispatcher(self, fields: tuple[str, ...], plan: RulePlan) -> FunctionView:
        """The family's function: the body of Note [the dispatch contract]."""
        forward = forward_args(self.params)
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
        readers = {f: self.reader(f) for f in fields}
        early, late = _split_lets(plan.call_lets, list(readers.values()))
        # Without lets, a key that fails is NO_KEY, written where it is refused.
        body += [f"_r = {NO_KEY}", "try:"] if early else ["try:"]
        body += _let_lines(early, "    ")
        if early:
            body.append(f"    _r = {NO_KEY}")
        for f in fields:
            body.append(f"    _k_{f} = {self.assigned(f)}")
        if not fields:
            body.append("    pass")
        code, _, name = NO_KEY.partition("  # ")
        reason, comment = ("_r", "") if early else (code, f"  # {name}")
        refuse = f"return _api.refuse(None, {reason}, {forward})[1]({forward}){comment}"
        body += ["except Exception:", f"    {refuse}"]
        if not fields:
            key = "None"
        elif len(fields) == 1:
            key = f"_k_{fields[0]}"
        else:
            key = "(" + ", ".join(f"_k_{f}" for f in fields) + ")"
        body += [
            f"_key = {key}",
            # A subscript costs a hit less than .get(); a key not seen yet raises.
            "try:",
            "    _route = _routes[_key]",
            "except KeyError:",
            "    _route = None",
            # Note [re-entry]: a call made while a routed call is in progress is decided
            # on the slow path.
            "if _route is None or SERVING.n:",
            "    _route = _api.resolve(_key)",
            "_kind, _fn, _tick, _v = _route",
            "if _kind == ORIGINAL:",
            "    _tick()",
            f"    return _fn({forward})",
        ]
        body.append("_r = _plan[-1]" if self.f.plan is not None else f"_r = {PASSED}")
        if plan.call_checks or late:
            # The other lets, then every check; a let that raises is refused by its own rule.
            indent = "    " if self.f.plan is not None else ""
            if self.f.plan is not None:
                body.append(IF_PASSED)
            body.append(f"{indent}try:")
            body += _let_lines(late, indent + "    ")
            if late:
                body.append(f"{indent}    _r = {PASSED}")
            for i, check in enumerate(plan.call_checks):
                word = "if" if i == 0 else "elif"
                body += [
                    f"{indent}    {word} not ({check.condition}):",
                    f"{indent}        _r = {check.index}",
                ]
            body += [f"{indent}except Exception:"]
            if late:
                body += [f"{indent}    {IF_PASSED}", f"{indent}        _r = {UNEVALUABLE}"]
            else:
                body.append(f"{indent}    _r = {UNEVALUABLE}")
        body += [
            IF_NOT_PASSED,
            f"    _kind, _fn, _tick = _api.refuse(_key, _r, {forward})",
            "    if _kind == ORIGINAL:",
            f"        return _fn({forward})",
            "_tick()",
        ]
        body += self._call_solution(fields, forward)
        body = self._read_dtypes(self._cache_shapes(body))
        return FunctionView(self.f.name, signature_text(self.params), self._doc(), tuple(body))

    def _cache_shapes(self, body: list[str]) -> list[str]:
        """Read each required input's shape once (Note [shape cache]).

        Note [shape cache]
        ~~~~~~~~~~~~~~~~~~
        A tensor's ``.shape`` costs about 0.1 µs (a new ``torch.Size``), ``.ndim`` about
        0.05 µs; the hit path read the shape of the key's tensor up to four times (key, rank,
        sizes, the result's expected shape). A required input whose size is read for the key
        has its shape taken once, first thing in the key's ``try`` (where an argument that is
        not a tensor fails as it did before), and every later ``expr.shape``/``expr.ndim``
        reads that. It is taken by ``_shape_of``, natively once the runtime's extension is
        built (Note [native reads] in ``fibgen/runtime/checking/result_check.py``). A required
        input that only the checks read more than once has its shape taken just before the
        first check (after the lets the checks may read): an argument that is not a tensor is
        then refused there, as a check that raises is (``_r = -2``).
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
        out = body[:key_at] + [f"    {var} = _shape_of({expr})" for var, expr in cached]
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
                bound.append(f"{indent}{var} = _shape_of({expr})")
                checks = [_spelled(x, expr, var) for x in checks]
        return out[:first] + bound + checks + out[end:]

    def _read_dtypes(self, body: list[str]) -> list[str]:
        """Read each input's dtype through ``_dtype_of`` (Note [native reads] in
        ``fibgen/runtime/checking/result_check.py``): the same object, at half the cost."""
        reads = [(_shape_pattern(e, "dtype"), f"_dtype_of({e})") for _, e, _ in self._tensors()]
        out = []
        for line in body:
            for pattern, read in reads:
                line = pattern.sub(read.replace("\\", r"\\"), line)
            out.append(line)
        return out

    def _doc(self) -> str:
        if self.f.api is not None:
            return f"Route ``{self.f.api.path}`` to the solution registered for its definition."
        return f"Run family ``{self.f.name}``: a registered solution, else the reference."

    def _defaults_to_none(self, param: str) -> bool:
        return any(p.name == param and p.default == "None" for p in self.params)

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
        always, _ = self.returned()
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
            check = self.output_check(o, f"_o_{o.name}", fields)
            if check is not None:
                cond, want = check
                call += [
                    f"    if not ({cond}):",
                    f"        _api.bad_result(_key, {literal(o.name)}, _o_{o.name}, {want})",
                ]
        call += self._call_inplace(fields, inputs)
        call.append("else:")
        for o in self.f.outputs:
            target = self.targets[o.name]
            alloc = self.alloc(o, fields)
            buffer = target[1] if target is not None and target[0] == "buffer" else None
            if buffer is not None and o.name in self.laid_out():
                # A buffer a `result` rule writes holds the output as the API lays it out:
                # the solution writes one of the definition's (Note [output buffers]).
                call.append(f"    _o_{o.name} = {self.alloc(o, fields, laid_out=True)}")
            elif buffer is not None:
                # The caller's buffer, else a new one; as statements, which black leaves as
                # they are where it would split a long conditional expression.
                call += [
                    f"    _o_{o.name} = {buffer}",
                    f"    if _o_{o.name} is None:",
                    f"        _o_{o.name} = {alloc}",
                ]
            else:
                call.append(f"    _o_{o.name} = {alloc}")
        buffers = "".join(f", {o.name}=_o_{o.name}" for o in self.f.outputs)
        call.append(f"    _fn({inputs}{buffers})")
        # Note [re-entry]: `_serving` bound and the counter up while the route's callable runs.
        body = ["_serving = SERVING", "_serving.n += 1", "try:", "    while True:", "        try:"]
        body += [f"            {line}" for line in call]
        body += [
            "            break",
            "        except Exception as _exc:",
            f"            _kind, _fn, _ = _api.failed(_key, _fn, _exc, {forward})",
            "            if _kind == ORIGINAL:",
            f"                return _fn({forward})",
            "finally:",
            "    _serving.n -= 1",
        ]
        # `result` rules: outputs as the API returns them (Note [rules]). One that returns an
        # output in a list returns the caller's buffer, written first (Note [output buffers]).
        wrapped = self.wrapped()
        for o in self.f.outputs:
            target = self.targets[o.name]
            if o.name in wrapped and target is not None and target[0] == "buffer":
                body += self._write_back(o, target[1])
        for r in self.f.rules:
            if isinstance(r, ir.Result):
                body.append(f"_o_{r.target} = {self.result_expr(r)}")
        # Note [effects] (python_dispatch.py): computed before any write-back, stored after it.
        stores = []
        for e in self.f.effects:
            body.append(f"_e_{e.target} = {self._effect_expr(e)}")
            if self._defaults_to_none(e.target):
                stores += [f"if {e.target} is not None:", f"    {e.target}.copy_(_e_{e.target})"]
            else:
                stores.append(f"{e.target}.copy_(_e_{e.target})")
        for o in self.f.outputs:
            target = self.targets[o.name]
            if target is None or o.name in wrapped:
                continue
            local = f"_o_{o.name}"
            produced = f" and {local} is not None" if o.optional else ""
            if target[0] == "buffer":
                body += self._write_back(o, target[1])
            else:
                body += [
                    f"if {local} is not {target[1]}{produced}:",
                    f"    {target[1]}.copy_({local})",
                ]
        body += stores
        always, flagged = self.returned()
        if flagged:
            extra = " + ".join(f"(({local},) if {flag} else ())" for local, flag in flagged)
            # With nothing else returned, a call that asks for no flag returns None.
            rest = "_result" if always else "(_result or None)"
            body += [
                f"_result = {tuple_text(always)} + {extra}",
                f"return _result[0] if len(_result) == 1 else {rest}",
            ]
        elif always:
            body.append(f"return {', '.join(always)}")
        else:
            body.append("return None")
        return body

    # ------------------------------------------------------------------- hooks
    def _write_back(self, o: ir.Tensor, buffer: str) -> list[str]:
        """Output ``o`` into the caller's ``buffer`` where one was given and not written."""
        local = f"_o_{o.name}"
        produced = f" and {local} is not None" if o.optional else ""
        return [
            f"if {buffer} is not None{produced} and {local} is not {buffer}:",
            f"    {buffer}.copy_({local})",
            f"    {local} = {buffer}",
        ]

    def name_function(self, rule: NameRule, fields: tuple[str, ...]) -> FunctionView:
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

    def trace_functions(self, plan: RulePlan) -> tuple[FunctionView, FunctionView]:
        """``_inputs`` and ``_var_axes``: what tracing records of a call.

        See Note [tracing hooks] in ``fibgen/runtime/tracing/tracer.py``.
        """
        instance = self.params[0].name if self.f.plan is not None else None
        body = [f"_plan = _plans[{instance}]"] if instance is not None else []
        body += [statement for _, statement in plan.call_lets]
        body.append(f"return {tuple_text([self.input_expr[t.name] for t in self.f.inputs])}")
        inputs = FunctionView(
            "_inputs",
            signature_text(self.params),
            "The definition's inputs of a call, in order.",
            tuple(body),
        )
        readers = []
        scalars = False
        for axis in self.f.axes:
            if not isinstance(axis, ir.VarAxis):
                continue
            if axis.scalar:
                # The value of the scalar input of its name (Note [axes bound by a scalar]).
                scalars = True
                readers.append(f"{literal(axis.name)}: int({axis.name})")
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
            "The var-axis values of a call, read from the shapes of its inputs"
            + (" and the scalars of their names." if scalars else "."),
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
        body.append(f"    _r = {PASSED}")
        for i, check in enumerate(plan.capture_checks):
            word = "if" if i == 0 else "elif"
            body += [f"    {word} not ({check.condition}):", f"        _r = {check.index}"]
        body += [
            f"    _plans[{instance}] = {tuple_text(values + ['_r'])}",
            "except Exception:",
            "    # A plan rule that cannot be evaluated: runs after this plan are not routed.",
            f"    _plans[{instance}] = {tuple_text(['None'] * len(values) + ['-2'])}",
        ]
        assert self.f.plan is not None  # only a family with a plan captures
        path = self.f.plan.path
        return FunctionView(
            "_capture",
            signature_text(self.plan_params),
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
