"""Comparison tolerances: what a family's `tolerance(...)` and a sidecar may say.

An element fails only when both its absolute and relative error exceed ``atol`` and
``rtol``; then at least the share ``matched`` of the elements must pass. A negative tolerance
fails every element, and ``matched=0`` passes any output at all, all zeros included: both
are refused where they are written, the `.fidef` and the sidecar beside a definition JSON.
"""

from __future__ import annotations

import math

TOLERANCE_KEYS = ("atol", "rtol", "matched")


def tolerance_problem(key: str, value: object) -> tuple[str, str] | None:
    """What is wrong with one tolerance (``key`` one of TOLERANCE_KEYS), and what to write."""
    # Exactly int or float: not bool, nor a subclass such as numpy's float64.
    number = value if type(value) in (int, float) else None
    if not isinstance(number, (int, float)) or not math.isfinite(number):
        return "is not a finite number", "write a number such as 1e-2"
    if key in ("atol", "rtol") and number < 0:
        error = "absolute" if key == "atol" else "relative"
        return "is negative", f"{key} is the {error} error an element may have: 0 or more"
    if key == "matched" and not 0 < number <= 1:
        return (
            "is not in (0, 1]",
            "matched is the share of elements that must pass: 1 for all of them, 0.99 for 99%; "
            "0 would pass any output",
        )
    return None
