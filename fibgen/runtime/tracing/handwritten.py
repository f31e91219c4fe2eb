"""What tracing reads off a call of hand-written code routed by name (``apply``).

Note [recorded hand-written calls]
flashinfer-bench's ``apply`` records the calls it routes while its tracing is on, and so does
fibgen's. A hand-written call names its definition and passes the definition's inputs (by
position in its order, by name, or both; with or without its outputs: the two calling
styles, Note [calling styles] in fibgen/runtime/solutions/loading.py), so once the definition
is found, the call's workload is read off its arguments as a generated dispatcher's is: each
var axis from the shape of the first input given that carries it (or from the integer scalar
input of its name), tensors copied per the dump policy, the record checked against the
definition's contract. The definition is looked up where the call's solution came from (the
dataset apply routes the name from), then in the dataset being traced (definitions of one's
own, put there before tracing), then in fibgen's catalogue; tracing copies it into the traced
dataset beside the first workloads, as it copies a dispatcher's. A one-byte float input
passed as its bytes (uint8 or int8) is recorded as the definition's dtype. A call that cannot
be recorded is counted ``handwritten`` and its reason said once: a name that no definition
has, or arguments that are not the definition's inputs (a decorated function of another
signature). A call that apply's input check refuses is counted ``mismatched``, as a
dispatcher's refused call is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

from fibgen.runtime.solutions.loading import bind_arguments
from fibgen.runtime.tracing.checks import BYTES, one_byte_float


class Target(NamedTuple):
    """A definition as the recorder reads a call of it (the attributes it reads of a
    dispatcher's API), and how a hand-written call's arguments become its inputs."""

    inputs: tuple[str, ...]
    op_type: str
    trace_axes: Callable[..., dict[str, int]]
    # The call's input values in the definition's order, or why its arguments are not them.
    values: Callable[[tuple[Any, ...], Mapping[str, Any]], "list[Any] | str"]


def target_of(definition: Mapping[str, Any]) -> Target:
    """How calls of ``definition`` are recorded (Note [recorded hand-written calls])."""
    from fibgen.format.models import var_axis_scalars
    from fibgen.runtime.inputs.make import torch_dtype

    name = definition["name"]
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
    counts = (len(inputs), len(inputs) + len(outputs))

    def trace_axes(*values: Any) -> dict[str, int]:
        found: dict[str, int] = {}
        for axis, scalar, carriers in plan:
            if scalar is not None:
                value = values[scalar]
                if isinstance(value, int) and not isinstance(value, bool):
                    found[axis] = value
                    continue
            for i, dim in carriers:
                value = values[i]
                if isinstance(value, torch.Tensor) and value.dim() > dim:
                    found[axis] = int(value.shape[dim])
                    break
            else:
                raise ValueError(f"no input of the call gives axis {axis!r} of {name}")
        return found

    def values(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Any] | str:
        if not kwargs and len(args) in counts:
            given = list(args[: counts[0]])  # by position: the inputs come first
        else:
            bound = bind_arguments(inputs, outputs, args, kwargs)
            if isinstance(bound, str):
                return bound
            given = [bound[n] for n in inputs]
        for i, dtype in as_bytes:
            value = given[i]
            if isinstance(value, torch.Tensor) and value.dtype in BYTES:
                given[i] = value.view(dtype)
        return given

    return Target(inputs, str(definition.get("op_type") or "unknown"), trace_axes, values)
