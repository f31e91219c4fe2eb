"""fibgen's runtime: route calls of generated dispatchers to registered solutions.

``enable_apply({definition name: solution})`` or ``enable_apply(dataset_dir)`` turns routing
on; ``disable_apply()`` turns it off; ``stats()`` counts calls per API. Setting
``FIBGEN_APPLY=1`` and ``FIBGEN_APPLY_PATH=<dir>`` enables it when this package is imported.
``enable_tracing(dataset_dir)`` records the workloads of calls (``FIBGEN_TRACE=1`` with
``FIBGEN_DATASET_PATH=<dir>`` at import); ``disable_tracing()`` writes what is pending.
This package never imports the compiler, lark or jinja2.
"""

from __future__ import annotations

import sys
from typing import Any

from fibgen.runtime import for_generated as _for_generated
from fibgen.runtime.env import enable_from_env
from fibgen.runtime.errors import ApplyConfigError, Decline, FallbackError, SolutionError
from fibgen.runtime.routing.apply import Applied, disable_apply, enable_apply, is_enabled, stats
from fibgen.runtime.routing.handwritten import apply
from fibgen.runtime.routing.registry import register_api, register_package
from fibgen.runtime.tracing.tracer import (
    TracingConfigError,
    disable_tracing,
    enable_tracing,
    flush_tracing,
    is_tracing,
    tracing_stats,
)
from fibgen.runtime.tracing.tracer import (
    enable_from_environment as _enable_tracing_from_environment,
)

__all__ = [
    "Applied",
    "ApplyConfigError",
    "Decline",
    "FallbackError",
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


# Earlier generated packages' import paths (Note [generated imports] in for_generated.py).
for _path in _for_generated.LEGACY_PATHS:
    sys.modules.setdefault(f"{__name__}.{_path}", _for_generated)


def __getattr__(name: str) -> Any:
    if name == "testing":  # `from fibgen.runtime import testing` in earlier generated tests
        return _for_generated.testing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _enable_from_environment() -> None:
    enable_from_env(
        "FIBGEN_APPLY",
        "FIBGEN_APPLY_PATH",
        "folder holding solutions/",
        "apply",
        enable_apply,
        (ApplyConfigError,),
    )


# Last, so that generated packages imported while enabling find every name above.
_enable_from_environment()
_enable_tracing_from_environment()
