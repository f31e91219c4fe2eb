"""The Definition model: axes, tensors, constraints and a reference, checked together."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from fibgen.format.expressions import HELP, ExpressionError, check_expression
from fibgen.format.models.base import DType, Model, NonEmptyStr, check_name, raise_problems


class AxisVar(Model):
    """An axis whose size is read from the input tensors at call time."""

    type: Literal["var"] = "var"
    description: Optional[str] = None


class AxisConst(Model):
    """An axis whose size is fixed by the definition."""

    type: Literal["const"] = "const"
    value: int = Field(ge=0)
    description: Optional[str] = None


Axis = Annotated[Union[AxisVar, AxisConst], Field(discriminator="type")]


class TensorSpec(Model):
    """One input or output: a shape over declared axes (None for a scalar) and a dtype."""

    shape: Optional[list[NonEmptyStr]]
    dtype: DType
    description: Optional[str] = None
    # FlashInfer extension: the argument may be None at call time. flashinfer-bench ignores it.
    optional: bool = False

    @property
    def is_scalar(self) -> bool:
        """True when the value is a Python scalar passed by value (``shape: null``)."""
        return self.shape is None


class Definition(Model):
    """A kernel definition: axes, tensors, constraints and a Python reference."""

    # Field order is the canonical key order of a definition file (see jsonio).
    name: NonEmptyStr
    description: Optional[str] = None
    op_type: NonEmptyStr
    tags: list[NonEmptyStr] = Field(default_factory=list)
    axes: dict[NonEmptyStr, Axis]
    constraints: list[NonEmptyStr] = Field(default_factory=list)
    inputs: dict[NonEmptyStr, TensorSpec]
    outputs: dict[NonEmptyStr, TensorSpec]
    reference: NonEmptyStr

    @field_validator("name", "op_type")
    @classmethod
    def _validate_name(cls, value: str) -> str:
        return check_name(value)

    @model_validator(mode="after")
    def _validate(self) -> Definition:
        # flashinfer-bench runs four separate validators (_validate_reference_code,
        # _validate_input_output_names, _validate_constraints_syntax,
        # _validate_tensor_axis_references); the same checks run here in one pass so that
        # every problem is reported together.
        problems = (
            reference_problems(self.reference)
            + _name_problems(self)
            + constraint_problems(self.constraints)
            + _axis_reference_problems(self)
        )
        raise_problems(problems)
        return self

    @property
    def var_axes(self) -> list[str]:
        """Names of the var axes, in declaration order."""
        return [name for name, axis in self.axes.items() if axis.type == "var"]

    @property
    def scalar_axes(self) -> dict[str, str]:
        """Var axes bound by an integer scalar input: axis -> input (``var_axis_scalars``)."""
        return var_axis_scalars(self.axes, self.inputs)

    @property
    def const_axes(self) -> dict[str, int]:
        """Const axis name -> value, in declaration order."""
        return {name: axis.value for name, axis in self.axes.items() if axis.type == "const"}


INTEGER_DTYPES = ("int64", "int32", "int16", "int8")


def var_axis_scalars(axes: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, str]:
    """The var axes that an integer scalar input binds: axis name -> input name.

    ``axes`` and ``inputs`` as a definition JSON holds them (dicts), or as the model does. A
    var axis that no input's shape carries, and that a required integer scalar input
    (``shape: null``) is named like, takes that input's value: FlashInfer's trace templates
    bind such an axis by name (``max_seq_len`` of ``fp8_paged_mqa_logits``), see Note [axes
    bound by a scalar] in fibgen/compiler/ir.py. An axis an input's shape carries is read
    from the shape, as flashinfer-bench reads it.
    """
    carried = {d for t in inputs.values() for d in (_field(t, "shape") or ())}
    out = {}
    for name, axis in axes.items():
        if _field(axis, "type") != "var" or name in carried or name not in inputs:
            continue
        t = inputs[name]
        if (
            _field(t, "shape") is None
            and _field(t, "dtype") in INTEGER_DTYPES
            and not _field(t, "optional")
        ):
            out[name] = name
    return out


def _field(node: Any, key: str) -> Any:
    return node.get(key) if isinstance(node, Mapping) else getattr(node, key, None)


def reference_problems(reference: str) -> list[str]:
    """Problems with a reference: not Python, or no top-level ``def run``."""
    try:
        module = ast.parse(reference, mode="exec")
    except SyntaxError as exc:
        return [
            f"reference: not valid Python: {exc.msg} "
            f"(line {exc.lineno}, column {exc.offset} of the reference)"
        ]
    except (ValueError, MemoryError, RecursionError) as exc:  # NUL byte; too deeply nested
        return [f"reference: not valid Python: {str(exc) or 'too deeply nested'}"]
    if not any(isinstance(node, ast.FunctionDef) and node.name == "run" for node in module.body):
        return [
            "reference: defines no top-level function 'run' "
            "(the reference must contain 'def run(...)' at module level)"
        ]
    return []


def constraint_problems(constraints: list[str]) -> list[str]:
    """Problems with constraints: each must be an expression of the checked language that
    input generation evaluates (Note [checked expressions] in ``fibgen.format.expressions``)."""
    problems = []
    for i, text in enumerate(constraints):
        try:
            check_expression(text)
        except ExpressionError as exc:
            if exc.message.startswith("not an expression"):
                problems.append(
                    f"constraints[{i}]: {text!r} is not a Python expression "
                    f"({exc.message.removeprefix('not an expression: ')}); "
                    "write a condition such as 'num_pages >= batch_size'"
                )
                continue
            problems.append(
                f"constraints[{i}]: {text!r}: {exc.message} (column {exc.column}); {HELP}"
            )
    return problems


def _name_problems(defn: Definition) -> list[str]:
    return [
        f"outputs.{name}: the name {name!r} is also an input; "
        "input and output names must be different"
        for name in defn.outputs
        if name in defn.inputs
    ]


def _axis_reference_problems(defn: Definition) -> list[str]:
    problems = []
    for group, tensors in (("inputs", defn.inputs), ("outputs", defn.outputs)):
        for tname, spec in tensors.items():
            for i, axis in enumerate(spec.shape or ()):
                if axis not in defn.axes:
                    problems.append(
                        f"{group}.{tname}.shape[{i}]: axis {axis!r} is not declared in 'axes'"
                    )
    return problems
