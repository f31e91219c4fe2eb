"""Timing a callable: CUDA events with the L2 cache flushed on a GPU, ``perf_counter_ns`` on a CPU.

``measure`` returns the median of the timed calls after ``warmup`` untimed ones and their
spread (quartiles and count), in milliseconds; ``time_callable`` only the median. Only torch
is needed, so this module also runs where the rest of fibgen's dependencies are not
installed (a bare GPU machine).

Note [CPU timing]
A CPU call is timed with ``perf_counter_ns`` around the call itself. Without a given repeat
count, at least ``CPU_MIN_REPEAT`` samples are taken, and as many as fit in ``TARGET_MS``;
a call shorter than ``CPU_MIN_SAMPLE_MS`` is timed in batches of calls, so that the clock's
own cost and resolution do not dominate the sample. One-off costs (a first-call
allocation, a lazy import) stay in the warmup. The spread is reported with the median,
because a machine shared with other work moves CPU timings far more than GPU ones: a
measurement with a wide interquartile range is noise, not a speedup.

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

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

# do_bench's flush buffer: larger than the L2 cache of current GPUs (H100: 50 MB, H200:
# 60 MB, B200: 126 MB).
L2_FLUSH_BYTES = 256_000_000
# With no repeat count given, time as many calls as fit in this many milliseconds.
TARGET_MS = 100.0
MIN_REPEAT, MAX_REPEAT = 10, 10_000
# Note [CPU timing]
CPU_MIN_REPEAT = 30
CPU_MIN_WARMUP = 3
CPU_MIN_SAMPLE_MS = 0.05

Flush = Literal["read", "zero", "none"]
FLUSHES: tuple[str, ...] = get_args(Flush)
DEFAULT_FLUSH: Flush = "read"

_flush_buffers: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

# The clock CPU calls are timed with, in nanoseconds; tests put a fake one here, which only
# their calls advance (as in eager.py).
_clock: Callable[[], int] = time.perf_counter_ns


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


@dataclass(frozen=True)
class Timing:
    """The median of the timed calls and their spread, in milliseconds."""

    median_ms: float
    q1_ms: float
    q3_ms: float
    samples: int
    calls_per_sample: int = 1

    @classmethod
    def of(cls, samples_ms: list[float], calls_per_sample: int = 1) -> Timing:
        """The median and quartiles of per-call times."""
        if len(samples_ms) >= 2:
            q1, _, q3 = statistics.quantiles(samples_ms, n=4, method="inclusive")
        else:
            q1 = q3 = samples_ms[0]
        return cls(statistics.median(samples_ms), q1, q3, len(samples_ms), calls_per_sample)

    @property
    def spread(self) -> float:
        """The interquartile range over the median (0.1: the middle half within 10%)."""
        return (self.q3_ms - self.q1_ms) / self.median_ms if self.median_ms > 0 else math.inf

    def describe(self) -> str:
        """``median 0.0123 ms (interquartile 0.0120-0.0131 ms, 812 samples)``."""
        batch = f" of {self.calls_per_sample} calls" if self.calls_per_sample > 1 else ""
        return (
            f"median {self.median_ms:.4g} ms (interquartile {self.q1_ms:.4g}-{self.q3_ms:.4g} "
            f"ms, {self.samples} samples{batch})"
        )


def cpu_samples(
    fn: Callable[[], Any], *, warmup: int = 3, repeat: int | None = None
) -> tuple[list[float], int]:
    """Per-call wall times of ``fn()`` in milliseconds, and the calls timed per sample.

    With ``repeat`` given, exactly that many single calls are timed after ``warmup``
    untimed ones; otherwise Note [CPU timing] decides.
    """
    clock = _clock
    warmup = max(1, warmup) if repeat is not None else max(CPU_MIN_WARMUP, warmup)
    start = clock()
    for _ in range(warmup):
        fn()
    estimate = (clock() - start) / 1e6 / warmup
    if repeat is not None:
        n, batch = max(1, repeat), 1
    else:
        batch = max(1, math.ceil(CPU_MIN_SAMPLE_MS / max(estimate, 1e-6)))
        per_sample = estimate * batch
        n = max(CPU_MIN_REPEAT, min(MAX_REPEAT, int(TARGET_MS / max(per_sample, 1e-4))))
    times = []
    for _ in range(n):
        start = clock()
        for _ in range(batch):
            fn()
        times.append((clock() - start) / 1e6 / batch)
    return times, batch


def time_cpu(fn: Callable[[], Any], *, warmup: int = 3, repeat: int | None = None) -> float:
    """Median wall time of ``fn()`` in milliseconds (see ``cpu_samples``)."""
    return statistics.median(cpu_samples(fn, warmup=warmup, repeat=repeat)[0])


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


def measure(
    fn: Callable[[], Any],
    device: torch.device | str,
    *,
    warmup: int,
    repeat: int | None,
    flush: Flush = DEFAULT_FLUSH,
) -> Timing:
    """Median and spread of ``fn()`` on ``device`` (CUDA events, or Note [CPU timing]).

    ``flush`` applies to CUDA devices only; a CPU has no cache fibgen can flush this way.
    """
    device = torch.device(device)
    if device.type == "cuda":
        samples = cuda_samples(fn, warmup=warmup, repeat=repeat, device=device, flush=flush)
        return Timing.of(samples)
    check_flush(flush)
    return Timing.of(*cpu_samples(fn, warmup=warmup, repeat=repeat))


def time_callable(
    fn: Callable[[], Any],
    device: torch.device | str,
    *,
    warmup: int,
    repeat: int | None,
    flush: Flush = DEFAULT_FLUSH,
) -> float:
    """Median time of ``fn()`` in milliseconds on ``device`` (see ``measure``)."""
    return measure(fn, device, warmup=warmup, repeat=repeat, flush=flush).median_ms
