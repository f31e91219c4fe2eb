"""Instantiation: each instance's values checked, its consts computed, its definition named."""

from __future__ import annotations

import re

from fibgen.compiler import ir
from fibgen.compiler.checks.common import (
    EXPR_BUILTINS,
    CheckerBase,
    FamilyView,
    did_you_mean,
    names_in,
    shown_text,
)
from fibgen.compiler.checks.const_eval import INT64_MAX, UNPARSABLE, evaluate_const
from fibgen.compiler.checks.names import definition_name_problem
from fibgen.compiler.printer import quote, value_text
from fibgen.format.models import NAME_RULE, name_problem

_TEMPLATE_FIELD = re.compile(r"\{([^{}]*)\}")


class InstanceChecks(CheckerBase):
    """Each instance's values, its definition and its name."""

    def _name_template(self, v: FamilyView) -> None:
        fam = v.family
        if fam.name_template is None:
            return
        span = fam.name_template_span if fam.name_template_span.line > 0 else fam.span
        allowed = set(v.axes) | set(v.params) | set(v.dtype_params)
        for m in _TEMPLATE_FIELD.finditer(fam.name_template):
            key = m.group(1)
            if key not in allowed:
                self.err(
                    f"name template field `{{{shown_text(key)}}}` is not an axis or parameter",
                    span,
                    help=did_you_mean(key, allowed, "names"),
                )
            elif key in v.axes and isinstance(v.axes[key], ir.VarAxis):
                self.err(
                    f"name template field `{{{key}}}` is a var axis",
                    span,
                    help="a definition name can only use const values",
                )
        # The text around the fields is in every name: check it once, here.
        literal = _TEMPLATE_FIELD.sub("0", fam.name_template)
        problem = name_problem(literal)
        if problem is not None:
            self.err(
                f"name template `{shown_text(fam.name_template)}` gives unsafe definition names: "
                f"the text {problem}",
                span,
                help=NAME_RULE,
            )
            return
        # A field may start a name with a letter (a str param), so only the characters are
        # held to a torch op name's here; each name is checked whole when it is made.
        found = definition_name_problem(_TEMPLATE_FIELD.sub("a", fam.name_template))
        if found is not None and found[0].startswith("contains"):
            self.err(
                f"name template `{fam.name_template}` gives definition names that cannot be "
                f"torch op names: the text {found[0]}",
                span,
                help=found[1],
            )

    def _instances(self, v: FamilyView, path: str, build: bool) -> list[ir.Definition]:
        fam = v.family
        instances = fam.instances or (ir.Instance(values=(), span=fam.span),)
        key_of: dict[str, str] = {}
        for ax in fam.axes:
            if isinstance(ax, ir.ConstAxis):
                key_of[ax.name] = ax.name
                if ax.abbrev:
                    key_of.setdefault(ax.abbrev, ax.name)
        for p in fam.params:
            key_of[p.name] = p.name
            if p.abbrev:
                key_of.setdefault(p.abbrev, p.name)
        for dp in fam.dtype_params:
            key_of[dp.name] = dp.name
        # A param has one type: its default's, else that of the first instance giving it.
        param_types: dict[str, tuple[str, str]] = {
            p.name: (_kind(p.default), f"its default is `{value_text(p.default)}`")
            for p in fam.params
            if p.default is not None
        }
        defs: list[ir.Definition] = []
        for index, inst in enumerate(instances):
            values: dict[str, ir.Assignment] = {}
            ok = True
            for a in inst.values:
                target = key_of.get(a.key)
                if target is None:
                    ok = False
                    self.err(
                        f"`{a.key}` is not a const axis, parameter or dtype parameter of "
                        f"`{fam.name}`",
                        a.span,
                        help=did_you_mean(a.key, key_of, "keys"),
                    )
                    continue
                if target in values:
                    ok = False
                    self.err(f"`{target}` is given twice in this instance", a.span)
                    continue
                axis = v.axes.get(target)
                if isinstance(axis, ir.ConstAxis) and axis.value is not None:
                    ok = False
                    self.err(
                        f"`{target}` is pinned to `{axis.value.text}` and cannot be set per "
                        "instance",
                        a.span,
                        help="remove it from the instance",
                    )
                    continue
                if target in v.params and not self._typed(target, a, param_types):
                    ok = False
                    continue
                values[target] = a
            if not ok:
                continue
            for choice in self._dtype_choices(v, values, inst):
                d = self._definition(v, inst, index, values, choice, path, build)
                if d is not None:
                    defs.append(d)
        return defs

    def _typed(self, param: str, a: ir.Assignment, types: dict[str, tuple[str, str]]) -> bool:
        """Whether an instance gives ``param`` a value of its type; an error if not. (An int
        serves where a float is expected: `EPS=1`.)"""
        kind = _kind(a.value)
        if param not in types:
            types[param] = (kind, f"the instance at {a.span} gives it {kind}")
            return True
        expected, why = types[param]
        if kind == expected or (kind == "an int" and expected == "a float"):
            return True
        if isinstance(a.value, str) and a.value.lower().lstrip("+-") in _NOT_FINITE:
            help = (
                f"`{a.value}` is read as a word: a number in a .fidef is finite, and a float "
                "parameter takes one"
            )
        else:
            help = f"give `{param}` {expected} in every instance"
        shown = quote(a.value) if isinstance(a.value, str) else value_text(a.value)
        self.err(
            f"`{a.key}={shown}` gives `{param}` {kind}, but `{param}` is {expected}: {why}",
            a.span,
            help=help,
        )
        return False

    def _dtype_choices(
        self, v: FamilyView, values: dict[str, ir.Assignment], inst: ir.Instance
    ) -> list[dict[str, str]]:
        combos: list[dict[str, str]] = [{}]
        for dp in v.family.dtype_params:
            if dp.name in values:
                value = values[dp.name].value
                if value not in dp.choices:
                    self.err(
                        f"`{dp.name} = {value}` is not one of {', '.join(dp.choices)}",
                        values[dp.name].span,
                    )
                    return []
                options = [str(value)]
            else:
                options = list(dp.choices)
            combos = [dict(c, **{dp.name: o}) for c in combos for o in options]
        return combos

    def _definition(
        self,
        v: FamilyView,
        inst: ir.Instance,
        index: int,
        values: dict[str, ir.Assignment],
        dtypes: dict[str, str],
        path: str,
        build: bool,
    ) -> ir.Definition | None:
        fam = v.family
        params: dict[str, int | float | str | bool] = {}
        ok = True
        for p in fam.params:
            if p.name in values:
                params[p.name] = values[p.name].value
            elif p.default is not None:
                params[p.name] = p.default
            else:
                ok = False
                self.err(
                    f"parameter `{p.name}` has no value in this instance",
                    inst.span,
                    help=f"add `{p.name} = VALUE`, or give the parameter a default",
                )
        consts = self._const_values(v, inst, values, params)
        if consts is None or not ok or not build:
            return None
        name = self._name(v, consts, params, dtypes)
        problem = name_problem(name)
        if problem is not None:
            # From a value: the name template (or the family name) was checked on its own.
            self.err(f"definition name `{shown_text(name)}` {problem}", inst.span, help=NAME_RULE)
            return None
        found = definition_name_problem(name)
        if found is not None:
            # A family without instances is one definition, named after the family.
            where = inst.span if fam.instances or fam.name_span.line == 0 else fam.name_span
            self.err(f"definition name `{name}` {found[0]}", where, help=found[1])
            return None

        def dtype_of(t: ir.Tensor) -> str:
            ref = t.dtype
            if ref.kind == "from":
                return dtype_of(v.inputs[ref.name])
            return dtypes.get(ref.name, ref.name)

        def def_tensor(t: ir.Tensor) -> ir.DefTensor:
            return ir.DefTensor(
                name=t.name,
                dtype=dtype_of(t),
                shape=t.shape,
                optional=t.optional,
                description=t.description,
                span=t.span,
            )

        reference = inst.reference if inst.reference is not None else fam.reference
        if reference is not None and params:
            prelude = "".join(f"{k} = {params[k]!r}\n" for k in params)
            reference = prelude + reference
        return ir.Definition(
            name=name,
            op_type=fam.op_type,
            description=inst.description if inst.description is not None else fam.description,
            tags=fam.tags + inst.tags,
            axes=tuple(
                ir.DefAxis(
                    name=ax.name,
                    kind=ax.kind,
                    value=consts.get(ax.name) if ax.kind == "const" else None,
                    scalar=isinstance(ax, ir.VarAxis) and ax.scalar,
                    description=ax.description,
                    span=ax.span,
                )
                for ax in fam.axes
            ),
            constraints=tuple(c.text for c in fam.constraints),
            inputs=tuple(def_tensor(t) for t in fam.inputs),
            outputs=tuple(def_tensor(t) for t in fam.outputs),
            reference=reference,
            family=fam.name,
            source_file=path,
            instance_index=index,
            consts=tuple((ax.name, consts[ax.name]) for ax in fam.axes if ax.kind == "const"),
            param_values=tuple(params.items()),
            dtype_values=tuple(dtypes.items()),
            span=inst.span,
        )

    def _const_values(
        self, v: FamilyView, inst: ir.Instance, values: dict[str, ir.Assignment], params: dict
    ) -> dict[str, int] | None:
        consts: dict[str, int] = {}
        pending: list[ir.ConstAxis] = []
        ok = True
        for ax in v.family.axes:
            if not isinstance(ax, ir.ConstAxis):
                continue
            if ax.value is not None:
                pending.append(ax)
            elif ax.name in values:
                value = values[ax.name].value
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    ok = False
                    self.err(
                        f"const `{ax.name}` must be a non-negative integer, got `{value}`",
                        values[ax.name].span,
                    )
                elif value > INT64_MAX:
                    ok = False
                    self.err(
                        f"const `{ax.name}` = {value} does not fit in 64 bits",
                        values[ax.name].span,
                        help=f"a size is at most {INT64_MAX}",
                    )
                else:
                    consts[ax.name] = value
            else:
                ok = False
                key = ax.abbrev or ax.name
                self.err(
                    f"const axis `{ax.name}` has no value in this instance",
                    inst.span,
                    help=f"add `{key} = VALUE`, or pin it with `{ax.name} : const = VALUE`",
                )
        # Derived consts may refer to each other in any order: evaluate until nothing changes.
        while pending and ok:
            progressed = False
            for ax in list(pending):
                assert ax.value is not None
                names = {n for n, _ in names_in(ax.value.text)} - EXPR_BUILTINS
                unknown = names - set(consts) - set(params) - {p.name for p in pending}
                if unknown:
                    bad = sorted(unknown)[0]
                    self.err(
                        f"`{bad}` in the value of `{ax.name}` is not a const or parameter",
                        ax.value.span,
                    )
                    return None
                if names & {p.name for p in pending}:
                    continue
                result = evaluate_const(ax.value.text, {**params, **consts})
                if result is UNPARSABLE:
                    return None  # lowering reported the syntax error in this expression
                if isinstance(result, str):  # `<why>`: the expression has no value
                    self.err(
                        f"`{ax.name} = {ax.value.text}` has no value: {result[1:-1]}",
                        ax.value.span,
                    )
                    return None
                if (isinstance(result, float) and not result.is_integer()) or result < 0:
                    self.err(
                        f"`{ax.name} = {ax.value.text}` gives {result!r}, not a "
                        "non-negative integer",
                        ax.value.span,
                        help="use `//` for integer division" if isinstance(result, float) else None,
                    )
                    return None
                if result > INT64_MAX:
                    self.err(
                        f"`{ax.name} = {ax.value.text}` gives {int(result)}, which does not fit "
                        "in 64 bits",
                        ax.value.span,
                        help=f"a size is at most {INT64_MAX}",
                    )
                    return None
                consts[ax.name] = int(result)
                pending.remove(ax)
                progressed = True
            if not progressed:
                self.err(
                    f"the values of {', '.join(a.name for a in pending)} depend on each " "other",
                    pending[0].span,
                )
                return None
        return consts if ok else None

    def _name(
        self, v: FamilyView, consts: dict[str, int], params: dict, dtypes: dict[str, str]
    ) -> str:
        fam = v.family
        if fam.name_template is not None:
            fields = {
                **{k: str(x) for k, x in params.items()},
                **{k: str(x) for k, x in consts.items()},
                **{k: ir.DTYPE_NAME_PART[x] for k, x in dtypes.items()},
            }
            return _TEMPLATE_FIELD.sub(
                lambda m: fields.get(m.group(1), m.group(0)), fam.name_template
            )
        return definition_name(fam, consts, params, dtypes)


_NOT_FINITE = frozenset({"inf", "infinity", "nan"})


def _kind(value: int | float | str | bool) -> str:
    """The type of an instance value or param default, as messages say it."""
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return "an int"
    if isinstance(value, float):
        return "a float"
    return "a string"


def definition_name(
    fam: ir.Family, consts: dict[str, int], params: dict, dtypes: dict[str, str]
) -> str:
    """The name rule: family, then named params, named consts (declaration order), dtype parts."""
    parts = [fam.name]
    parts += [f"{p.abbrev}{params[p.name]}" for p in fam.params if p.abbrev]
    parts += [
        f"{ax.abbrev}{consts[ax.name]}"
        for ax in fam.axes
        if isinstance(ax, ir.ConstAxis) and ax.abbrev
    ]
    parts += [ir.DTYPE_NAME_PART[dtypes[dp.name]] for dp in fam.dtype_params]
    return "_".join(parts)
