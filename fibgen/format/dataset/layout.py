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

from fibgen.format.errors import FormatError
from fibgen.fsutil import PathRefused, confined, regular_file

PathLike = Union[str, "os.PathLike[str]"]

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


def inside_dataset(
    root: PathLike, path: PathLike, *, file: bool = False, what: str = "the dataset"
) -> Path:
    """``path``, under dataset ``root``, checked by the guard of every read and write of a
    dataset (Note [confined paths] in fibgen/fsutil.py): FormatError naming the symbolic link
    that leads out of the dataset, or the loop. ``file``: what exists there must also be a
    regular file (not a FIFO, whose reader would wait forever). ``what`` names the root in
    messages."""
    try:
        confined(root, path, what)
        if file:
            regular_file(path)
    except PathRefused as exc:
        raise FormatError(exc.path, exc.reason) from None
    return Path(path)


def resolve_dataset_path(root: PathLike, relpath: str) -> Path:
    """Resolve a path stored in the dataset (relative to ``root``); refuse ones that escape.

    The text is checked first (absolute, ``..``, NUL), then the file system: with symbolic
    links followed, the path must still lie inside the dataset root, so that a link in the
    dataset (a blob, or a folder above it) cannot make bench read a file elsewhere
    (Note [confined paths] in fibgen/fsutil.py). Returns the path under ``root`` as written,
    which messages show.
    """
    parts = relpath.replace("\\", "/").split("/")
    if relpath.startswith(("/", "\\")) or ".." in parts or (len(relpath) > 1 and relpath[1] == ":"):
        raise ValueError(f"dataset path {relpath!r} must be relative to the dataset root")
    if "\0" in relpath:
        raise ValueError(f"dataset path {relpath!r} contains a NUL byte")
    path = Path(root).joinpath(*[p for p in parts if p not in ("", ".")])
    try:
        confined(root, path, "the dataset")
        regular_file(path)
    except PathRefused as exc:
        raise ValueError(f"dataset path {relpath!r}: {exc.reason}") from None
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
    """Every record file under ``root/<top>`` at any depth, sorted (Note [dataset depth]).

    Symbolic links are followed where they stay inside the dataset; one that leads out of
    it, a loop, or a record name that is no regular file is a FormatError naming it (Note
    [confined paths] in fibgen/fsutil.py).
    """
    suffix = DATASET_FOLDERS[top]
    base = Path(root) / top
    inside_dataset(root, base)
    if not base.is_dir():
        return []
    found = []
    seen: set[str] = set()
    for folder, dirs, files in os.walk(base, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:  # a link back to a folder already read
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for d in dirs:
            inside_dataset(root, Path(folder, d))
        for f in files:
            if f.endswith(suffix) and not f.startswith("."):
                path = inside_dataset(root, Path(folder, f), file=True)
                if not path.exists():
                    raise FormatError(
                        path, f"a symbolic link to {os.readlink(path)}, which is not there"
                    )
                found.append(path)
    return sorted(found)
