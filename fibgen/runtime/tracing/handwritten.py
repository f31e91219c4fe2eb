"""What tracing reads off a call of hand-written code routed by name (``apply``).

Note [recorded hand-written calls]
flashinfer-bench's ``apply`` records the calls it routes while its tracing is on, and so does
fibgen's. A hand-written call names its definition and passes the definition's inputs (by
position in its order, by name, or both; with or without its outputs: the two calling
styles, Note [calling styles] in fibgen/runtime/solutions/loading.py), so once the definition
is found, the call's workload is read off its arguments as a generated dispatcher's is: each
var axis from the shape of the first input given that carries it, or from the integer scalar
input of its name (an int, a numpy integer or a 0-d integer tensor; an axis only a left-out
optional input carries is left out), tensors copied per the dump policy. The definition is the
traced dataset's own where it has one (its records must be workloads of that one), else the
one of the dataset apply routes the name from, else fibgen's catalogue's; tracing copies it
into the traced dataset beside the first workloads, as it copies a dispatcher's. A definition
added to a dataset after a lookup missed it is seen at the next enable_tracing or
enable_apply. A one-byte float input passed as its bytes (uint8 or int8) is recorded as the
definition's dtype.

A call is recorded only if it is a workload of the definition: its tensors as the contract
says (Note [checked records]), no required input None, each scalar input a value of its
dtype's kind (a bool, an integer, a real number; a 0-d tensor is recorded as its value, which
for a CUDA tensor costs a synchronization, and in CUDA-graph capture is not read: the call is
counted ``capturing``), every scalar that gives an axis a non-negative integer; else it is
counted ``mismatched`` (as is a call apply's input check refuses) and the first one said. A
call that cannot be recorded at all is counted ``handwritten`` and said once per name: a name
with no definition, a definition file that is not one, a dataset whose definitions cannot be
read, arguments that are not the definition's inputs (a decorated function of another
signature).

The calls of a definition made inside a recorded hand-written call of the same definition (a
decorated function whose body calls FlashInfer's patched API, or ``apply`` of its own name)
are the same workload: they are counted ``inner``, not recorded again, with apply on or off;
so are those of the fallback that runs when the call's solution fails (routing hands it to
tracing's ``detour``). The calls inside a hand-written call that was not recorded are
recorded as their own.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from fibgen.runtime.solutions.loading import bind_arguments, input_values
from fibgen.runtime.tracing.checks import BYTES, contract, mismatch_of, one_byte_float


class CaptureRead(Exception):
    """A call's scalar is a CUDA tensor, and a CUDA graph is being captured: reading its
    value would synchronize, which capture forbids."""


class Target(NamedTuple):
    """A definition as the recorder reads a call of it (the attributes it reads of a
    dispatcher's API), and how a hand-written call's arguments become its inputs."""

    inputs: tuple[str, ...]
    op_type: str
    trace_axes: Callable[..., dict[str, int | None]]
    # The call's input values in the definition's order, or why its arguments are not them.
    values: Callable[[tuple[Any, ...], Mapping[str, Any]], "list[Any] | str"]
    # Why input values are not a workload of the definition, or None.
    check: Callable[[Sequence[Any]], "str | None"]


def axis_value(value: Any) -> int | None:
    """The integer a scalar input gives its axis (an int, a numpy integer, a 0-d integer
    tensor, as ``int()`` reads them in generated code), or None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 and not (value.is_floating_point() or value.is_complex()):
            return int(value)
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def target_of(definition: Mapping[str, Any]) -> Target:
    """How calls of ``definition`` are recorded (Note [recorded hand-written calls])."""
    from fibgen.format.models import var_axis_scalars
    from fibgen.runtime.inputs.make import torch_dtype

    inputs = tuple(definition["inputs"])
    outputs = tuple(definition["outputs"])
    specs = list(definition["inputs"].values())
    axes = definition.get("axes") or {}
    scalars = {a: inputs.index(n) for a, n in var_axis_scalars(axes, definition["inputs"]).items()}
    # Per var axis: the integer scalar input that gives it, and the (input, dim) that carry it.
    plan = [
        (
            axis,
            scalars.get(axis),
            [
                (i, list(spec["shape"]).index(axis))
                for i, spec in enumerate(specs)
                if axis in (spec.get("shape") or ())
            ],
        )
        for axis, spec in axes.items()
        if spec.get("type") == "var"
    ]
    as_bytes: list[tuple[int, torch.dtype]] = []
    for i, spec in enumerate(specs):
        if spec.get("shape") is not None and one_byte_float(spec.get("dtype")):
            try:
                as_bytes.append((i, torch_dtype(spec["dtype"])))
            except (KeyError, TypeError, ValueError):
                pass  # a dtype this torch lacks: recorded as given
    required = [i for i, spec in enumerate(specs) if not spec.get("optional")]
    # The scalar inputs (no shape), and the kind of value each takes.
    scalar_kinds = [
        (i, _scalar_kind(str(spec.get("dtype"))))
        for i, spec in enumerate(specs)
        if spec.get("shape") is None
    ]
    tensors = mismatch_of(inputs, *contract(definition))

    def trace_axes(*values: Any) -> dict[str, int | None]:
        # As a generated dispatcher reads them: an axis that only an optional input left
        # out carries is None, and left out of the workload.
        found: dict[str, int | None] = {}
        for axis, scalar, carriers in plan:
            found[axis] = None
            if scalar is not None and values[scalar] is not None:
                found[axis] = axis_value(values[scalar])
                continue
            for i, dim in carriers:
                value = values[i]
                if isinstance(value, torch.Tensor) and value.dim() > dim:
                    found[axis] = int(value.shape[dim])
                    break
        return found

    def values(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Any] | str:
        if outputs and len(args) + len(kwargs) == len(inputs) + len(outputs):
            # Destination-passing: the rest are buffers (else another signature, eps say).
            bound = bind_arguments(inputs, outputs, args, kwargs)
            if isinstance(bound, str):
                return bound
            for name in outputs:
                if not isinstance(bound[name], torch.Tensor):
                    kind = type(bound[name]).__name__
                    return f"output {name} is a {kind}, not a buffer to write into"
            given = [bound[n] for n in inputs]
        else:
            found = input_values(inputs, outputs, args, kwargs)
            if isinstance(found, str):
                return found
            given = found
        for i, dtype in as_bytes:
            value = given[i]
            if isinstance(value, torch.Tensor) and value.dtype in BYTES:
                given[i] = value.view(dtype)
        for i, _ in scalar_kinds:  # a scalar passed as a 0-d tensor: recorded as its value
            value = given[i]
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                if value.is_cuda and torch.cuda.is_current_stream_capturing():
                    raise CaptureRead(inputs[i])
                given[i] = value.item()  # a CUDA one synchronizes: only while tracing
        return given

    def check(values: Sequence[Any]) -> str | None:
        for i in required:
            if values[i] is None:
                return f"input {inputs[i]} is None, and the definition does not make it optional"
        for i, kind in scalar_kinds:
            value = values[i]
            if value is not None and not _is_scalar(value, kind):
                return (
                    f"input {inputs[i]} is a {type(value).__name__} ({value!r:.40}), the "
                    f"definition's is a scalar of {specs[i].get('dtype')}"
                )
        for axis, scalar, _ in plan:
            if scalar is None or values[scalar] is None:
                continue
            value = values[scalar]
            size = axis_value(value)
            if size is None:
                return (
                    f"input {inputs[scalar]} gives axis {axis} and is a {type(value).__name__}, "
                    "not an integer"
                )
            if size < 0:
                return f"input {inputs[scalar]} gives axis {axis} as {size}, below 0"
        return tensors(values)

    op_type = str(definition.get("op_type") or "unknown")
    return Target(inputs, op_type, trace_axes, values, check)


def _scalar_kind(dtype: str) -> str:
    """What a scalar input of ``dtype`` takes: a bool, an integer, a real number, or
    anything (a dtype fibgen does not read)."""
    if dtype == "bool":
        return "bool"
    if dtype.startswith(("int", "uint")):
        return "integer"
    if dtype.startswith(("float", "bfloat")):
        return "real"
    return "any"


def _is_scalar(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's too
    if kind == "integer":
        return axis_value(value) is not None
    if kind == "real":
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    return True
