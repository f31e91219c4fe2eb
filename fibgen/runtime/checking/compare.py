"""Comparing an output with its reference, by flashinfer-bench's rule.

An element fails only when both its absolute error exceeds ``atol`` and its relative error
(absolute error over the reference's magnitude) exceeds ``rtol``; the output passes when the
ratio of elements that do not fail reaches ``matched`` (default 1.0: every element).

Integer and bool outputs are compared exactly. NaN matches NaN and an infinity matches the
same infinity, at the same position; any other non-finite value on either side fails that
element and makes the maximum errors infinite.

Samplers are judged by the distribution of their draws instead, with flashinfer-bench's
thresholds (``compare_sampling``, Note [judging samplers]).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "DEFAULT_TOLERANCES",
    "CompareResult",
    "SamplingResult",
    "compare",
    "compare_outputs",
    "compare_sampling",
    "default_tolerance",
    "sampling_correctness",
    "is_sampling",
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


def _identical(a: torch.Tensor, e: torch.Tensor) -> bool:
    """Whether two CPU tensors of one dtype hold equal values element for element (a NaN is
    never equal, so a tensor with one takes the full comparison)."""
    if a.dtype != e.dtype or "float4" in str(a.dtype):
        return False
    try:
        return torch.equal(a, e)
    except (RuntimeError, TypeError, NotImplementedError):  # a dtype torch cannot compare
        return False


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
    if _identical(a, e):
        # Every element equal: no error to measure (the usual outcome of a routed call that
        # returns the reference's values; the float64 pass below costs many times more).
        return CompareResult(True, 0.0, 0.0, 1.0, n, 0, atol, rtol, matched)
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
        abs_err = (a64 - e64).abs_()
        rel_err = abs_err / e64.abs().add_(_EPS)
        if not (bool(a64.isfinite().all()) and bool(e64.isfinite().all())):
            # Identical non-finite values (NaN with NaN, inf with the same inf) match; any
            # other pair with a non-finite value is an infinite error. (Where every value is
            # finite, as usual, both masks would change nothing: they are not made.)
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


# ---------------------------------------------------------------------------------------
# Samplers: judged by the distribution of their draws
#
# Note [judging samplers]
# A sampler's token ids cannot be compared with the reference's: two correct samplers draw
# different tokens. flashinfer-bench 0.1.2 (bench/evaluators/sampling.py) judges a definition
# of op_type "sampling" by its draws, in two steps, and fibgen uses its thresholds:
#
# 1. ``SAMPLING_VALIDATION_TRIALS`` calls, each of whose samples must be a token id of the
#    vocabulary inside the row's valid set: with top_k, the tokens whose probability is at
#    least the k-th largest (ties kept); with top_p, the sorted prefix whose mass is at most
#    p + ``SAMPLING_TOP_P_EPS`` (at least the first token); which filters apply is read from
#    the definition's name, as flashinfer-bench reads it. A token the reference itself draws
#    is valid too: a top-p row keeps the token that crosses p, which the eps may not cover.
# 2. Many draws per row (the rows repeated into batches, as flashinfer-bench does); the
#    output fails when, for any row, the total variation distance between the frequencies of
#    the solution's tokens and the target exceeds ``SAMPLING_TVD_THRESHOLD``.
#
# One difference, on purpose: flashinfer-bench's target is the probabilities with both masks
# of step 1 applied at once and renormalized. FlashInfer's top_k_top_p_sampling_from_probs
# applies top-k first and top-p to the renormalized result (so does the catalogue's
# reference), which keeps fewer tokens: against flashinfer-bench's target the reference
# itself measured a distance of 0.48. The target here is the reference's own draws, as many
# as the solution's, which follows whatever the definition's reference does.
#
# flashinfer-bench always draws 500,000 times per row, a GPU's work. fibgen draws as many as
# a row needs for the sampling noise of a correct sampler to stay a quarter of the threshold
# (two samplers of n draws each differ by about sqrt(2) * 0.5 * sum(sqrt(2 p (1 - p) / (pi
# n))), p the filtered probabilities), at most flashinfer-bench's count, in batches of at
# most ``SAMPLING_BATCH_BYTES`` of probs. Fewer draws only add noise, which raises the
# measured distance: a wrong sampler is not let through by it.
#
# On a CPU a draw can cost a full sort of the vocabulary (the catalogue's references do
# one): 6,000 draws of 4 rows of 128,256 tokens take the reference alone over two minutes.
# So the draws come in rounds, ``SAMPLING_MIN_DRAWS`` per row and then doubling up to what
# the rows need, and the verdict is given as soon as it is clear: a pass once every row is
# within the threshold (the noise only raises the distance, so a pass at fewer draws stands),
# a failure once a row is further off than the threshold and twice its expected noise, or
# whatever the distance is at the full count. A correct sampler of a few dozen tokens passes
# after the first round. Given a time budget, a round that would not fit in it is not started:
# the result is then undecided (``timed_out``), with the time the full count would take.
# Bench gives a sampler ``SAMPLING_TIMEOUT_SCALE`` times its --timeout, and spends
# ``SAMPLING_BUDGET_SHARE`` of that on the draws, the rest on loading and timing.
#
# Which definitions are samplers, and what a row's target is (``is_sampling``,
# ``_target``). flashinfer-bench takes every definition of op_type "sampling" with a
# `probs` input for one; FlashInfer's trace templates also file deterministic helpers
# under op_type "sampling" (top_p_renorm_probs takes `probs` and returns probabilities, the
# top-k transforms return indices), which must be compared element by element. So a
# sampler is recognised by its op_type and its output: the first output holds draws, named
# as the dataset and FlashInfer's templates name them (``SAMPLED_OUTPUTS``). The
# probabilities a row draws from are its `probs`, or the softmax of its `logits`; min-p
# rows keep the tokens at least min_p times the row's largest. A sampler with neither
# (chain speculative sampling: each row emits several positions, and a position may be -1)
# is judged slot by slot: every element of its output is a draw over the vocabulary and
# -1, the vocabulary being the last axis of its first floating input, and the noise of two
# correct samplers is estimated from the reference's first round of draws. That compares
# the distribution of each output position, not the joint one of a whole row: a sampler
# that draws every position right but ties them together wrongly is not caught.

SAMPLING_VALIDATION_TRIALS = 100
SAMPLING_TVD_THRESHOLD = 0.2
SAMPLING_TOP_P_EPS = 5e-2
SAMPLING_MAX_DRAWS = 500_000
SAMPLING_MIN_DRAWS = 1_000
SAMPLING_ROWS = 10_000
SAMPLING_BATCH_BYTES = 256 << 20
SAMPLING_TIMEOUT_SCALE = 5
SAMPLING_BUDGET_SHARE = 0.75

# What the budget is counted on; tests put a fake clock here, which only their calls advance.
_clock = time.perf_counter


# The first output of a sampler, as the dataset and FlashInfer's sampling templates name it.
SAMPLED_OUTPUTS = frozenset({"samples", "accepted_token_ids"})


def is_sampling(definition: dict[str, Any]) -> bool:
    """Whether a definition (its JSON) is judged as a sampler: op_type "sampling" and a first
    output of draws (Note [judging samplers])."""
    if definition.get("op_type") != "sampling":
        return False
    outputs = definition.get("outputs") or {}
    return next(iter(outputs), None) in SAMPLED_OUTPUTS


def _thresholding(name: str) -> str:
    name = name.lower()
    for method in ("min_p", "top_k_top_p", "top_k", "top_p"):
        if method in name:
            return method
    return "none"


def _target(inputs: dict[str, Any]) -> torch.Tensor | None:
    """Per row, the probabilities a sampler draws from before its filters: its `probs`, or
    the softmax of its `logits`; None for a sampler of neither (judged slot by slot)."""
    if "probs" in inputs:
        probs = inputs["probs"].detach().float().cpu()
    elif "logits" in inputs:
        probs = torch.softmax(inputs["logits"].detach().float().cpu(), dim=-1)
    else:
        return None
    return probs.reshape(-1, probs.shape[-1])


def _vocabulary(inputs: dict[str, Any]) -> int:
    """The vocabulary of a sampler judged slot by slot: the last axis of its first floating
    input, plus one for the -1 a slot may hold."""
    for value in inputs.values():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0:
            return value.shape[-1] + 1
    raise ValueError("a sampler without probs or logits needs a floating input with a vocabulary")


def _row_values(value: Any, rows: int) -> list[float]:
    t = torch.as_tensor(value).flatten()
    return [float(t[i if t.numel() > 1 else 0]) for i in range(rows)]


def sampling_mask(probs: torch.Tensor, method: str, inputs: dict[str, Any]) -> torch.Tensor:
    """Per row, the tokens flashinfer-bench lets a sampler draw (Note [judging samplers])."""
    probs = probs.float().reshape(-1, probs.shape[-1])
    rows, vocab = probs.shape
    mask = torch.ones_like(probs, dtype=torch.bool)
    if method == "min_p":
        for i, p in enumerate(_row_values(inputs["min_p"], rows)):
            mask[i] = probs[i] >= probs[i].max() * p
    if method in ("top_k", "top_k_top_p"):
        for i, k in enumerate(_row_values(inputs["top_k"], rows)):
            k = int(k)
            if 0 < k < vocab:
                pivot = probs[i].sort(descending=True).values[k - 1]
                mask[i] = probs[i] >= pivot
    if method in ("top_p", "top_k_top_p"):
        for i, p in enumerate(_row_values(inputs["top_p"], rows)):
            if 0 < p < 1:
                values, order = probs[i].sort(descending=True)
                nucleus = values.cumsum(0) <= p + SAMPLING_TOP_P_EPS
                nucleus[0] = True
                keep = torch.zeros(vocab, dtype=torch.bool)
                keep[order[nucleus]] = True
                mask[i] &= keep
    return mask


@dataclass(frozen=True)
class SamplingResult:
    """The outcome of judging a sampler; ``reason`` says why it failed (empty when ok).

    ``timed_out``: the time budget ran out before a verdict; ``needed`` draws per row would
    have settled it, in about ``seconds_needed`` at the speed measured.
    """

    ok: bool
    max_tvd: float
    tvds: tuple[float, ...]
    max_abs_err: float
    max_rel_err: float
    draws: int
    reason: str = ""
    timed_out: bool = False
    needed: int = 0
    seconds_needed: float = 0.0

    def __str__(self) -> str:
        status = "ok" if self.ok else f"FAILED ({self.reason})"
        return (
            f"{status}: total variation distance {self.max_tvd:.3g} from the reference's "
            f"draws, {self.draws} draws per row (need <= {SAMPLING_TVD_THRESHOLD:g})"
        )


def _noise(probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per row, the distance two correct samplers of one draw each are expected to differ by;
    of n draws each, it is this over sqrt(n) (Note [judging samplers])."""
    masked = probs.double() * mask
    p = masked / masked.sum(-1, keepdim=True)
    return math.sqrt(2) * 0.5 * torch.sqrt(2 * p * (1 - p) / math.pi).sum(-1)


def _draws_needed(probs: torch.Tensor, mask: torch.Tensor) -> int:
    # Note [judging samplers]: the noise of two correct samplers, a quarter of the threshold.
    c = _noise(probs, mask).max().item()
    n = math.ceil((c / (SAMPLING_TVD_THRESHOLD / 4)) ** 2)
    return max(SAMPLING_MIN_DRAWS, min(SAMPLING_MAX_DRAWS, n))


def repeated_inputs(inputs: dict[str, Any], times: int) -> dict[str, Any]:
    if times == 1:
        return inputs
    out = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            out[name] = value.repeat(times, *([1] * (value.dim() - 1)))
        else:
            out[name] = value
    return out


class _Bad(Exception):
    pass


def _samples(
    draw: Any, inputs: dict[str, Any], rows: int, vocab: int, slots: bool = False
) -> torch.Tensor:
    samples = torch.as_tensor(draw(inputs)).detach().cpu().flatten().to(torch.int64)
    if samples.numel() != rows:
        raise _Bad(f"{samples.numel()} samples for {rows} rows")
    # An empty slot (-1) is the last category (Note [judging samplers]); that category's
    # number itself is no token.
    low, high = (-1, vocab - 1) if slots else (0, vocab)
    outside = (samples < low) | (samples >= high)
    if outside.any():
        raise _Bad(f"sample {int(samples[outside][0])} is outside the vocabulary [0, {high})")
    return torch.where(samples == -1, vocab - 1, samples) if slots else samples


def _counts(
    draw: Any,
    inputs: dict[str, Any],
    rows: int,
    vocab: int,
    draws: int,
    per_call: int,
    slots: bool = False,
) -> torch.Tensor:
    counts = torch.zeros(rows * vocab, dtype=torch.int64)
    done = 0
    while done < draws:
        times = min(per_call, draws - done)
        samples = _samples(draw, repeated_inputs(inputs, times), rows * times, vocab, slots)
        counts += torch.bincount(
            torch.arange(rows * times) % rows * vocab + samples, minlength=rows * vocab
        )
        done += times
    return counts.reshape(rows, vocab)


def compare_sampling(
    draw: Any,
    reference: Any,
    inputs: dict[str, Any],
    definition: dict[str, Any],
    *,
    trials: int = SAMPLING_VALIDATION_TRIALS,
    max_draws: int = SAMPLING_MAX_DRAWS,
    budget_s: float | None = None,
) -> SamplingResult:
    """Judge a sampler by its draws against the reference's (Note [judging samplers]).

    ``draw(inputs)`` and ``reference(inputs)`` call the solution and the reference on a dict
    of inputs (whose rows may be repeated) and return the sampled token ids. With
    ``budget_s``, no round of draws is started that would end after that many seconds.
    """
    started = _clock()
    flat = _target(inputs)
    slots = flat is None
    if flat is None:
        # Judged slot by slot (Note [judging samplers]): one call tells how many there are.
        vocab = _vocabulary(inputs)
        rows = torch.as_tensor(reference(inputs)).numel()
    else:
        rows, vocab = flat.shape
    params: dict[str, Any] = {k: inputs[k] for k in ("top_k", "top_p", "min_p") if k in inputs}
    params = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in params.items()}
    method = "none" if slots else _thresholding(definition["name"])
    per_call = max(1, min(SAMPLING_ROWS // rows, SAMPLING_BATCH_BYTES // max(1, rows * vocab * 4)))
    draws = min(max_draws, SAMPLING_MIN_DRAWS)
    if flat is None:
        target = _counts(reference, inputs, rows, vocab, draws, per_call, slots)
        flat = target.double() / draws
    mask = sampling_mask(flat, method, params)
    noise = _noise(flat, mask)
    needed = min(max_draws, _draws_needed(flat, mask))
    draws = min(needed, SAMPLING_MIN_DRAWS)

    def fail(reason: str) -> SamplingResult:
        inf = float("inf")
        return SamplingResult(False, inf, (), inf, inf, draws, reason, needed=needed)

    def out_of_time(what: str, elapsed: float) -> SamplingResult:
        # What the full count would take, at the speed of the draws made so far.
        assert budget_s is not None  # called only when a budget ran out
        inf = float("inf")
        return SamplingResult(
            False,
            inf,
            (),
            inf,
            inf,
            draws,
            (
                f"not judged within {budget_s:.0f} s: {what}"
                if budget_s >= 1
                else f"not judged within {budget_s:.2f} s: {what}"
            ),
            timed_out=True,
            needed=needed,
            seconds_needed=elapsed * needed / draws,
        )

    if not slots:
        target = _counts(reference, inputs, rows, vocab, draws, per_call)
    # The solution's draws are expected to cost what the reference's did.
    round_s = _clock() - started
    valid = mask | (target > 0)
    try:
        for _ in range(trials):
            samples = _samples(draw, inputs, rows, vocab, slots)
            allowed = valid[torch.arange(rows), samples]
            if not allowed.all():
                row = int((~allowed).nonzero()[0])
                return fail(
                    f"row {row} drew token {int(samples[row])}, outside its valid " f"{method} set"
                )
        elapsed = _clock() - started
        if budget_s is not None and elapsed + round_s > budget_s:
            what = f"{draws} draws per row of the reference took {round_s:.0f} s"
            return out_of_time(what, elapsed + round_s)
        got = _counts(draw, inputs, rows, vocab, draws, per_call, slots)
        while True:
            diff = (got.double() - target.double()).abs() / draws
            tvd = 0.5 * diff.sum(-1)
            max_tvd = float(tvd.max())
            if max_tvd <= SAMPLING_TVD_THRESHOLD or draws >= needed:
                break
            if bool((tvd > SAMPLING_TVD_THRESHOLD + 2 * noise / math.sqrt(draws)).any()):
                break  # further off than noise explains: more draws would not change it
            more = min(draws, needed - draws)
            elapsed = _clock() - started
            if budget_s is not None and elapsed * (draws + more) / draws > budget_s:
                what = (
                    f"total variation distance {max_tvd:.3g} after {draws} draws per row, which "
                    f"more draws may bring under {SAMPLING_TVD_THRESHOLD:g}"
                )
                return out_of_time(what, elapsed)
            target += _counts(reference, inputs, rows, vocab, more, per_call, slots)
            got += _counts(draw, inputs, rows, vocab, more, per_call, slots)
            draws += more
    except _Bad as exc:
        return fail(str(exc))
    tvds = tuple(float(t) for t in tvd)
    expected = target.double() / draws
    max_abs = float(diff.max())
    max_rel = float((diff / (expected + _EPS)).max())
    ok = max_tvd <= SAMPLING_TVD_THRESHOLD
    reason = "" if ok else f"total variation distance {max_tvd:.3g} > {SAMPLING_TVD_THRESHOLD:g}"
    return SamplingResult(ok, max_tvd, tvds, max_abs, max_rel, draws, reason, needed=needed)


# Note [sampler traces]
# What a sampler's trace says in its correctness fields, for fibgen's selection and for
# flashinfer-bench's readers. flashinfer-bench 0.1.2's evaluator (bench/evaluators/
# sampling.py) records a sampler as INCORRECT_NUMERICAL with max_absolute_error and
# max_relative_error infinite when a draw falls outside the vocabulary or the valid set, and
# otherwise the largest errors of the draws' frequencies against the target probabilities,
# with {"tvd", "tvds_per_batch"} in correctness.extra. Those frequency errors measure how
# many draws were made, not the sampler: of n draws, a token of probability p is off by about
# sqrt(p n) draws, relatively by 1 / sqrt(p n), so a token of probability 1e-4 is off by some
# 14% even in flashinfer-bench's 500,000 draws. Its apply admits max_relative_error <= 1e-5
# by default (get_best_trace and `report best`, 1e-2): it hardly ever selects a correct
# sampler on its own evaluator's trace, and never on fibgen's (0.75 to 1.13 from 1,000 draws
# per row).
#
# A sampler is judged by its distribution (Note [judging samplers]), and its trace says that
# verdict in flashinfer-bench's terms: the per-element errors are those of what is compared
# element by element, each draw against its row's valid set. So
# - PASSED: both errors 0, every draw was a valid token and the distance is within the
#   threshold (what flashinfer-bench's later evaluator also writes for a sampler whose
#   distance it cannot measure);
# - a draw outside the vocabulary or the valid set: both errors infinite, as flashinfer-bench;
# - a distance over the threshold: the frequency errors, as flashinfer-bench, which a reader
#   that ignores the status still finds far off.
# correctness.extra keeps the distribution figures: flashinfer-bench's "tvd" and
# "tvds_per_batch", and fibgen's "draws" per row and the frequency errors
# ("frequency_max_absolute_error", "frequency_max_relative_error").


def sampling_correctness(result: SamplingResult) -> dict[str, Any]:
    """The correctness fields of a sampler's trace (Note [sampler traces])."""
    extra: dict[str, Any] = {
        "tvd": result.max_tvd,
        "tvds_per_batch": list(result.tvds),
        "draws": result.draws,
        "frequency_max_absolute_error": result.max_abs_err,
        "frequency_max_relative_error": result.max_rel_err,
    }
    errors = (0.0, 0.0) if result.ok else (result.max_abs_err, result.max_rel_err)
    return {"max_absolute_error": errors[0], "max_relative_error": errors[1], "extra": extra}
