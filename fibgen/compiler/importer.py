"""`fibgen import`: flashinfer-bench definition JSON → `.fidef` families.

Definitions that differ only in const values (and per-definition description, tags and
reference) become one family. Each const's name part is inferred from the definition names;
when the names do not follow the `<prefix>_<abbrev><value>...` rule, an explicit name
template is used instead. `fibgen.pipeline.import_paths` reads the files, prints the families
and checks the result: compiling the written files must reproduce every imported definition,
or nothing is written.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import TypeVar

from fibgen.compiler import ir

_T = TypeVar("_T")
_ABBREV = re.compile(r"^[A-Za-z][A-Za-z0-9]*?[A-Za-z]$|^[A-Za-z]$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class NameScheme:
    """How a family spells its definition names."""

    family: str
    abbrevs: tuple[tuple[str, str], ...]  # (const axis, abbrev) for consts with a name part
    template: str | None = None  # set when the axis rule cannot produce the names


def _split_part(token: str, value: int) -> str | None:
    text = str(value)
    if token.endswith(text) and len(token) > len(text):
        abbrev = token[: -len(text)]
        if _ABBREV.match(abbrev):
            return abbrev
    return None


def infer_scheme(name: str, consts: list[tuple[str, int]]) -> NameScheme:
    """Infer prefix and abbreviations from one name; fall back to a template."""
    tokens = name.split("_")
    abbrevs: list[tuple[str, str]] = []
    for axis, value in reversed(consts):
        if len(tokens) <= 1:
            break
        abbrev = _split_part(tokens[-1], value)
        if abbrev is not None:
            abbrevs.append((axis, abbrev))
            tokens.pop()
    scheme = NameScheme("_".join(tokens), tuple(reversed(abbrevs)))
    if scheme_name(scheme, dict(consts)) == name and _IDENT.match(scheme.family):
        return scheme
    return _template_scheme(name, consts)


def _template_scheme(name: str, consts: list[tuple[str, int]]) -> NameScheme:
    # Replace every `<letters><value>` token by `<letters>{axis}`, taking consts in order.
    used: set[str] = set()
    out: list[str] = []
    first_field = None
    for i, token in enumerate(name.split("_")):
        for axis, value in consts:
            if axis in used:
                continue
            abbrev = _split_part(token, value)
            if abbrev is not None:
                used.add(axis)
                token = f"{abbrev}{{{axis}}}"
                first_field = i if first_field is None else first_field
                break
        out.append(token)
    template = "_".join(out)
    family = "_".join(name.split("_")[:first_field]) if first_field else name
    if not _IDENT.match(family):
        family = re.sub(r"[^A-Za-z0-9_]", "_", family)
        if not _IDENT.match(family):
            family = "f_" + family
    return NameScheme(family, (), template)


def scheme_name(scheme: NameScheme, consts: dict[str, int]) -> str:
    """The name a scheme gives to a set of const values."""
    if scheme.template is not None:
        return re.sub(r"\{(\w+)\}", lambda m: str(consts[m.group(1)]), scheme.template)
    return "_".join([scheme.family] + [f"{a}{consts[axis]}" for axis, a in scheme.abbrevs])


@dataclass
class _Group:
    scheme: NameScheme
    members: list  # format.Definition


def _structure_key(d, scheme: NameScheme) -> tuple:
    axes = tuple((n, a.type, a.description) for n, a in d.axes.items())
    tensors = tuple(
        (n, None if t.shape is None else tuple(t.shape), t.dtype, t.description, t.optional)
        for section in (d.inputs, d.outputs)
        for n, t in section.items()
    )
    return (d.op_type, scheme, axes, tuple(d.inputs), tensors, tuple(d.constraints))


def group_definitions(defs: list) -> list[_Group]:
    """Group definitions that share everything but const values, texts and tags."""
    groups: dict[tuple, _Group] = {}
    for d in sorted(defs, key=lambda x: x.name):
        scheme = infer_scheme(d.name, list(d.const_axes.items()))
        key = _structure_key(d, scheme)
        groups.setdefault(key, _Group(scheme, [])).members.append(d)
    # Two groups may infer the same family name: make family names unique.
    seen: Counter = Counter()
    out = []
    for g in sorted(groups.values(), key=lambda g: (g.scheme.family, g.members[0].name)):
        seen[g.scheme.family] += 1
        if seen[g.scheme.family] > 1:
            # Keep the names, change only the family: spell the names with a template.
            template = g.scheme.template or "_".join(
                [g.scheme.family] + [f"{a}{{{axis}}}" for axis, a in g.scheme.abbrevs]
            )
            scheme = NameScheme(f"{g.scheme.family}_{seen[g.scheme.family]}", (), template)
            g = _Group(scheme, g.members)
        out.append(g)
    return out


def _common_prefix(lists: list[list[str]]) -> list[str]:
    prefix = list(lists[0])
    for tags in lists[1:]:
        n = 0
        while n < min(len(prefix), len(tags)) and prefix[n] == tags[n]:
            n += 1
        prefix = prefix[:n]
    return prefix


def _most_common(values: list[_T]) -> _T | None:
    counts = Counter(values)
    value, count = counts.most_common(1)[0]
    return value if count > 1 or len(values) == 1 else None


def family_of(group: _Group) -> ir.Family:
    """Build the family IR of one group."""
    first = group.members[0]
    scheme = group.scheme
    abbrev_of = dict(scheme.abbrevs)
    consts = list(first.const_axes)
    pinned = {
        a: first.const_axes[a]
        for a in consts
        if a not in abbrev_of
        and len({m.const_axes[a] for m in group.members}) == 1
        and len(group.members) > 1
    }
    axes: list = []
    scalars = first.scalar_axes
    for name, ax in first.axes.items():
        if ax.type == "var":
            axes.append(ir.VarAxis(name=name, scalar=name in scalars, description=ax.description))
        else:
            value = ir.Expr(text=str(pinned[name])) if name in pinned else None
            axes.append(
                ir.ConstAxis(
                    name=name, abbrev=abbrev_of.get(name), value=value, description=ax.description
                )
            )

    def tensor(name: str, t) -> ir.Tensor:
        return ir.Tensor(
            name=name,
            dtype=ir.DtypeRef(kind="concrete", name=t.dtype),
            shape=None if t.shape is None else tuple(t.shape),
            optional=t.optional,
            description=t.description,
        )

    family_tags = _common_prefix([list(m.tags) for m in group.members])
    description = _most_common([m.description for m in group.members])
    reference = _most_common([m.reference for m in group.members])
    instances = []
    for m in group.members:
        values = tuple(
            ir.Assignment(key=abbrev_of.get(a, a), value=v)
            for a, v in m.const_axes.items()
            if a not in pinned
        )
        instances.append(
            ir.Instance(
                values=values,
                tags=tuple(m.tags[len(family_tags) :]),
                description=m.description if m.description != description else None,
                reference=m.reference if m.reference != reference else None,
            )
        )
    single = len(group.members) == 1
    return ir.Family(
        name=scheme.family,
        op_type=first.op_type,
        description=description,
        tags=tuple(family_tags),
        name_template=scheme.template,
        axes=tuple(axes),
        constraints=tuple(ir.Expr(text=c) for c in first.constraints),
        inputs=tuple(tensor(n, t) for n, t in first.inputs.items()),
        outputs=tuple(tensor(n, t) for n, t in first.outputs.items()),
        reference=reference,
        instances=tuple(instances) if not (single and not values_needed(axes)) else (),
    )


def values_needed(axes: list) -> bool:
    """True when some const axis takes its value from instances."""
    return any(isinstance(a, ir.ConstAxis) and a.value is None for a in axes)
