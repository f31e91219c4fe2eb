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
#   whose size both know is the same size; where the ranks differ, consecutive dimensions of
#   the longer shape are one view of one dimension of the shorter, the others the same in
#   order (FlashInfer's `query` is `[nnz, heads * head_size]`, the catalogue's `q`
#   `[tokens, heads, head_size]`; FlashInfer's `v` is `[batch, heads, kv_len, head_dim]`, a
#   definition's `[batch, heads, kv_len / 16, 16, head_dim]`, its keys in blocks of 16): their
#   sizes multiply to it where all are known, divide it where some are var;
# * a const value FlashInfer reports that no paired dimension holds is compared with the
#   catalogue's const axis of the same name, where it has one.
#
# Where FlashInfer's template and the kernel it describes say less than the call holds, a pair
# still agrees, with the difference said:
#
# * a scalar and a tensor of rank 0 or 1 by the same name (FlashInfer's templates call a
#   parameter that takes a float or a per-row tensor a scalar: `temperature`, `top_p`);
# * a rank-0 tensor and one whose every known size is 1 (`A_scale` of `[scalar]`);
# * a byte tensor (`uint8`, what FP4 and UE8M0 data are stored in when passed) and one of a
#   dtype of at most a byte (`float4_e2m1`, `int8`); UE8M0 scales FlashInfer returns as
#   torch's `float8_e8m0fnu` and the `int8` bytes the language holds them in (it has no
#   UE8M0 dtype); torch's packed `float4_e2m1fn_x2` and the language's `float4_e2m1`
#   (Note [fp4] of the runtime); index tensors of `int32`,
#   `uint32` and `int64` (the kernels take one or another; the language has no unsigned
#   index dtype);
# * a tensor FlashInfer lists among the inputs that the definition has among its outputs (a
#   destination the caller passes: `out`) or that FlashInfer lists among its outputs too, and
#   a scratch buffer FlashInfer's template lists
#   (`workspace_buffer`, `semaphores`), which holds no data of the call.
#
# A tensor input FlashInfer's JSON requires that pairs with nothing is a disagreement: the
# call passed a tensor the definition has no place for. What else either side holds beyond
# the pairs (FlashInfer's extra `residual` output, a scalar or an optional tensor the
# catalogue keeps as a rule, a tensor FlashInfer's template does not describe) is a
# difference to report.
#
# A FlashInfer-Bench trace is a definition and a workload, whose `axes` record the values of
# the definition's var axes for the call (read from its input tensors' shapes). Where they are
# given (`resolve(..., axes=)`), each value of an axis that FlashInfer's JSON leaves var (or
# const without a value, or does not name) is compared with the candidate's const axis of the
# same name: one of another value does not agree; a candidate that lacks the axis, or holds it
# var, is not excluded by it. They are compared by name only, not by the dimensions they
# pair with: FlashInfer's templates misdescribe some shapes in ways that the JSON's var axes
# hide (a permuted output, a padded stride, two dimensions viewed as one), and a value put
# there would rule out the call's own definition. A workload value that the JSON's own const
# value of its name contradicts is not one call: no candidate agrees.
#
# Of the candidates that agree, the one with FlashInfer's name is "same"; else a single one
# is "resolved" (said "num_qo_heads=32 from the workload" where the workload's values chose
# it among several the JSON agrees with), several "ambiguous" (the JSON and the workload do
# not say enough: an unknown page size), none "none", with the reason: the workload's
# conflicts where the JSON alone agrees with some, else the nearest candidate's
# disagreements. A workload value that contradicts the candidate of FlashInfer's name, or the
# only one that agrees, rules it out as any other.

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


def _is_scratch(name: str) -> bool:
    """A buffer FlashInfer's kernels work in (Note [resolving FlashInfer's definitions])."""
    return "workspace" in name or name in ("semaphores", "workspace_buffer")


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


# Dtypes that one tensor passed can be described by (Note [resolving FlashInfer's definitions]).
_BYTE_HELD = {"uint8", "int8", "float4_e2m1", "float8_e8m0fnu", "float8_e4m3fn", "float8_e5m2"}
_INDEX = {"int32", "uint32", "int64"}


# torch's names of dtypes that the language spells otherwise.
_TORCH_SPELLING = {"float4_e2m1fn_x2": "float4_e2m1"}


def _dtypes_agree(fi: str, cat: str) -> bool:
    fi = _TORCH_SPELLING.get(fi, fi)
    if fi == cat:
        return True
    if fi == "uint8" and cat in _BYTE_HELD:
        return True
    if fi == "float8_e8m0fnu" and cat == "int8":
        return True
    return fi in _INDEX and cat in _INDEX


def _sizes_agree(fi: tuple[int | None, ...], cat: tuple[int | None, ...]) -> bool:
    """Whether two shapes can be the same tensor (Note [resolving FlashInfer's definitions])."""
    if len(fi) == len(cat):
        return _dims_agree(fi, cat)
    short, long = (fi, cat) if len(fi) < len(cat) else (cat, fi)
    if not short:
        return all(s is None or s == 1 for s in long)
    # One dimension of the shorter shape is consecutive dimensions of the longer, viewed; the
    # others are the same dimensions, in order.
    extra = len(long) - len(short)
    return any(
        _dims_agree(short[:i], long[:i])
        and _merges_to(short[i], long[i : i + extra + 1])
        and _dims_agree(short[i + 1 :], long[i + extra + 1 :])
        for i in range(len(short))
    )


def _dims_agree(a: tuple[int | None, ...], b: tuple[int | None, ...]) -> bool:
    return all(x is None or y is None or x == y for x, y in zip(a, b))


def _merges_to(merged: int | None, parts: tuple[int | None, ...]) -> bool:
    """Whether dimensions of sizes ``parts`` can be viewed as one of size ``merged``: their
    sizes multiply to it where all are known, divide it where some are var."""
    if merged is None:
        return True
    known = [s for s in parts if s is not None]
    product = math.prod(known)
    if len(known) == len(parts):
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
        inputs_left = self._side("inputs", "input")
        outputs_left = self._side("outputs", "output")
        self._destinations(inputs_left, outputs_left)
        self._unplaced_consts()

    @property
    def agrees(self) -> bool:
        return self.pairs > 0 and not self.conflicts

    def _pair_problem(self, f: _Tensor, c: _Tensor, by_name: bool = False) -> str | None:
        if (f.shape is None) != (c.shape is None):
            tensor = c if f.shape is None else f
            if by_name and len(tensor.shape or ()) <= 1:
                return None  # Note [resolving FlashInfer's definitions]: a difference
            where = "FlashInfer's JSON" if f.shape is None else "the definition"
            return f"a scalar in {where} and a tensor in the other"
        if f.shape is None:
            return None
        if f.dtype != "unknown" and not _dtypes_agree(f.dtype, c.dtype):
            return f"of dtype {f.dtype}, not {c.dtype}"
        if not _sizes_agree(f.sizes, c.sizes):
            return f"of shape {_shape_text(f)}, not {_shape_text(c)}"
        return None

    def _side(self, side: str, word: str) -> tuple[list[_Tensor], list[_Tensor]]:
        """Pair one side's tensors; what is left of FlashInfer's and of the definition's."""
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
            problem = self._pair_problem(f, c, by_name=True)
            if problem is not None:
                self.conflicts.append(f"{word} `{f.name}` is {problem}")
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
        return unpaired_fi, left_cat

    def _destinations(
        self,
        inputs: tuple[list[_Tensor], list[_Tensor]],
        outputs: tuple[list[_Tensor], list[_Tensor]],
    ) -> None:
        """FlashInfer's inputs left over that are the definition's outputs (a destination the
        call passes) or scratch; then what is left of either side, said."""
        fi_inputs, cat_inputs = inputs
        fi_outputs, cat_outputs = outputs
        fi_output_names = {t.name for t in _tensors(self.fi, "outputs")}
        for f in list(fi_inputs):
            if f.shape is None:
                continue
            if f.name in fi_output_names:
                fi_inputs.remove(f)
                self.differences.append(f"FlashInfer lists output `{f.name}` among its inputs")
                continue
            match = next((c for c in cat_outputs if c.name == f.name), None)
            if match is None or self._pair_problem(f, match) is not None:
                match = next((c for c in cat_outputs if self._pair_problem(f, c) is None), None)
            if match is not None:
                fi_inputs.remove(f)
                cat_outputs.remove(match)
                self.pairs += 1
                self._note_pair(f, match, "input")
                self.differences.append(f"FlashInfer's input `{f.name}` is output `{match.name}`")
            elif _is_scratch(f.name):
                fi_inputs.remove(f)
                self.differences.append(f"FlashInfer's input `{f.name}` is scratch")
        for word, fis, cats in (
            ("input", fi_inputs, cat_inputs),
            ("output", fi_outputs, cat_outputs),
        ):
            for f in fis:
                kind = "scalar" if f.shape is None else _shape_text(f)
                if word == "input" and f.shape is not None and not f.optional:
                    # A tensor the call must pass that the definition has no place for: not a
                    # call of this definition.
                    self.conflicts.append(f"input `{f.name}` {kind} pairs with no input")
                    continue
                what = "optional " if f.optional else ""
                self.differences.append(f"FlashInfer adds {what}{word} `{f.name}` ({kind})")
            for c in cats:
                self.differences.append(f"{word} `{c.name}` has no FlashInfer counterpart")

    def _note_pair(self, f: _Tensor, c: _Tensor, word: str) -> None:
        if f.shape is None or c.shape is None:
            # A scalar paired by name with a tensor of rank 0 or 1: agreeing, said.
            if f.shape is not None or c.shape is not None:
                where = "FlashInfer's JSON" if f.shape is None else "the definition"
                self.differences.append(
                    f"{word} `{f.name}` is a scalar in {where} and a tensor in the other"
                )
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


def resolve(
    flashinfer: Mapping[str, Any],
    candidates: Iterable[Any],
    *,
    axes: Mapping[str, int] | None = None,
) -> Resolution:
    """Which of ``candidates`` (catalogue definitions: JSON or models, those that stand for
    its entry point) the FlashInfer definition JSON ``flashinfer`` stands for. ``axes``, the
    values of its var axes that a workload of the call records (a FlashInfer-Bench trace's
    ``workload.axes``), tells apart candidates the JSON alone cannot, and rules out those it
    contradicts (Note [resolving FlashInfer's definitions])."""
    workload = _workload_axes(axes)
    name = str(flashinfer.get("name"))
    entry = entry_point_of(flashinfer)
    tried = sorted((_as_json(c) for c in candidates), key=lambda c: str(c.get("name")))
    contradicted = _contradicted(flashinfer, workload)
    # The values of the axes the JSON leaves var (or does not name): what the workload adds.
    # Those the JSON holds the comparisons have checked already.
    said = flashinfer.get("axes") or {}
    workload = {a: v for a, v in workload.items() if _const(said.get(a)) is None}
    comparisons = [(str(c.get("name")), _Comparison(flashinfer, c)) for c in tried]
    # What the workload's values contradict of each candidate: its const axes of their names.
    definitions = {str(c.get("name")): c for c in tried}
    against = {n: contradicted + _workload_conflicts(c, workload) for n, c in definitions.items()}
    by_json = [(n, c) for n, c in comparisons if c.agrees]  # those the JSON alone agrees with
    agreeing = [(n, c) for n, c in by_json if not against[n]]
    exact = [(n, c) for n, c in agreeing if n == name]
    if exact:
        n, c = exact[0]
        return Resolution(name, entry, "same", n, (n,), tuple(c.differences))
    if len(agreeing) == 1:
        n, c = agreeing[0]
        # Where the JSON alone left several: the workload's values that told them apart.
        chosen = tuple(
            f"{a}={v} from the workload"
            for a, v in workload.items()
            if any(_workload_conflicts(definitions[m], {a: v}) for m, _ in by_json if m != n)
        )
        return Resolution(
            name, entry, "resolved", n, (n,), (f"named `{n}`",) + chosen + tuple(c.differences)
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
    if by_json and contradicted:
        why = "the workload is not of FlashInfer's JSON: " + ", ".join(contradicted)
        return Resolution(name, entry, "none", None, tuple(n for n, _ in by_json), (why,))
    if by_json:
        # The JSON agrees with some; the workload's values with none of those.
        why = "the workload's axes fit none of those that agree: " + "; ".join(
            f"`{n}`: " + ", ".join(against[n]) for n, _ in by_json
        )
        return Resolution(name, entry, "none", None, tuple(n for n, _ in by_json), (why,))
    nearest_name, nearest = min(
        comparisons, key=lambda nc: (len(nc[1].conflicts) + len(against[nc[0]]), nc[0])
    )
    conflicts = nearest.conflicts + against[nearest_name]
    why = f"nearest `{nearest_name}`: " + ", ".join(conflicts or ["nothing pairs"])
    return Resolution(name, entry, "none", None, tuple(n for n, _ in comparisons), (why,))


def _workload_axes(axes: Mapping[str, int] | None) -> dict[str, int]:
    """The workload's axis values, checked: each a whole number, named."""
    if axes is None:
        return {}
    if not isinstance(axes, Mapping):
        raise TypeError(
            "the workload's axes are a mapping of axis names to sizes "
            f"(a trace's workload.axes), not {type(axes).__name__}"
        )
    checked = {}
    for name, value in axes.items():
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"the workload's axis {name!r} is {value!r}, not a whole number")
        checked[name] = value
    return checked


def _contradicted(flashinfer: Mapping[str, Any], workload: Mapping[str, int]) -> list[str]:
    """The workload's values that the JSON's own const values contradict: not one call."""
    axes = flashinfer.get("axes") or {}
    return [
        f"the workload's `{name}`={value}, where FlashInfer's JSON says {said}"
        for name, value in workload.items()
        if (said := _const(axes.get(name))) is not None and said != value
    ]


def _workload_conflicts(cat: Mapping[str, Any], workload: Mapping[str, int]) -> list[str]:
    """The workload's values that a definition's const axes of their names contradict (an
    axis it lacks, or holds var, excludes nothing)."""
    axes = cat.get("axes") or {}
    return [
        f"the workload's `{name}` is {value}, not {held}"
        for name, value in workload.items()
        if (held := _const(axes.get(name))) is not None and held != value
    ]


def _shared(agreeing: list[tuple[str, _Comparison]]) -> tuple[str, ...]:
    """The differences every agreeing candidate has (why the JSON cannot tell them apart)."""
    first = agreeing[0][1].differences
    return tuple(d for d in first if all(d in c.differences for _, c in agreeing[1:]))
