"""Which catalogue definition a definition JSON that FlashInfer's tracer wrote stands for.

FlashInfer 0.7.2's templates name what they trace from their own const axes and describe it in
their own schema, which is not always the dataset's: ``silu_and_mul`` emits
``silu_and_mul_h24576`` (named by the input's width, its tensor called ``input``) where the
catalogue has ``silu_and_mul_h12288_bf16`` (named by the output's width, over ``x``);
``fused_add_rmsnorm`` adds a ``residual`` output; the samplers drop ``_from_probs``. So a
traced definition is matched by what it says of the call rather than by its name alone
(Note [resolving FlashInfer's definitions]).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

# Note [resolving FlashInfer's definitions]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A definition JSON that FlashInfer's `fi_trace` writes for a call holds, per tensor, the dtype
# of the tensor passed (or "unknown" where the call did not hold it) and the values of its
# const axes, read from the tensors' shapes. A catalogue definition stands for that call when
# what the JSON knows of it agrees with the definition:
#
# * tensors are paired side by side (inputs with inputs, outputs with outputs): by name
#   first, then each remaining FlashInfer tensor with the first remaining catalogue tensor, in
#   order, that agrees with it (FlashInfer's `input` is the catalogue's `x`); scalars only by
#   name;
# * a pair agrees when the dtypes are equal (or FlashInfer's is unknown) and each dimension
#   whose size both know is the same size; where the ranks differ, the trailing dimensions of
#   the longer shape are one view of the last of the shorter (FlashInfer's `query` is
#   `[nnz, heads * head_size]`, the catalogue's `q` `[tokens, heads, head_size]`): their sizes
#   multiply to it where all are known, divide it where some are var;
# * a const value FlashInfer reports that no paired dimension holds is compared with the
#   catalogue's const axis of the same name, where it has one.
#
# A tensor input FlashInfer's JSON requires that pairs with nothing is a disagreement: the
# call passed a tensor the definition has no place for. What else either side holds beyond
# the pairs (FlashInfer's extra `residual` output, a scalar or an optional tensor the
# catalogue keeps as a rule, a tensor FlashInfer's template does not describe) is a
# difference to report. Of the candidates that agree, the one with
# FlashInfer's name is "same"; else a single one is "resolved", several "ambiguous" (the JSON
# does not say enough: an unknown page size), none "none", with the nearest candidate's
# disagreements as the reason.

Kind = Literal["same", "resolved", "ambiguous", "none"]


@dataclass(frozen=True)
class Resolution:
    """What one FlashInfer definition JSON stands for in a catalogue."""

    flashinfer_name: str
    entry_point: str | None  # its `fi_api:` tag
    kind: Kind
    definition: str | None  # the catalogue definition ("same" or "resolved")
    candidates: tuple[str, ...] = ()  # those that agree ("ambiguous"), else the ones tried
    differences: tuple[str, ...] = ()  # how the JSON differs from `definition`, or why none

    def describe(self) -> str:
        """One line: ``silu_and_mul_h24576 -> silu_and_mul_h12288_bf16 (resolved: ...)``."""
        if self.kind in ("same", "resolved"):
            head = f"{self.flashinfer_name} -> {self.definition} ({self.kind}"
        elif self.kind == "ambiguous":
            head = f"{self.flashinfer_name} -> one of {', '.join(self.candidates)} (ambiguous"
        else:
            head = f"{self.flashinfer_name} -> nothing (none"
        return head + ("; " + "; ".join(self.differences) if self.differences else "") + ")"


def entry_point_of(definition: Mapping[str, Any]) -> str | None:
    """The entry point a FlashInfer definition names in its ``fi_api:`` tag."""
    for tag in definition.get("tags") or ():
        if isinstance(tag, str) and tag.startswith("fi_api:"):
            return tag[len("fi_api:") :]
    return None


def _as_json(definition: Any) -> Mapping[str, Any]:
    if hasattr(definition, "model_dump"):
        return definition.model_dump(mode="json")
    return definition


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[str, ...] | None
    dtype: str
    optional: bool
    sizes: tuple[int | None, ...]  # per dimension: its const value where known


def _tensors(definition: Mapping[str, Any], side: str) -> list[_Tensor]:
    axes = definition.get("axes") or {}
    found = []
    for name, spec in (definition.get(side) or {}).items():
        shape = spec.get("shape")
        sizes: tuple[int | None, ...] = ()
        if shape is not None:
            shape = tuple(shape)
            sizes = tuple(_const(axes.get(d)) for d in shape)
        found.append(
            _Tensor(name, shape, str(spec.get("dtype")), bool(spec.get("optional")), sizes)
        )
    return found


def _const(axis: Any) -> int | None:
    if isinstance(axis, Mapping) and axis.get("type") == "const":
        value = axis.get("value")
        return value if isinstance(value, int) else None
    return None


def _shape_text(t: _Tensor) -> str:
    if t.shape is None:
        return "scalar"
    dims = [d if s is None else f"{d}={s}" for d, s in zip(t.shape, t.sizes)]
    return "[" + ", ".join(dims) + "]"


def _sizes_agree(fi: tuple[int | None, ...], cat: tuple[int | None, ...]) -> bool:
    """Whether two shapes can be the same tensor (Note [resolving FlashInfer's definitions])."""
    if len(fi) == len(cat):
        return all(a is None or b is None or a == b for a, b in zip(fi, cat))
    short, long = (fi, cat) if len(fi) < len(cat) else (cat, fi)
    if not short:
        return False
    head = len(short) - 1
    if not all(a is None or b is None or a == b for a, b in zip(short[:head], long[:head])):
        return False
    merged, tail = short[head], long[head:]
    known = [s for s in tail if s is not None]
    product = math.prod(known)
    if merged is None:
        return True
    if len(known) == len(tail):
        return merged == product
    return product > 0 and merged % product == 0


class _Comparison:
    """One FlashInfer JSON against one catalogue definition."""

    def __init__(self, fi: Mapping[str, Any], cat: Mapping[str, Any]) -> None:
        self.fi, self.cat = fi, cat
        self.conflicts: list[str] = []
        self.differences: list[str] = []
        self.pairs = 0
        self.checked_axes: set[str] = set()
        for side, word in (("inputs", "input"), ("outputs", "output")):
            self._side(side, word)
        self._unplaced_consts()

    @property
    def agrees(self) -> bool:
        return self.pairs > 0 and not self.conflicts

    def _pair_problem(self, f: _Tensor, c: _Tensor) -> str | None:
        if (f.shape is None) != (c.shape is None):
            return "one is a scalar, the other a tensor"
        if f.dtype != "unknown" and f.shape is not None and f.dtype != c.dtype:
            return f"dtype {f.dtype}, not {c.dtype}"
        if f.shape is not None and not _sizes_agree(f.sizes, c.sizes):
            return f"shape {_shape_text(f)}, not {_shape_text(c)}"
        return None

    def _side(self, side: str, word: str) -> None:
        fis, cats = _tensors(self.fi, side), _tensors(self.cat, side)
        cat_by_name = {c.name: c for c in cats}
        paired: list[tuple[_Tensor, _Tensor]] = []
        left_fi: list[_Tensor] = []
        used: set[str] = set()
        for f in fis:
            c = cat_by_name.get(f.name)
            if c is None:
                left_fi.append(f)
                continue
            problem = self._pair_problem(f, c)
            if problem is not None:
                self.conflicts.append(f"{word} `{f.name}` has {problem}")
            paired.append((f, c))
            used.add(c.name)
        left_cat = [c for c in cats if c.name not in used]
        unpaired_fi: list[_Tensor] = []
        for f in left_fi:
            match = None
            if f.shape is not None:
                match = next((c for c in left_cat if self._pair_problem(f, c) is None), None)
            if match is None:
                unpaired_fi.append(f)
                continue
            left_cat.remove(match)
            paired.append((f, match))
            self.differences.append(f"{word} `{f.name}` is `{match.name}`")
        for f, c in paired:
            self.pairs += 1
            self._note_pair(f, c, word)
        for f in unpaired_fi:
            kind = "scalar" if f.shape is None else _shape_text(f)
            if side == "inputs" and f.shape is not None and not f.optional:
                # A tensor the call must pass that the definition has no place for: not a
                # call of this definition.
                self.conflicts.append(f"input `{f.name}` {kind} pairs with no input")
                continue
            what = "optional " if f.optional else ""
            self.differences.append(f"FlashInfer adds {what}{word} `{f.name}` ({kind})")
        for c in left_cat:
            self.differences.append(f"{word} `{c.name}` has no FlashInfer counterpart")

    def _note_pair(self, f: _Tensor, c: _Tensor, word: str) -> None:
        if f.shape is None:
            return
        fi_axes = self.fi.get("axes") or {}
        if f.dtype == "unknown":
            self.differences.append(f"FlashInfer gives no dtype for {word} `{f.name}`")
        if len(f.shape) != len(c.shape):
            self.differences.append(
                f"{word} `{f.name}` {_shape_text(f)} is `{c.name}` {_shape_text(c)} viewed"
            )
        for axis, size, other in zip(f.shape, f.sizes, c.shape):
            if size is not None:
                self.checked_axes.add(axis)
                if len(f.shape) == len(c.shape) and axis != other:
                    note = f"axis `{axis}`={size} is `{other}`"
                    if note not in self.differences:
                        self.differences.append(note)
            elif isinstance(fi_axes.get(axis), Mapping) and fi_axes[axis].get("type") == "const":
                note = f"FlashInfer's const axis `{axis}` has no value"
                if note not in self.differences:
                    self.differences.append(note)

    def _unplaced_consts(self) -> None:
        cat_axes = self.cat.get("axes") or {}
        for name, axis in (self.fi.get("axes") or {}).items():
            value = _const(axis)
            if value is None or name in self.checked_axes:
                continue
            other = _const(cat_axes.get(name))
            if other is None:
                self.differences.append(f"FlashInfer's const axis `{name}`={value} is not checked")
            elif other != value:
                self.conflicts.append(f"axis `{name}` is {value}, not {other}")


def resolve(flashinfer: Mapping[str, Any], candidates: Iterable[Any]) -> Resolution:
    """Which of ``candidates`` (catalogue definitions: JSON or models, those that stand for
    its entry point) the FlashInfer definition JSON ``flashinfer`` stands for (Note
    [resolving FlashInfer's definitions])."""
    name = str(flashinfer.get("name"))
    entry = entry_point_of(flashinfer)
    tried = sorted((_as_json(c) for c in candidates), key=lambda c: str(c.get("name")))
    comparisons = [(str(c.get("name")), _Comparison(flashinfer, c)) for c in tried]
    agreeing = [(n, c) for n, c in comparisons if c.agrees]
    exact = [(n, c) for n, c in agreeing if n == name]
    if exact:
        n, c = exact[0]
        return Resolution(name, entry, "same", n, (n,), tuple(c.differences))
    if len(agreeing) == 1:
        n, c = agreeing[0]
        return Resolution(
            name, entry, "resolved", n, (n,), (f"named `{n}`",) + tuple(c.differences)
        )
    if agreeing:
        names = tuple(n for n, _ in agreeing)
        return Resolution(name, entry, "ambiguous", None, names, _shared(agreeing))
    if not comparisons:
        why = (
            f"no catalogue definition stands for {entry}"
            if entry
            else "it names no entry point (no fi_api tag)"
        )
        return Resolution(name, entry, "none", None, (), (why,))
    nearest_name, nearest = min(comparisons, key=lambda nc: (len(nc[1].conflicts), nc[0]))
    why = f"nearest `{nearest_name}`: " + ", ".join(nearest.conflicts or ["nothing pairs"])
    return Resolution(name, entry, "none", None, tuple(n for n, _ in comparisons), (why,))


def _shared(agreeing: list[tuple[str, _Comparison]]) -> tuple[str, ...]:
    """The differences every agreeing candidate has (why the JSON cannot tell them apart)."""
    first = agreeing[0][1].differences
    return tuple(d for d in first if all(d in c.differences for _, c in agreeing[1:]))
