"""fibgen's runtime: route calls of generated dispatchers to registered solutions.

``enable_apply({definition name: solution})`` or ``enable_apply(dataset_dir)`` turns routing
on; ``disable_apply()`` turns it off; ``stats()`` counts calls per API. Setting
``FIBGEN_APPLY=1`` and ``FIBGEN_APPLY_PATH=<dir>`` enables it when this package is imported.
``enable_tracing(dataset_dir)`` records the workloads of calls (``FIBGEN_TRACE=1`` with
``FIBGEN_DATASET_PATH=<dir>`` at import); ``disable_tracing()`` writes what is pending.
This package never imports the compiler, lark or jinja2.
"""

from __future__ import annotations

import os
import warnings

from fibgen.runtime.apply import (
    Applied,
    apply,
    disable_apply,
    enable_apply,
    is_enabled,
    register_api,
    register_package,
    stats,
)
from fibgen.runtime.errors import ApplyConfigError, SolutionError
from fibgen.runtime.tracing import enable_from_environment as _enable_tracing_from_environment
from fibgen.runtime.tracing import (
    TracingConfigError,
    disable_tracing,
    enable_tracing,
    flush_tracing,
    is_tracing,
    tracing_stats,
)

__all__ = [
    "Applied",
    "ApplyConfigError",
    "SolutionError",
    "TracingConfigError",
    "apply",
    "disable_apply",
    "disable_tracing",
    "enable_apply",
    "enable_tracing",
    "flush_tracing",
    "is_enabled",
    "is_tracing",
    "register_api",
    "register_package",
    "stats",
    "tracing_stats",
]


def _enable_from_environment() -> None:
    flag = os.environ.get("FIBGEN_APPLY", "").strip()
    if flag in ("", "0"):
        return
    path = os.environ.get("FIBGEN_APPLY_PATH", "").strip()
    problem = None
    if flag != "1":
        problem = f"FIBGEN_APPLY={flag!r} must be 0 or 1"
    elif not path:
        problem = "FIBGEN_APPLY=1 needs FIBGEN_APPLY_PATH=<folder holding solutions/>"
    else:
        try:
            enable_apply(path)
        except ApplyConfigError as exc:
            problem = f"FIBGEN_APPLY_PATH={path}: {exc}"
    if problem is not None:
        # A serving process must keep running on its original kernels: warn, do not raise.
        warnings.warn(f"fibgen: {problem}; apply stays off", RuntimeWarning, stacklevel=2)


# Last, so that generated packages imported while enabling find every name above.
_enable_from_environment()
_enable_tracing_from_environment()
