"""Comparing an output with its reference, by flashinfer-bench's rule.

An element fails only when both its absolute error exceeds ``atol`` and its relative error
(absolute error over the reference's magnitude) exceeds ``rtol``; the output passes when the
ratio of elements that do not fail reaches ``matched`` (default 1.0: every element).

Integer and bool outputs are compared exactly. NaN matches NaN and an infinity matches the
same infinity, at the same position; any other non-finite value on either side fails that
element and makes the maximum errors infinite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "DEFAULT_TOLERANCES",
    "CompareResult",
    "compare",
    "compare_outputs",
    "default_tolerance",
]

# (atol, rtol) per output dtype. bf16/fp16 follow flashinfer-bench (1e-2); fp32 outputs of
# two fp32 computations differ only by summation order, so they are held tighter. The
# low-bit formats get about one step of their mantissa.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
    "float8_e4m3fn": (1.25e-1, 1.25e-1),
    "float8_e5m2": (2.5e-1, 2.5e-1),
    "float4_e2m1": (5e-1, 5e-1),
}

_EXACT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
}

# Keeps the relative error finite where the reference is exactly zero.
_EPS = 1e-12


@dataclass(frozen=True)
class CompareResult:
    """The outcome of one comparison; ``reason`` says why it failed (empty when ok)."""

    ok: bool
    max_abs_err: float
    max_rel_err: float
    matched_ratio: float
    num_elements: int
    num_mismatched: int
    atol: float
    rtol: float
    matched: float
    reason: str = ""

    def __str__(self) -> str:
        status = "ok" if self.ok else f"FAILED ({self.reason})"
        return (
            f"{status}: max_abs_err={self.max_abs_err:.3g} max_rel_err={self.max_rel_err:.3g} "
            f"matched={self.matched_ratio:.4%} of {self.num_elements} "
            f"(need {self.matched:.2%}; atol={self.atol:g}, rtol={self.rtol:g})"
        )


def default_tolerance(dtype: torch.dtype | str) -> tuple[float, float]:
    """The default (atol, rtol) for outputs of this dtype; (0, 0) for integer and bool."""
    if isinstance(dtype, torch.dtype):
        if dtype in _EXACT_DTYPES:
            return (0.0, 0.0)
        name = _DTYPE_NAMES.get(dtype, "float4_e2m1" if "float4" in str(dtype) else "float32")
    else:
        name = dtype
    return DEFAULT_TOLERANCES.get(name, (0.0, 0.0))


def _failed(reason: str, n: int, atol: float, rtol: float, matched: float) -> CompareResult:
    inf = float("inf")
    return CompareResult(False, inf, inf, 0.0, n, n, atol, rtol, matched, reason)


def compare(
    actual: Any,
    expected: Any,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    matched: float | None = None,
    check_dtype: bool = True,
) -> CompareResult:
    """Compare one output with its reference; tolerances default by the reference's dtype."""
    if not isinstance(expected, torch.Tensor):
        expected = torch.as_tensor(expected)
    if not isinstance(actual, torch.Tensor):
        actual = torch.as_tensor(actual)
    d_atol, d_rtol = default_tolerance(expected.dtype)
    atol = d_atol if atol is None else float(atol)
    rtol = d_rtol if rtol is None else float(rtol)
    matched = 1.0 if matched is None else float(matched)
    n = expected.numel()
    if tuple(actual.shape) != tuple(expected.shape):
        reason = f"shape {list(actual.shape)} != expected {list(expected.shape)}"
        return _failed(reason, n, atol, rtol, matched)
    if check_dtype and actual.dtype != expected.dtype:
        return _failed(f"dtype {actual.dtype} != expected {expected.dtype}", n, atol, rtol, matched)
    if n == 0:
        return CompareResult(True, 0.0, 0.0, 1.0, 0, 0, atol, rtol, matched)
    a = actual.detach().to("cpu")
    e = expected.detach().to("cpu")
    if e.dtype in _EXACT_DTYPES and a.dtype in _EXACT_DTYPES:
        a64, e64 = a.to(torch.int64), e.to(torch.int64)
        bad = a64 != e64
        abs_err = (a64 - e64).abs().to(torch.float64)
        rel_err = abs_err / e64.abs().to(torch.float64).clamp_min(1.0)
    else:
        if "float4" in str(e.dtype) or "float4" in str(a.dtype):
            # Packed FP4 has no arithmetic in torch: compare the bytes exactly.
            a, e = a.view(torch.uint8), e.view(torch.uint8)
            return compare(a, e, atol=0, rtol=0, matched=matched, check_dtype=False)
        a64, e64 = a.to(torch.float64), e.to(torch.float64)
        abs_err = (a64 - e64).abs()
        rel_err = abs_err / (e64.abs() + _EPS)
        # Identical non-finite values (NaN with NaN, inf with the same inf) match.
        same_special = (a64.isnan() & e64.isnan()) | (a64.isinf() & (a64 == e64))
        finite = a64.isfinite() & e64.isfinite()
        abs_err = torch.where(same_special, 0.0, torch.where(finite, abs_err, float("inf")))
        rel_err = torch.where(same_special, 0.0, torch.where(finite, rel_err, float("inf")))
        bad = (abs_err > atol) & (rel_err > rtol)
    num_bad = int(bad.sum())
    ratio = 1.0 - num_bad / n
    ok = ratio >= matched
    reason = "" if ok else f"{num_bad} of {n} elements outside atol={atol:g} and rtol={rtol:g}"
    return CompareResult(
        ok,
        float(abs_err.max()),
        float(rel_err.max()),
        ratio,
        n,
        num_bad,
        atol,
        rtol,
        matched,
        reason,
    )


def compare_outputs(
    actual: Any,
    expected: Any,
    names: tuple[str, ...] | list[str] | None = None,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    matched: float | None = None,
) -> dict[str, CompareResult]:
    """Compare every output of a call (a tensor or a tuple in output order), by name."""
    if not isinstance(actual, (tuple, list)):
        actual = (actual,)
    if not isinstance(expected, (tuple, list)):
        expected = (expected,)
    names = list(names) if names is not None else [f"output{i}" for i in range(len(expected))]
    if len(actual) != len(expected):
        raise ValueError(f"got {len(actual)} outputs, expected {len(expected)} ({names})")
    return {
        name: compare(a, e, atol=atol, rtol=rtol, matched=matched)
        for name, a, e in zip(names, actual, expected)
    }
