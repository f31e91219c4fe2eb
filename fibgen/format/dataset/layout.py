"""Where each record of a dataset lies: its paths, its record files at any depth, safe paths.

::

    <root>/definitions/<op_type>/<definition>.json
    <root>/solutions/<author>/<op_type>/<definition>/<solution>.json
    <root>/workloads/<op_type>/<definition>.jsonl
    <root>/traces/<op_type>/<definition>.jsonl
    <root>/blob/workloads/<op_type>/<definition>/<definition>_<uuid>.safetensors

Note [dataset depth]
flashinfer-bench's ``TraceSet.from_path`` reads every ``*.json`` / ``*.jsonl`` at any depth
under each of the four folders, and its own writers do not agree on one depth (traces go to
``traces/<op_type>/<definition>.jsonl`` from ``add_traces``, ``traces/<definition>.jsonl``
from a merge). So the loaders here read any depth too and take a record's definition from
its content, never from where the file sits; the writers use flashinfer-bench's depths
(above). Names starting with a dot (temporary files, locks) are skipped. Loaders walk in
sorted order, so results do not depend on the file system.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

PathLike = Union[str, Path]

# ---------------------------------------------------------------------------------------
# Paths


def _component(kind: str, value: str) -> str:
    # Names become path components; a name with a separator would write outside the layout.
    if (
        not value
        or value in (".", "..")
        or "/" in value
        or "\\" in value
        or "\0" in value
        or value != value.strip()
    ):
        raise ValueError(f"{kind} {value!r} cannot be used as a file or directory name")
    return value


def definition_path(root: PathLike, op_type: str, name: str) -> Path:
    """``<root>/definitions/<op_type>/<name>.json``."""
    return (
        Path(root)
        / "definitions"
        / _component("op_type", op_type)
        / f"{_component('definition name', name)}.json"
    )


def solution_path(
    root: PathLike, author: str, op_type: str, definition: str, solution: str
) -> Path:
    """``<root>/solutions/<author>/<op_type>/<definition>/<solution>.json``."""
    return (
        Path(root)
        / "solutions"
        / _component("author", author)
        / _component("op_type", op_type)
        / _component("definition name", definition)
        / f"{_component('solution name', solution)}.json"
    )


def workload_path(root: PathLike, op_type: str, definition: str) -> Path:
    """``<root>/workloads/<op_type>/<definition>.jsonl``."""
    return (
        Path(root)
        / "workloads"
        / _component("op_type", op_type)
        / f"{_component('definition name', definition)}.jsonl"
    )


def trace_path(root: PathLike, op_type: str, definition: str) -> Path:
    """``<root>/traces/<op_type>/<definition>.jsonl``, where flashinfer-bench's add_traces writes."""
    return (
        Path(root)
        / "traces"
        / _component("op_type", op_type)
        / f"{_component('definition name', definition)}.jsonl"
    )


def blob_relpath(op_type: str, definition: str, uuid: str) -> str:
    """``blob/workloads/<op_type>/<definition>/<definition>_<uuid>.safetensors`` (POSIX)."""
    op = _component("op_type", op_type)
    name = _component("definition name", definition)
    return f"blob/workloads/{op}/{name}/{name}_{_component('workload uuid', uuid)}.safetensors"


def blob_path(root: PathLike, op_type: str, definition: str, uuid: str) -> Path:
    """The absolute location of a workload's safetensors blob under ``root``."""
    return Path(root) / blob_relpath(op_type, definition, uuid)


def resolve_dataset_path(root: PathLike, relpath: str) -> Path:
    """Resolve a path stored in the dataset (relative to ``root``); refuse ones that escape.

    The text is checked first (absolute, ``..``, NUL), then the file system: with symbolic
    links followed, the path must still lie inside the dataset root, so that a link in the
    dataset (a blob, or a folder above it) cannot make bench read a file elsewhere. Returns
    the path under ``root`` as written, which messages show.
    """
    parts = relpath.replace("\\", "/").split("/")
    if relpath.startswith(("/", "\\")) or ".." in parts or (len(relpath) > 1 and relpath[1] == ":"):
        raise ValueError(f"dataset path {relpath!r} must be relative to the dataset root")
    if "\0" in relpath:
        raise ValueError(f"dataset path {relpath!r} contains a NUL byte")
    path = Path(root).joinpath(*[p for p in parts if p not in ("", ".")])
    try:
        real_root = Path(root).resolve()
        real = path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise ValueError(f"dataset path {relpath!r} cannot be resolved: {exc}") from None
    if real != real_root and real_root not in real.parents:
        raise ValueError(
            f"dataset path {relpath!r} leads outside the dataset through a symbolic link; "
            "a stored file must lie inside the dataset root"
        )
    return path


# ---------------------------------------------------------------------------------------
# Loaders


DATASET_FOLDERS = {
    "definitions": ".json",
    "solutions": ".json",
    "workloads": ".jsonl",
    "traces": ".jsonl",
}


def dataset_files(root: PathLike, top: str) -> list[Path]:
    """Every record file under ``root/<top>`` at any depth, sorted (Note [dataset depth])."""
    suffix = DATASET_FOLDERS[top]
    base = Path(root) / top
    if not base.is_dir():
        return []
    found = []
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend(Path(folder, f) for f in files if f.endswith(suffix) and not f.startswith("."))
    return sorted(found)
