"""The selection policy: how one definition's solution is chosen from its traces."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from fibgen.runtime.errors import ApplyConfigError

ON_MISS = ("best", "nearest", "fallback", "reference")
METRICS = ("e2e", "gpu")


@dataclass(frozen=True)
class Policy:
    """How one definition's solution is chosen from its traces.

    ``atol``/``rtol``: the largest max_absolute_error / max_relative_error a passing trace may
    report (None: any); ``on_miss``: what a keyed definition does on an untraced key;
    ``prebuild``: how many of its top solutions are loaded when apply is enabled;
    ``metric``: what is compared (Note [selection metric]); ``original``: whether the API's
    own function is a candidate (Note [the API's own function as a candidate]).
    """

    atol: float | None = None
    rtol: float | None = None
    on_miss: str = "best"
    prebuild: int = 0
    metric: str = "e2e"
    original: bool = True

    def __post_init__(self) -> None:
        # Checked here, with the key named, so that a bad value fails at enable_apply and not
        # as a TypeError (or a silent no-op, for NaN) when the table is built.
        for key in ("atol", "rtol"):
            value = getattr(self, key)
            if value is None:
                continue
            if not _is_real(value) or not math.isfinite(value) or value < 0:
                raise ApplyConfigError(
                    f"{key} must be None or a finite number 0 or more, not {value!r}"
                )
        if not isinstance(self.on_miss, str) or self.on_miss not in ON_MISS:
            raise ApplyConfigError(
                f"on_miss must be one of {', '.join(ON_MISS)}, not {self.on_miss!r}"
            )
        if not isinstance(self.prebuild, int) or isinstance(self.prebuild, bool):
            raise ApplyConfigError(f"prebuild must be a whole number, not {self.prebuild!r}")
        if self.prebuild < 0:
            raise ApplyConfigError(f"prebuild must be 0 or more, not {self.prebuild}")
        if not isinstance(self.metric, str) or self.metric not in METRICS:
            raise ApplyConfigError(
                f"metric must be one of {', '.join(METRICS)}, not {self.metric!r}"
            )
        if not isinstance(self.original, bool):
            raise ApplyConfigError(f"original must be True or False, not {self.original!r}")


def _is_real(value: Any) -> bool:
    # bool is an int to Python, but True as a tolerance is a mistake, not 1.0.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_POLICY_KEYS = tuple(f.name for f in fields(Policy))
# What a flashinfer-bench ApplyConfig's settings are here.
_FROM_FLASHINFER_BENCH = (
    "flashinfer-bench's ApplyConfig settings are, here: max_atol and max_rtol -> atol and "
    "rtol; on_miss_policy 'fallback_only' -> on_miss='fallback', 'use_def_best' -> "
    "on_miss='best'; aot_ratio -> prebuild, a count of top solutions; its "
    "ApplyConfigRegistry is a mapping {definition name or '*': {...}}"
)


def normalize_config(config: Mapping[str, Any] | Policy | None) -> dict[str, Policy]:
    """``{definition name or "*": Policy}`` from a Policy, a mapping of Policies or dicts."""
    if config is None:
        return {"*": Policy()}
    if isinstance(config, Policy):
        return {"*": config}
    if not isinstance(config, Mapping):
        fib = hasattr(config, "max_atol") or hasattr(config, "per_definition")
        raise ApplyConfigError(
            f"the selection config must be a Policy or a mapping, not {type(config).__name__}"
            + (f"; {_FROM_FLASHINFER_BENCH}" if fib else "")
        )
    out: dict[str, Policy] = {}
    for name, policy in config.items():
        if isinstance(policy, Mapping):
            unknown = sorted(str(k) for k in policy if k not in _POLICY_KEYS)
            if unknown:
                fib = unknown[0] in ("max_atol", "max_rtol", "on_miss_policy", "aot_ratio")
                raise ApplyConfigError(
                    f"config for {name!r}: unknown key {unknown[0]!r}; the keys are "
                    f"{', '.join(_POLICY_KEYS)}" + (f" ({_FROM_FLASHINFER_BENCH})" if fib else "")
                )
            try:
                policy = Policy(**policy)
            except ApplyConfigError as exc:
                raise ApplyConfigError(f"config for {name!r}: {exc}") from None
        if not isinstance(policy, Policy):
            raise ApplyConfigError(f"config for {name!r} must be a Policy or a dict")
        out[str(name)] = policy
    out.setdefault("*", Policy())
    return out


def policy_of(config: dict[str, Policy], name: str) -> Policy:
    return config.get(name) or config["*"]
