"""Safe names: what a definition, op_type, solution or author may be called (Note [safe names])."""

from __future__ import annotations

import re

# Note [safe names]
# A definition, op_type, solution or author name is a single path component: fibgen writes
# `definitions/<op_type>/<definition>.json`, `traces/<author>/<op_type>/<definition>.jsonl`,
# `solutions/<author>/<op_type>/<definition>/<solution>/` and `generated/cuda/<definition>/`.
# So a name is 1 to 128 characters from letters, digits, '_', '-' and '.', and starts with
# a letter, a digit or '_': no separator, no '..', no hidden file, no option-like '-x', no
# space, quote or control character. Every name in the flashinfer-trace dataset and the
# catalogue fits. The rule is checked here, where the models are built, and by the compiler
# and the command line through `name_problem`.
MAX_NAME_LENGTH = 128
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
NAME_RULE = (
    f"a name is 1 to {MAX_NAME_LENGTH} letters, digits, '_', '-' or '.', "
    "starting with a letter, a digit or '_'"
)


def name_problem(name: str) -> str | None:
    """What makes ``name`` unsafe as a file or folder name (Note [safe names]), or None."""
    if _SAFE_NAME.fullmatch(name) and len(name) <= MAX_NAME_LENGTH:
        return None
    if not name:
        return "is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"is {len(name)} characters long"
    bad = next((ch for ch in name if not (ch.isascii() and (ch.isalnum() or ch in "_.-"))), None)
    if bad == "/" or bad == "\\":
        return f"contains the path separator {bad!r}"
    if bad is not None:
        return f"contains {bad!r}"
    return f"starts with {name[0]!r}"
