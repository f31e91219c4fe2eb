"""Solution folders: a Solution JSON beside its source files, read from and packed into it.

Note [solution folders]
A solution folder is ``<name>/`` holding the Solution JSON ``<name>.json`` and the solution's
source files, as ``fibgen scaffold-solution`` writes it. Its files are the truth:
``read_solution`` takes the sources from them (every file in the folder but the JSON, hidden
names, ``__pycache__`` and build outputs), so an edit is used by bench, tests and apply as
soon as it is saved. ``pack_solution`` writes them into the JSON, which then stands alone
(what flashinfer-bench reads, and what one submits). The JSON of a folder may therefore hold
no sources yet (``"sources": []``, or no key): the folder's files stand in for them, and
packing fills them. A Solution JSON elsewhere, or in a folder that does not hold its entry
file, is self-contained as it is, and must list its sources.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fibgen.format.dataset.layout import PathLike, inside_dataset
from fibgen.format.dataset.writers import write_text_atomic
from fibgen.format.errors import FormatError
from fibgen.format.jsonio import (
    dump_solution,
    parse_json,
    read_text,
    solution_to_json,
    validate_obj,
)
from fibgen.format.models import Solution

# What a solution folder holds besides its sources: caches and build outputs.
_NOT_SOURCES = ("__pycache__",)
_NOT_SOURCE_SUFFIXES = (".pyc", ".pyo", ".o", ".so", ".a", ".dylib", ".dll", ".lock", ".tmp")


def is_solution_folder(path: PathLike, solution: Solution) -> bool:
    """Whether the Solution JSON at ``path`` sits in its own solution folder."""
    path = Path(path)
    folder = path.parent
    return (
        folder.name == solution.name
        and path.stem == solution.name
        and (folder / solution.spec.entry_file).is_file()
    )


def folder_root(folder: PathLike) -> tuple[Path, str]:
    """What a solution folder's files may link into, and its name in messages: the dataset
    whose ``solutions/`` holds the folder, else the folder itself (Note [confined paths] in
    fibgen/fsutil.py)."""
    folder = Path(folder)
    for parent in folder.parents:
        if parent.name == "solutions":
            return parent.parent, "the dataset"
    return folder, "the solution folder"


def folder_sources(path: PathLike) -> dict[str, str]:
    """The source files of the solution folder of the JSON at ``path``, by relative path.

    A file may be a symbolic link within the dataset (the shipped solutions link to
    ``solutions/src/``); one that leads elsewhere is refused, naming it, rather than read into
    the Solution one submits.
    """
    path = Path(path)
    folder = path.parent
    root, what = folder_root(folder)
    sources: dict[str, str] = {}
    seen: set[str] = set()
    for where, dirs, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(where)
        if real in seen:  # a link back to a folder already read
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _NOT_SOURCES)
        for d in dirs:
            inside_dataset(root, Path(where, d), what=what)
        for name in sorted(files):
            file = Path(where, name)
            if name.startswith(".") or name.endswith(_NOT_SOURCE_SUFFIXES) or file == path:
                continue
            inside_dataset(root, file, file=True, what=what)
            rel = file.relative_to(folder).as_posix()
            try:
                text = file.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise FormatError(
                    file, "not UTF-8 text; a solution folder holds only its source files"
                ) from None
            except OSError as exc:
                raise FormatError(file, f"cannot read: {exc.strerror or exc}") from None
            if not text:
                raise FormatError(
                    file, "empty; a Solution cannot hold an empty source (delete it or fill it)"
                )
            sources[rel] = text
    return dict(sorted(sources.items()))


def _load_in_folder(path: PathLike) -> Solution:
    """The Solution JSON at ``path``; in a solution folder, one whose ``sources`` are empty or
    missing too (Note [solution folders]: its files are the sources, and filling the list is
    what `fibgen pack` is for), with the folder's files as its sources."""
    path = Path(path)
    obj = parse_json(read_text(path), path)
    if isinstance(obj, dict) and not obj.get("sources") and _names_its_folder(path, obj):
        sources = folder_sources(path)
        if sources:
            obj = {**obj, "sources": [{"path": p, "content": c} for p, c in sources.items()]}
    return validate_obj(Solution, obj, path)


def _names_its_folder(path: Path, obj: dict) -> bool:
    """``is_solution_folder`` on a JSON object not yet known to be a valid Solution."""
    spec = obj.get("spec")
    entry = spec.get("entry_point") if isinstance(spec, dict) else None
    if not isinstance(entry, str) or entry.count("::") != 1:
        return False
    entry_file = entry.split("::")[0]
    return (
        path.parent.name == obj.get("name") == path.stem
        and bool(entry_file)
        and (path.parent / entry_file).is_file()
    )


def read_solution(path: PathLike) -> Solution:
    """The Solution at ``path``, with a solution folder's sources read from its files."""
    solution = _load_in_folder(path)
    if not is_solution_folder(path, solution):
        return solution
    sources = folder_sources(path)
    if sources == {s.path: s.content for s in solution.sources}:
        return solution
    obj = solution_to_json(solution)
    obj["sources"] = [{"path": p, "content": c} for p, c in sources.items()]
    return validate_obj(Solution, obj, path)


def is_stale(path: PathLike) -> bool:
    """Whether a solution folder's files differ from the sources its JSON holds."""
    solution = _load_in_folder(path)
    if not is_solution_folder(path, solution):
        return False
    # The sources as the JSON holds them: none, for a folder not packed yet.
    written = parse_json(read_text(path), path).get("sources") or []
    return folder_sources(path) != {s["path"]: s["content"] for s in written}


@dataclass(frozen=True)
class Packed:
    """What ``pack_solution`` did: the JSON written (or checked) and whether it changed."""

    path: Path
    solution: Solution
    changed: bool


def pack_solution(path: PathLike, output: PathLike | None = None, *, check: bool = False) -> Packed:
    """Write a solution folder's sources into its Solution JSON (or into ``output``).

    ``path`` is the folder or its JSON. With ``check`` nothing is written; ``changed`` says
    whether the JSON is stale. Raises FormatError when ``path`` is not a solution folder.
    """
    path = Path(path)
    json_path = path / f"{path.name}.json" if path.is_dir() else path
    if not json_path.is_file():
        raise FormatError(path, f"no solution folder here: expected {json_path.name} in it")
    stored = _load_in_folder(json_path)
    if not is_solution_folder(json_path, stored):
        raise FormatError(
            json_path,
            f"not a solution folder: the JSON of solution {stored.name!r} must be "
            f"{stored.name}/{stored.name}.json, beside its entry file {stored.spec.entry_file}",
        )
    solution = read_solution(json_path)
    target = json_path if output is None else Path(output)
    text = dump_solution(solution)
    if target.is_dir():
        raise FormatError(target, "is a folder; give the file to write the Solution JSON into")
    try:
        current = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = None
    except (OSError, UnicodeDecodeError) as exc:
        raise FormatError(target, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    changed = current != text
    if changed and not check:
        root = folder_root(json_path.parent)[0] if output is None else None
        try:
            write_text_atomic(target, text, root=root)
        except OSError as exc:
            raise FormatError(target, f"cannot write: {exc.strerror or exc}") from None
    return Packed(target, solution, changed)
