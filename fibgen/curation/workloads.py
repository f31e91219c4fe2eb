"""A dataset's workloads: load them, and turn each into the inputs of its definition.

A workload names values for a definition's var axes and a source for each input: random
(made by ``fibgen.runtime.inputs.make`` from the definition's generation hints), a scalar, or a
tensor in a safetensors blob of the dataset. Loading a workload reads only its JSON line;
blobs are opened when the inputs are materialized, so a dataset whose blobs are elsewhere
(or absent) still loads, and a missing blob is reported then, with the workload and input.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fibgen.format import (
    Definition,
    FormatError,
    RandomInput,
    SafetensorsInput,
    ScalarInput,
    Workload,
    iter_records,
    load_safetensors_input,
)
from fibgen.format import load_workloads as _load_dataset_workloads
from fibgen.format.hints import HINT_SIGNATURES, bind_hint
from fibgen.format.jsonio import definition_to_json
from fibgen.runtime.inputs.make import InputGenerationError, InputSpec, generate_inputs, torch_dtype

__all__ = ["WorkloadError", "input_spec", "load_workloads", "materialize"]


class WorkloadError(ValueError):
    """A workload that cannot be used; the message names the definition, workload and input."""


def load_workloads(path: str | os.PathLike[str]) -> dict[str, list[Workload]]:
    """Workloads by definition name from a dataset root, or from one workload JSONL file.

    A torn line (not JSON) is skipped with a FormatWarning that names its file and line.
    """
    path = Path(path)
    if path.is_file():
        by_definition: dict[str, list[Workload]] = {}
        for lineno, trace in iter_records(path):
            if not trace.is_workload_trace:
                raise FormatError(
                    path, "a workload file holds only workload lines (null solution)", lineno
                )
            by_definition.setdefault(trace.definition, []).append(trace.workload)
        return by_definition
    if not path.is_dir():
        raise FormatError(path, "no such dataset folder or workload file")
    return _load_dataset_workloads(path)


def input_spec(definition: Definition, hints: Mapping[str, Any] | None = None) -> InputSpec:
    """The input-generation view of a definition (hints: input name → ``gen`` hint)."""
    return InputSpec.from_definition_json(definition_to_json(definition), dict(hints or {}))


def _where(spec: InputSpec, workload: Workload, name: str | None = None) -> str:
    where = f"workload {workload.uuid} of {spec.name}"
    return where if name is None else f"{where}, input {name!r}"


def materialize(
    spec: InputSpec,
    workload: Workload,
    root: str | os.PathLike[str] | None = None,
    *,
    device: Any = "cpu",
    seed: int = 0,
) -> dict[str, Any]:
    """The inputs of a workload, by name in the definition's order (None: optional, absent).

    ``root`` is the dataset root that safetensors paths are relative to.
    """
    var_axes = [name for name, kind, _ in spec.axes if kind == "var"]
    missing = [a for a in var_axes if a not in workload.axes]
    extra = [a for a in workload.axes if a not in var_axes]
    if missing or extra:
        problems = []
        if missing:
            problems.append(f"no value for var axes {', '.join(missing)}")
        if extra:
            problems.append(f"{', '.join(extra)} are not var axes")
        raise WorkloadError(f"{_where(spec, workload)}: {'; '.join(problems)}")
    axes = {a: workload.axes[a] for a in var_axes}
    random = {n for n, s in workload.inputs.items() if isinstance(s, RandomInput)}
    out: dict[str, Any] = {}
    generated: dict[str, Any] | None = None
    known = {name: value for name, kind, value in spec.axes if kind == "const"} | axes
    scalars = {name: axis for axis, name in spec.scalar_axes().items()}
    for name, dtype, shape, optional, _ in spec.inputs:
        source = workload.inputs.get(name)
        if source is None:
            if not optional:
                raise WorkloadError(f"{_where(spec, workload, name)}: the workload has no entry")
            out[name] = None
        elif isinstance(source, ScalarInput):
            if name in scalars and source.value != axes[scalars[name]]:
                # The scalar is the axis's value (Note [axes bound by a scalar]).
                raise WorkloadError(
                    f"{_where(spec, workload, name)}: the scalar is {source.value!r}, but it "
                    f"is the value of var axis {scalars[name]!r}, which the workload gives as "
                    f"{axes[scalars[name]]}"
                )
            out[name] = source.value
        elif isinstance(source, SafetensorsInput):
            out[name] = _load_tensor(spec, workload, name, dtype, shape, known, root, device)
        else:
            if generated is None:
                try:
                    generated = generate_inputs(
                        _random_part(spec, random), axes, device=device, seed=seed
                    )
                except InputGenerationError as exc:
                    raise WorkloadError(f"{_where(spec, workload)}: {exc}") from None
            out[name] = generated[name]
    return out


def _random_part(spec: InputSpec, random: set[str]) -> InputSpec:
    """The spec of the random inputs only, when others are stored or scalars.

    Stored values come from the call that was traced: constraints that relate them to the
    generated ones cannot be made to hold, so they are left out, and so are hints that read
    a stored tensor (``indptr(over=kv_indices)`` when ``kv_indices`` is stored).
    """
    tensors = {name for name, _, shape, _, _ in spec.inputs if shape is not None}
    if tensors <= random:
        return spec
    kept = []
    for name, dtype, shape, optional, hint in spec.inputs:
        if name not in random:
            continue
        if hint is not None:
            bound = bind_hint(*hint)
            reads = {bound[p] for p in HINT_SIGNATURES[hint[0]].tensor_params if p in bound}
            if not reads <= random:
                hint = None
        kept.append((name, dtype, shape, optional, hint))
    return InputSpec(spec.name, spec.axes, tuple(kept), (), spec.params)


def _load_tensor(
    spec: InputSpec,
    workload: Workload,
    name: str,
    dtype: str,
    shape: tuple[str, ...] | None,
    known: Mapping[str, int | None],
    root: str | os.PathLike[str] | None,
    device: Any,
) -> torch.Tensor:
    source = workload.inputs[name]
    assert isinstance(source, SafetensorsInput)  # the caller's case
    if root is None:
        raise WorkloadError(
            f"{_where(spec, workload, name)}: stored in {source.path}; pass the dataset root"
        )
    try:
        tensor = load_safetensors_input(root, source)
    except (FormatError, ValueError) as exc:
        raise WorkloadError(f"{_where(spec, workload, name)}: {exc}") from None
    if shape is not None and all(d in known for d in shape):
        expected = tuple(known[d] for d in shape)
        if tuple(tensor.shape) != expected:
            raise WorkloadError(
                f"{_where(spec, workload, name)}: the stored tensor has shape "
                f"{tuple(tensor.shape)}, the workload's axes give {expected}"
            )
    # fp4 is stored packed and may come back as uint8 (Note [fp4] in fibgen/runtime/inputs/specs.py).
    if dtype != "float4_e2m1" and tensor.dtype != torch_dtype(dtype):
        raise WorkloadError(
            f"{_where(spec, workload, name)}: the stored tensor is {tensor.dtype}, the "
            f"definition declares {dtype}"
        )
    return tensor.to(device)
