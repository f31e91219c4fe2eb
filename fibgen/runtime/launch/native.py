"""The runtime's C++ extension module: launch replay's table and the result check."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build_native() -> Any:
    """Build (or load from the cache) the runtime's extension module, in this thread: the C++
    table, and the result check (Note [result check] in result_check.py)."""
    from fibgen.runtime.solutions.builders import build_extension

    return build_extension("native", [Path(__file__).with_name("_native.cpp")], cuda=False)
