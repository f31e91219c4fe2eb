"""Synthetic workloads: one per point of a grid of var-axis values, written into a dataset.

Inputs that random data would make invalid (index tensors such as ``kv_indptr``, anything
with a generation hint, integer tensors) are generated once and stored as blobs; the rest
stay random.
"""

from __future__ import annotations

import itertools
import math
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fibgen.curation.grid import parse_grid  # noqa: F401  (here too, beside what it feeds)
from fibgen.curation.workloads import WorkloadError, load_workloads
from fibgen.format import RandomInput, SafetensorsInput, ScalarInput, Workload, save_blob
from fibgen.format.dataset import blob_relpath, inside_dataset, workload_path, write_workloads
from fibgen.runtime.inputs.make import InputGenerationError, InputSpec, generate_inputs_with_axes

__all__ = ["SyntheticResult", "parse_grid", "synthesize", "write_synthetic"]

# Stable uuids for synthetic workloads: the same grid gives the same files.
_SYNTHETIC_NAMESPACE = uuid.UUID("6f1c2b9e-5d1a-4c57-9a43-0d6e2f7b8c11")


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
    """What ``write_synthetic`` did: the workload file, workloads added and kept, and the
    values each var axis took in the workloads made (those not in the grid were derived)."""

    path: Path
    added: int
    kept: int
    values: dict[str, tuple[int, ...]] = field(default_factory=dict)


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
    # Checked before a blob is written: a workload file that a link leads out of the dataset
    # would be read and replaced elsewhere (Note [confined paths] in fibgen/fsutil.py).
    path = inside_dataset(root, workload_path(root, op_type, spec.name), file=True)
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
    values = {
        axis: tuple(sorted({w.axes[axis] for w, _ in made}))
        for axis, kind, _ in spec.axes
        if kind == "var"
    }
    return SyntheticResult(path, len(added), len(existing), values)
