"""What a family's calls are routed by: the key's fields, the name rule and the known keys."""

from __future__ import annotations

import ast
import string
from dataclasses import dataclass

from fibgen.codegen.python.dispatch.plan import TORCH_DTYPE, FamilyPlan, py_literal, tuple_text
from fibgen.compiler import ir


@dataclass(frozen=True)
class NameRule:
    """A format template over the key's names; dtype fields are spelled by their name part."""

    template: str
    fields: tuple[str, ...]


class FamilyKey(FamilyPlan):
    """The plan of one family's dispatcher, with the key it routes by and the name rule."""

    # ------------------------------------------------------------------ naming
    def name_rules(self) -> list[NameRule]:
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
            return [NameRule(self.f.name_template, fields)]
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
            NameRule(prefix + "".join(p for p, _ in order), tuple(n for _, n in order))
            for order in orders
        ]

    def _values(self, d: ir.Definition) -> dict[str, object]:
        values: dict[str, object] = dict(d.consts)
        values.update(d.param_values)
        values.update(d.dtype_values)
        return values

    def _spell(self, rule: NameRule, values: dict[str, object]) -> str:
        spelled = {
            f: ir.DTYPE_NAME_PART[str(values[f])] if f in self.dtype_params else values[f]
            for f in rule.fields
        }
        return rule.template.format(**spelled)

    def name_rule(self) -> NameRule | None:
        """The rule that reproduces every instance's name; None when none does."""
        for rule in self.name_rules():
            try:
                if all(self._spell(rule, self._values(d)) == d.name for d in self.defs):
                    return rule
            except KeyError:
                continue
        return None

    def key_fields(self, rule: NameRule | None) -> tuple[str, ...]:
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
            if not (f in self.axes and isinstance(ax := self.axes[f], ir.ConstAxis) and ax.value)
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
            TORCH_DTYPE[str(values[f])] if f in self.dtype_params else py_literal(values[f])
            for f in fields
        ]
        return items[0] if len(items) == 1 else tuple_text(items)

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
