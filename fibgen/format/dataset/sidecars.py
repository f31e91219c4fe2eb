"""Sidecars: what flashinfer-bench's definition has no field for, beside its JSON file."""

from __future__ import annotations

import json
from pathlib import Path

from fibgen.format.dataset.layout import PathLike, inside_dataset
from fibgen.format.errors import FormatError, join_messages
from fibgen.format.hints import HintError, check_hint, parse_hint_text
from fibgen.format.jsonio import parse_json
from fibgen.format.tolerances import TOLERANCE_KEYS, tolerance_problem

# Beside ``<name>.json``: ``<name>.fibgen`` holds ``{"tolerance": {...}, "hints": {...}}``,
# a family's `tolerance(...)` and its inputs' `gen` hints. Not `.json`, so that
# flashinfer-bench's loader, which reads every JSON file under definitions/, skips it.
EXTRAS_SUFFIX = ".fibgen"


def sidecar_path(definition_file: PathLike) -> Path:
    """The sidecar beside a definition JSON file."""
    return Path(definition_file).with_suffix(EXTRAS_SUFFIX)


def read_extras(definition_file: PathLike, *, root: PathLike | None = None) -> dict:
    """The sidecar of the definition JSON at ``definition_file``; empty when there is none.

    With ``root``, the dataset the file lies in, a sidecar that a symbolic link leads out of
    it is refused (Note [confined paths] in fibgen/fsutil.py).
    """
    path = sidecar_path(definition_file)
    if root is not None:
        inside_dataset(root, path, file=True)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise FormatError(path, f"cannot read: {exc.strerror or exc}") from None
    data = parse_json(text, path)
    problems = []
    if not isinstance(data, dict):
        problems.append("expected a JSON object with 'tolerance' and 'hints'")
    else:
        for key, value in data.items():
            if key not in ("tolerance", "hints"):
                problems.append(f"unknown key {key!r} (allowed keys: tolerance, hints)")
            elif not isinstance(value, dict):
                problems.append(f"{key}: expected an object")
            elif key == "tolerance":
                problems += _tolerance_problems(value)
            else:
                problems += _hint_problems(value)
    if problems:
        raise FormatError(path, join_messages(problems))
    return data


def _tolerance_problems(tolerance: dict) -> list[str]:
    # What bench compares with: a `"matched": 0.0` would pass any output (all zeros, say).
    problems = []
    for key, value in tolerance.items():
        if key not in TOLERANCE_KEYS:
            problems.append(
                f"tolerance: unknown key {key!r} (allowed keys: {', '.join(TOLERANCE_KEYS)})"
            )
            continue
        problem = None if value is None else tolerance_problem(key, value)  # null: the default
        if problem is not None:
            problems.append(f"tolerance.{key}: {json.dumps(value)} {problem[0]}; {problem[1]}")
    return problems


def _hint_problems(hints: dict) -> list[str]:
    # Hints are evaluated when inputs are made: held to the checked language of
    # fibgen.format.expressions (Note [checked expressions]), like the definition's constraints.
    problems = []
    for name, text in hints.items():
        if not isinstance(text, str):
            problems.append(f'hints.{name}: expected a string such as "indptr(over=kv_indices)"')
            continue
        try:
            check_hint(*parse_hint_text(text))
        except HintError as exc:
            problems.append(f"hints.{name}: {exc}")
    return problems


def dump_extras(extras: dict) -> str:
    """Canonical text of a sidecar (what ``fibgen build`` writes)."""
    return json.dumps(extras, indent=2, sort_keys=True) + "\n"
