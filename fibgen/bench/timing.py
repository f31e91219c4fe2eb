"""Timing a callable: CUDA events with the L2 cache flushed on a GPU, ``perf_counter`` on a CPU.

Both return the median of the timed calls after ``warmup`` untimed ones, in milliseconds.
Only torch is needed, so this module also runs where the rest of fibgen's dependencies are
not installed (a bare GPU machine).

Note [flushing L2]
Before each timed call, a buffer larger than the L2 cache is read (``"read"``, the default)
or zeroed (``"zero"``, what ``triton.testing.do_bench`` does). Either way the timed kernel
finds none of its data in L2. Zeroing also leaves the cache full of dirty lines, and the
timed kernel pays for writing them back while it brings in its own data. Measured on an H100
by ``benchmarks/l2_flush.py`` (results in ``benchmarks/gpu.md``):

- A copy moving 64 MiB takes 28.2 µs after a zeroing flush and 21.6 µs after a reading one.
  Under zeroing it reaches 79% of a large copy's bandwidth, and every variant of the
  rmsnorm kernel 78 to 81%, whatever cache hints its loads and stores carry.
- For kernels of a few µs, zeroing makes the median jump between levels from one run to the
  next: rmsnorm at 16 rows measured 4.90 to 5.54 µs over twelve runs (13%), while a
  compute-bound kernel timed between them stayed within 0.7%, so the SM clock is not the
  cause. After a reading flush the same twelve runs stay within 5.09 to 5.12 µs.

So fibgen charges a kernel for its own traffic. The one thing a reading flush lets through
is the write-back of the kernel's own last outputs, which may still sit in L2 when its end
event fires: a large kernel that writes much can measure slightly above copy bandwidth.
``"zero"`` is there to reproduce do_bench's numbers. With the same flush, this timer and
do_bench measure the same thing the same way (events around each call, the flush outside
them, the median), and agree within 1% (``benchmarks/gpu.py``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, Literal, get_args

import torch

# do_bench's flush buffer: larger than the L2 cache of current GPUs (H100: 50 MB, H200:
# 60 MB, B200: 126 MB).
L2_FLUSH_BYTES = 256_000_000
# With no repeat count given, time as many calls as fit in this many milliseconds.
TARGET_MS = 100.0
MIN_REPEAT, MAX_REPEAT = 10, 10_000

Flush = Literal["read", "zero", "none"]
FLUSHES: tuple[str, ...] = get_args(Flush)
DEFAULT_FLUSH: Flush = "read"

_flush_buffers: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def check_flush(flush: str) -> None:
    """Raise ValueError unless ``flush`` is one of ``FLUSHES``."""
    if flush not in FLUSHES:
        raise ValueError(f"flush must be one of {', '.join(FLUSHES)}, not {flush!r}")


def _flusher(device: torch.device, flush: str) -> Callable[[], Any] | None:
    check_flush(flush)
    if flush == "none":
        return None
    buffers = _flush_buffers.get(device)
    if buffers is None:
        buf = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
        sink = torch.empty((), dtype=torch.int64, device=device)
        buffers = _flush_buffers[device] = (buf, sink)
    buf, sink = buffers
    if flush == "zero":
        return buf.zero_
    return lambda: torch.sum(buf, dim=0, dtype=torch.int64, out=sink)


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


def cuda_samples(
    fn: Callable[[], Any],
    *,
    warmup: int = 10,
    repeat: int | None = None,
    device: torch.device | str | None = None,
    flush: Flush = DEFAULT_FLUSH,
) -> list[float]:
    """Device times of single calls of ``fn()`` in milliseconds, L2 flushed before each.

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
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def time_cuda(
    fn: Callable[[], Any],
    *,
    warmup: int = 10,
    repeat: int | None = None,
    device: torch.device | str | None = None,
    flush: Flush = DEFAULT_FLUSH,
) -> float:
    """Median device time of ``fn()`` in milliseconds (see ``cuda_samples``)."""
    samples = cuda_samples(fn, warmup=warmup, repeat=repeat, device=device, flush=flush)
    return statistics.median(samples)


def time_callable(
    fn: Callable[[], Any],
    device: torch.device | str,
    *,
    warmup: int,
    repeat: int | None,
    flush: Flush = DEFAULT_FLUSH,
) -> float:
    """Median time of ``fn()`` in milliseconds on ``device`` (CUDA events, or a CPU clock).

    ``flush`` applies to CUDA devices only; a CPU has no cache fibgen can flush this way.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return time_cuda(fn, warmup=warmup, repeat=repeat, device=device, flush=flush)
    check_flush(flush)
    return time_cpu(fn, warmup=warmup, repeat=repeat)
