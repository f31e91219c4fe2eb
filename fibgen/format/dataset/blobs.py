"""Safetensors blobs: the stored tensors of a workload's inputs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fibgen.format.dataset.layout import PathLike, blob_relpath, resolve_dataset_path
from fibgen.format.dataset.writers import write_bytes_atomic
from fibgen.format.errors import FormatError
from fibgen.format.models import SafetensorsInput

if TYPE_CHECKING:
    import torch


def save_blob(
    root: PathLike,
    op_type: str,
    definition: str,
    uuid: str,
    tensors: Mapping[str, torch.Tensor],
) -> str:
    """Store a workload's tensors; return the relative path for ``SafetensorsInput.path``."""
    from safetensors.torch import save

    relpath = blob_relpath(op_type, definition, uuid)
    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})
    write_bytes_atomic(Path(root) / relpath, data, root=root)
    return relpath


def load_blob(root: PathLike, relpath: str) -> dict[str, torch.Tensor]:
    """Load every tensor of a safetensors blob stored under ``root``."""
    from safetensors.torch import load_file

    path = resolve_dataset_path(root, relpath)
    if not path.is_file():
        raise FormatError(path, "safetensors blob not found")
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise FormatError(path, f"not a readable safetensors file: {exc}") from None


def load_safetensors_input(root: PathLike, spec: SafetensorsInput) -> torch.Tensor:
    """The tensor a ``safetensors`` workload input points at."""
    tensors = load_blob(root, spec.path)
    if spec.tensor_key not in tensors:
        raise FormatError(
            resolve_dataset_path(root, spec.path),
            f"no tensor {spec.tensor_key!r} in the blob (it has: {', '.join(sorted(tensors))})",
        )
    return tensors[spec.tensor_key]
