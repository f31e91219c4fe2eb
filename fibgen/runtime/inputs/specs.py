"""What input generation knows of a definition: its InputSpec, generation hints and dtypes.

Note [fp4]: ``float4_e2m1`` tensors are ``torch.float4_e2m1fn_x2`` when torch has it (each
element is one byte holding two FP4 values, so the declared last axis counts bytes), else
``uint8`` with the same packing. Random bytes are always valid: e2m1 has no NaN or Inf.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

import torch

from fibgen.format.expressions import ExpressionError, check_expression
from fibgen.format.hints import HintError, check_hint, parse_hint_text
from fibgen.format.models import var_axis_scalars

# (kind, positional argument texts, ((keyword, text), ...)): cheap to embed in generated code.
Hint = tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]

_FLOAT_DTYPES = {"float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1"}
INT_DTYPES = {"int64", "int32", "int16", "int8"}

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "float4_e2m1": getattr(torch, "float4_e2m1fn_x2", torch.uint8),  # Note [fp4]
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "bool": torch.bool,
}


class InputGenerationError(ValueError):
    """Inputs that cannot be made, or that violate a constraint of the definition."""


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a FlashInfer Trace dtype name."""
    try:
        return _TORCH_DTYPES[dtype]
    except KeyError:
        raise InputGenerationError(
            f"unknown dtype `{dtype}`; known: {', '.join(_TORCH_DTYPES)}"
        ) from None


def parse_hint(text: str) -> Hint:
    """Parse ``"indptr(over=kv_indices)"`` (the `.fidef` spelling, without `gen`) to a Hint."""
    try:
        return parse_hint_text(text)
    except HintError as e:
        raise InputGenerationError(str(e)) from None


def _norm_hint(hint: Any) -> Hint | None:
    if hint is None:
        return None
    if isinstance(hint, str):
        return parse_hint(hint)
    kind, args, kwargs = hint
    return (str(kind), tuple(args), tuple((k, v) for k, v in kwargs))


@dataclass(frozen=True)
class InputSpec:
    """What input generation needs to know about one definition."""

    name: str
    # (axis name, "var" | "const", value or None for var axes), in declaration order
    axes: tuple[tuple[str, str, int | None], ...]
    # (input name, dtype, shape or None for a Python scalar, optional, hint or None)
    inputs: tuple[tuple[str, str, tuple[str, ...] | None, bool, Hint | None], ...]
    constraints: tuple[str, ...] = ()
    params: dict = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        axis_names = {a[0] for a in self.axes}
        norm = []
        for name, dtype, shape, optional, hint in self.inputs:
            torch_dtype(dtype)
            if shape is not None:
                shape = tuple(shape)
                for dim in shape:
                    if dim not in axis_names:
                        raise InputGenerationError(
                            f"{self.name}: input `{name}` uses undeclared axis `{dim}`"
                        )
            hint = _norm_hint(hint)
            if hint is not None:
                try:
                    check_hint(hint[0], hint[1], hint[2])
                except HintError as e:
                    raise InputGenerationError(f"{self.name}: input `{name}`: {e}") from None
            norm.append((name, dtype, shape, bool(optional), hint))
        # What input generation evaluates is held to the checked language here, whatever
        # built the spec (Note [checked expressions] in fibgen/format/expressions.py).
        for text in self.constraints:
            try:
                check_expression(text)
            except ExpressionError as e:
                raise InputGenerationError(
                    f"{self.name}: constraint `{text}`: {e.message}"
                ) from None
        object.__setattr__(self, "inputs", tuple(norm))
        object.__setattr__(self, "axes", tuple((n, k, v) for n, k, v in self.axes))
        object.__setattr__(self, "constraints", tuple(self.constraints))

    def scalar_axes(self) -> dict[str, str]:
        """Var axes that an integer scalar input of their name gives: axis -> input (Note
        [axes bound by a scalar] in fibgen/compiler/ir.py)."""
        return var_axis_scalars(
            {n: {"type": k} for n, k, _ in self.axes},
            {i[0]: {"shape": i[2], "dtype": i[1], "optional": i[3]} for i in self.inputs},
        )

    @classmethod
    def from_definition_json(cls, d: dict, hints: dict | None = None) -> "InputSpec":
        """Build from a FlashInfer Trace definition dict; ``hints`` maps input name to hint.

        Without a hint, a sampling definition's ``probs`` are probability rows: that is how
        flashinfer-bench makes them (a softmax of random values), and random normals are not.
        """
        hints = dict(hints or {})
        if d.get("op_type") == "sampling" and "probs" in d["inputs"]:
            hints.setdefault("probs", "prob()")
        axes = tuple(
            (name, a["type"], a.get("value") if a["type"] == "const" else None)
            for name, a in d["axes"].items()
        )
        inputs = tuple(
            (
                name,
                t["dtype"],
                None if t.get("shape") is None else tuple(t["shape"]),
                bool(t.get("optional", False)),
                hints.get(name),
            )
            for name, t in d["inputs"].items()
        )
        return cls(d["name"], axes, inputs, tuple(d.get("constraints", ())), {})

    @classmethod
    def from_ir(cls, definition: Any, family: Any = None) -> "InputSpec":
        """Build from a compiled ``ir.Definition`` (hints come from its ``ir.Family``)."""
        hints: dict[str, Hint] = {}
        if family is not None:
            for t in family.inputs:
                if t.gen is not None:
                    hints[t.name] = (
                        t.gen.kind,
                        tuple(a.text for a in t.gen.args),
                        tuple((k, v.text) for k, v in t.gen.kwargs),
                    )
        axes = tuple((a.name, a.kind, a.value) for a in definition.axes)
        inputs = tuple(
            (t.name, t.dtype, t.shape, t.optional, hints.get(t.name)) for t in definition.inputs
        )
        return cls(
            definition.name,
            axes,
            inputs,
            tuple(definition.constraints),
            dict(definition.param_values),
        )


def names(text: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}


def bare_name(text: str) -> str | None:
    node = ast.parse(text, mode="eval").body
    return node.id if isinstance(node, ast.Name) else None
