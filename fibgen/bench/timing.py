"""Timing a callable: CUDA events with the L2 cache flushed on a GPU, ``perf_counter`` on a CPU.

Both return the median of the timed calls after ``warmup`` untimed ones, in milliseconds.
Only torch is needed, so this module also runs where the rest of fibgen's dependencies are
not installed (a bare GPU machine).

Note [flushing L2]
Before each timed call a buffer larger than the L2 cache is either zeroed (``"zero"``, what
``triton.testing.do_bench`` does) or read (``"read"``). Zeroing leaves the cache full of dirty
lines, and the timed kernel pays for writing them back as it brings in its own data: on an
H100, a 32 MB copy measures 28 µs after a zeroing flush and 22.6 µs after a reading one. The
default follows do_bench, so that the two agree; ``"read"`` charges a kernel only for its own
traffic.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, Literal

import torch

# Larger than the L2 cache of any current GPU (H100: 50 MB, H200: 60 MB, B200: 126 MB).
L2_FLUSH_BYTES = 256 * 1024 * 1024
# With no repeat count given, time as many calls as fit in this many milliseconds.
TARGET_MS = 100.0
MIN_REPEAT, MAX_REPEAT = 10, 10_000

Flush = Literal["zero", "read", "none"]

_flush_buffers: dict[torch.device, torch.Tensor] = {}


def _flusher(device: torch.device, flush: Flush) -> Callable[[], Any] | None:
    if flush == "none":
        return None
    buf = _flush_buffers.get(device)
    if buf is None:
        buf = _flush_buffers[device] = torch.empty(
            L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device
        )
    if flush == "zero":
        return buf.zero_
    if flush == "read":
        return buf.sum
    raise ValueError(f"flush must be 'zero', 'read' or 'none', not {flush!r}")


def _repeat_for(estimate_ms: float, repeat: int | None) -> int:
    if repeat is not None:
        return max(1, repeat)
    return max(MIN_REPEAT, min(MAX_REPEAT, int(TARGET_MS / max(estimate_ms, 1e-4))))


def time_cpu(fn: Callable[[], Any], *, warmup: int = 3, repeat: int | None = None) -> float:
    """Median wall time of ``fn()`` in milliseconds, after ``warmup`` untimed calls."""
    start = time.perf_counter()
    for _ in range(max(1, warmup)):
        fn()
    estimate = (time.perf_counter() - start) * 1e3 / max(1, warmup)
    times = []
    for _ in range(_repeat_for(estimate, repeat)):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def time_cuda(
    fn: Callable[[], Any],
    *,
    warmup: int = 10,
    repeat: int | None = None,
    device: torch.device | str | None = None,
    flush: Flush = "zero",
) -> float:
    """Median device time of ``fn()`` in milliseconds, L2 flushed before each call.

    Each call is bracketed by its own pair of CUDA events, so the flush is not counted (but
    see Note [flushing L2]). Without ``repeat``, as many calls as fit in ``TARGET_MS``.
    """
    device = torch.device("cuda" if device is None else device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.device(device):
        flusher = _flusher(device, flush)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(max(1, warmup)):
            if flusher is not None:
                flusher()
            fn()
        torch.cuda.synchronize()
        estimate = (time.perf_counter() - start) * 1e3 / max(1, warmup)
        n = _repeat_for(estimate, repeat)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            if flusher is not None:
                flusher()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_callable(
    fn: Callable[[], Any], device: torch.device | str, *, warmup: int, repeat: int | None
) -> float:
    """Median time of ``fn()`` in milliseconds on ``device`` (CUDA events, or a CPU clock)."""
    device = torch.device(device)
    if device.type == "cuda":
        return time_cuda(fn, warmup=warmup, repeat=repeat, device=device)
    return time_cpu(fn, warmup=warmup, repeat=repeat)
