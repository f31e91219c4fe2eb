"""Workloads: load them from a dataset, turn them into inputs, and make synthetic ones.

A workload names values for a definition's var axes and a source for each input: random
(made by ``fibgen.runtime.inputs`` from the definition's generation hints), a scalar, or a
tensor in a safetensors blob of the dataset. Loading a workload reads only its JSON line;
blobs are opened when the inputs are materialized, so a dataset whose blobs are elsewhere
(or absent) still loads, and a missing blob is reported then, with the workload and input.

Synthetic workloads cover a grid of var-axis values. Inputs that random data would make
invalid (index tensors such as ``kv_indptr``, anything with a generation hint, integer
tensors) are generated once and stored as blobs; the rest stay random.
"""

from __future__ import annotations

import itertools
import math
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
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
    load_jsonl,
    load_safetensors_input,
    save_blob,
)
from fibgen.format import load_workloads as _load_dataset_workloads
from fibgen.format.dataset import blob_relpath, workload_path, write_workloads
from fibgen.format.hints import HINT_SIGNATURES, bind_hint
from fibgen.format.jsonio import definition_to_json
from fibgen.runtime.inputs import (
    InputGenerationError,
    InputSpec,
    generate_inputs,
    generate_inputs_with_axes,
    torch_dtype,
)

__all__ = [
    "SyntheticResult",
    "WorkloadError",
    "input_spec",
    "load_workloads",
    "materialize",
    "parse_grid",
    "synthesize",
    "write_synthetic",
]

# Stable uuids for synthetic workloads: the same grid gives the same files.
_SYNTHETIC_NAMESPACE = uuid.UUID("6f1c2b9e-5d1a-4c57-9a43-0d6e2f7b8c11")


class WorkloadError(ValueError):
    """A workload that cannot be used; the message names the definition, workload and input."""


def load_workloads(path: str | os.PathLike[str]) -> dict[str, list[Workload]]:
    """Workloads by definition name from a dataset root, or from one workload JSONL file."""
    path = Path(path)
    if path.is_file():
        by_definition: dict[str, list[Workload]] = {}
        for lineno, trace in enumerate(load_jsonl(path), start=1):
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
    for name, dtype, shape, optional, _ in spec.inputs:
        source = workload.inputs.get(name)
        if source is None:
            if not optional:
                raise WorkloadError(f"{_where(spec, workload, name)}: the workload has no entry")
            out[name] = None
        elif isinstance(source, ScalarInput):
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
    known: Mapping[str, int],
    root: str | os.PathLike[str] | None,
    device: Any,
) -> torch.Tensor:
    source = workload.inputs[name]
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
    # fp4 is stored packed and may come back as uint8 (Note [fp4] in inputs.py).
    if dtype != "float4_e2m1" and tensor.dtype != torch_dtype(dtype):
        raise WorkloadError(
            f"{_where(spec, workload, name)}: the stored tensor is {tensor.dtype}, the "
            f"definition declares {dtype}"
        )
    return tensor.to(device)


# ---------------------------------------------------------------------------------------
# Synthetic workloads


def _stored(spec_input: tuple) -> bool:
    """Whether an input needs real values: random data would break the definition."""
    _, dtype, shape, _, hint = spec_input
    if shape is None:
        return False
    return hint is not None or dtype in ("int64", "int32", "int16", "int8", "bool")


def synthesize(
    spec: InputSpec, op_type: str, grid: Mapping[str, Sequence[int]], *, seed: int = 0
) -> list[tuple[Workload, dict[str, torch.Tensor]]]:
    """One workload per point of the grid (cross product in the given order), with the
    tensors its blob must hold; var axes left out of the grid are derived per point."""
    var_axes = [name for name, kind, _ in spec.axes if kind == "var"]
    unknown = [a for a in grid if a not in var_axes]
    if unknown:
        raise WorkloadError(
            f"{spec.name}: not a var axis: {', '.join(unknown)}; its var axes are: "
            f"{', '.join(var_axes) or '(none)'}"
        )
    names = list(grid)
    out = []
    for point in itertools.product(*(grid[a] for a in names)):
        given = dict(zip(names, point))
        try:
            values, all_axes = generate_inputs_with_axes(spec, given, seed=seed)
        except InputGenerationError as exc:
            shown = ", ".join(f"{k}={v}" for k, v in given.items())
            raise WorkloadError(f"{spec.name} at {shown}: {exc}") from None
        axes = {a: int(all_axes[a]) for a in var_axes}
        key = ",".join(f"{a}={axes[a]}" for a in var_axes)
        workload_uuid = str(uuid.uuid5(_SYNTHETIC_NAMESPACE, f"{spec.name}:{key}:{seed}"))
        inputs: dict[str, Any] = {}
        tensors: dict[str, torch.Tensor] = {}
        relpath = blob_relpath(op_type, spec.name, workload_uuid)
        for spec_input in spec.inputs:
            name, _, shape, _, _ = spec_input
            value = values[name]
            if value is None:
                continue
            if shape is None:
                inputs[name] = ScalarInput(value=_plain(value))
            elif _stored(spec_input):
                tensors[name] = value
                inputs[name] = SafetensorsInput(path=relpath, tensor_key=name)
            else:
                inputs[name] = RandomInput()
        out.append((Workload(uuid=workload_uuid, axes=axes, inputs=inputs), tensors))
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise WorkloadError(f"a scalar input value {value} cannot be written to JSON")
    return value


@dataclass(frozen=True)
class SyntheticResult:
    """What ``write_synthetic`` did: the workload file, and workloads added and kept."""

    path: Path
    added: int
    kept: int


def write_synthetic(
    root: str | os.PathLike[str],
    op_type: str,
    spec: InputSpec,
    grid: Mapping[str, Sequence[int]],
    *,
    replace: bool = False,
    seed: int = 0,
) -> SyntheticResult:
    """Write synthetic workloads (and their blobs) into the dataset at ``root``.

    Workloads already in the file are kept (``replace`` drops them); a workload with the
    same uuid, from the same grid point and seed, is not written twice.
    """
    made = synthesize(spec, op_type, grid, seed=seed)
    path = workload_path(root, op_type, spec.name)
    existing: list[Workload] = []
    if not replace and path.is_file():
        existing = load_workloads(path).get(spec.name, [])
    seen = {w.uuid for w in existing}
    added: list[Workload] = []
    for workload, tensors in made:
        if workload.uuid in seen:
            continue
        seen.add(workload.uuid)
        if tensors:
            # The blob first: a workload line never points at a file that is not there.
            save_blob(root, op_type, spec.name, workload.uuid, tensors)
        added.append(workload)
    write_workloads(root, op_type, spec.name, [*existing, *added])
    return SyntheticResult(path, len(added), len(existing))


def parse_grid(text: Iterable[str]) -> dict[str, list[int]]:
    """Parse ``["batch_size=1,7,64", "num_pages=8"]`` into a grid of var-axis values."""
    grid: dict[str, list[int]] = {}
    for item in text:
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise WorkloadError(
                f"--axes {item!r}: write AXIS=V1,V2,... (for example batch_size=1,7)"
            )
        if name in grid:
            raise WorkloadError(f"--axes {name} is given twice; list every value in one --axes")
        try:
            parsed = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise WorkloadError(
                f"--axes {item!r}: values must be integers separated by commas"
            ) from None
        if not parsed or any(v < 0 for v in parsed):
            raise WorkloadError(f"--axes {item!r}: give one or more integers >= 0")
        grid[name] = parsed
    return grid
