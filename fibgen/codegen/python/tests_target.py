"""The test target: ``tests/test_<family>.py`` per family, a table over its definitions.

The generated file is declarative: which definitions, where their JSON is, the family's
generation hints and tolerances, and the var-axis values to try. The work is done by
``fibgen.runtime.checking.testing``. The values are chosen here, once, so that the whole catalogue
runs on a small CPU in a few minutes (see Note [test axis values]).
"""

from __future__ import annotations

import ast
import math

from fibgen.codegen.files import GeneratedFile, with_python_header
from fibgen.codegen.python.pyformat import format_python
from fibgen.codegen.python.pyliteral import docstring_text, inline_dict, literal, string
from fibgen.codegen.templates import render, source_label
from fibgen.compiler import ir
from fibgen.format.hints import DEFAULT_VAR_AXIS
from fibgen.format.models import DTYPE_BYTES

# Note [test axis values]
# One var axis stands for the batch and is tried at 1 (the edge) and 7 (several rows, not a
# power of two). The others are derived by input generation from constraints and hints, so
# the batch axis must be one it does not derive: not the length or total of an indptr, not
# the bound of indices, not the length of a last-page-length tensor. Where every var axis is
# derived (ragged prefill), the indptr's length is set instead: 1 + the batch. Definitions
# whose inputs are large at batch 1 are tried at batch 1 only: they dominate the run time.
# The edge is tried on a family's first definition (by name); its other definitions, which
# differ from it in their constants only, at 7 alone: a family may have dozens of instances,
# and the catalogue's 718 definitions tried at both took 12 minutes of a two-core machine.
BATCHES = (1, 7)
LARGE_INPUTS = 32 << 20


def test_path(family: ir.Family) -> str:
    """Where the test of a family is written, relative to the output."""
    return f"tests/test_{family.name}.py"


def _names(text: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}


def _hint_text(hint: ir.GenHint) -> str:
    args = [a.text for a in hint.args] + [f"{k}={v.text}" for k, v in hint.kwargs]
    return f"{hint.kind}({', '.join(args)})"


def _hint_arg(hint: ir.GenHint, key: str, position: int) -> str | None:
    for k, v in hint.kwargs:
        if k == key:
            return v.text
    return hint.args[position].text if len(hint.args) > position else None


def _batch_axis(family: ir.Family) -> tuple[str | None, int]:
    """The var axis standing for the batch, and what to add to a batch size to get its value."""
    var = [a.name for a in family.axes if isinstance(a, ir.VarAxis)]
    shapes = {t.name: t.shape for t in family.inputs}
    derived: set[str] = set()
    indptr_lengths: list[str] = []
    for t in family.inputs:
        if t.gen is None or not t.shape:
            continue
        kind = t.gen.kind
        if kind == "indptr":
            derived.add(t.shape[-1])
            if len(t.shape) == 1:
                indptr_lengths.append(t.shape[0])
            over = shapes.get(_hint_arg(t.gen, "over", 0) or "")
            if over:
                derived.add(over[0])
        elif kind in ("indices", "sparse_indices", "bsr_indices"):
            below = _hint_arg(t.gen, "below", 1 if kind == "bsr_indices" else 0)
            if below is not None:
                derived |= _names(below)
        elif kind == "last_page_len":
            derived.add(t.shape[0])
    used = {d for t in family.inputs if t.shape for d in t.shape}
    for name in var:
        if name in used and name not in derived:
            return name, 0
    if indptr_lengths:
        return indptr_lengths[0], 1
    return None, 0


def _input_bytes(defn: ir.Definition, axes: dict[str, int]) -> int:
    known = {a.name: a.value for a in defn.axes if a.kind == "const"} | axes
    return sum(
        math.prod(known.get(d) or DEFAULT_VAR_AXIS for d in t.shape) * DTYPE_BYTES[t.dtype]
        for t in defn.inputs
        if t.shape is not None
    )


def _axis_sets(family: ir.Family, defn: ir.Definition, first: bool) -> list[dict[str, int]]:
    """The var-axis values ``defn`` is tried at (Note [test axis values])."""
    axis, offset = _batch_axis(family)
    if axis is None:
        return [{}]
    sets = [{axis: b + offset} for b in BATCHES]
    if _input_bytes(defn, sets[0]) > LARGE_INPUTS:
        return sets[:1]
    return sets if first else sets[1:]


def _entry(defn: ir.Definition, family: ir.Family, first: bool) -> str:
    # Exploded with trailing commas, as black writes a call too long for one line.
    path = f"../definitions/{defn.op_type}/{defn.name}.json"
    sets = _axis_sets(family, defn, first)
    axes = "(" + ", ".join(inline_dict(a) for a in sets)
    axes += ",)" if len(sets) == 1 else ")"
    parts = [string(defn.name), string(path), f"axes={axes}"]
    if defn.param_values:
        parts.append(f"params={inline_dict(dict(defn.param_values))}")
    return "testing.Entry(\n" + "".join(f"        {p},\n" for p in parts) + "    ),"


def _tolerance(family: ir.Family) -> dict[str, float]:
    tol = family.tolerance
    if tol is None:
        return {}
    values = {"atol": tol.atol, "rtol": tol.rtol, "matched": tol.matched}
    return {k: v for k, v in values.items() if v is not None}


def emit_tests(module: ir.Module, package: str) -> list[GeneratedFile]:
    """One ``tests/test_<family>.py`` per family that has definitions."""
    sources = {f.name: sf.path for sf in module.files for f in sf.families}
    by_family: dict[str, list[ir.Definition]] = {}
    for d in module.definitions:
        by_family.setdefault(d.family, []).append(d)
    families = sorted((f for f in module.families() if f.name in by_family), key=lambda f: f.name)
    texts = []
    for family in families:
        defns = sorted(by_family[family.name], key=lambda d: d.name)
        hints = {t.name: _hint_text(t.gen) for t in family.inputs if t.gen is not None}
        texts.append(
            render(
                "test_family.py.j2",
                family=docstring_text(family.name),
                family_literal=string(family.name),
                package=string(package),
                hints=literal(hints),
                tolerance=literal(_tolerance(family)),
                entries=[_entry(d, family, i == 0) for i, d in enumerate(defns)],
            )
        )
    files = []
    for family, text in zip(families, format_python(texts, written_in_black_style=True)):
        source = source_label(sources[family.name])
        files.append(GeneratedFile(test_path(family), with_python_header(text, source), source))
    return files
