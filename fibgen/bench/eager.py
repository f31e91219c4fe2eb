"""End-to-end eager latency: what a call costs in a loop of back-to-back calls.

The GPU timer (``timing.py``) times kernels behind an L2 flush: the CPU's launch work is
hidden in the gaps. A serving engine in eager mode pays it: its decode step is a loop of
launches, and a small kernel whose launch costs 30 µs is a 30 µs op however fast it runs.
``time_eager`` measures that: rounds of calls issued back to back with no flush and no sync
between them, the device synchronized at the end of each round, wall time per call. A call
costs the larger of its CPU work (Python, checks, allocation, launch) and its GPU time, as it
does in an engine's loop.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

ROUND_MS = 5.0  # each timed round lasts about this long
MAX_CALLS = 2000  # calls per round at most (tiny calls)


def _sync(device: torch.device | None) -> Callable[[], Any]:
    if device is not None and device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def time_eager(
    fn: Callable[[], Any],
    *,
    device: torch.device | str | None = None,
    rounds: int = 7,
    warmup: int | None = None,
    calls: int | None = None,
) -> float:
    """Median wall time per call, in microseconds, of rounds of back-to-back calls of ``fn``.

    ``device``: what to synchronize (default: the current CUDA device, if any). ``warmup``:
    calls first, untimed (default: 20, or 2 for calls slower than a millisecond).
    """
    dev = torch.device(device) if device is not None else None
    if dev is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    sync = _sync(dev)
    start = time.perf_counter()
    fn()
    sync()
    if warmup is None:
        warmup = 20 if time.perf_counter() - start < 1e-3 else 2
    for _ in range(warmup):
        fn()
    sync()
    if calls is None:
        start = time.perf_counter()
        for _ in range(10):
            fn()
        sync()
        each_ms = max((time.perf_counter() - start) * 1e3 / 10, 1e-4)
        calls = max(1, min(MAX_CALLS, int(ROUND_MS / each_ms)))
    per_call = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per_call.append((time.perf_counter() - start) * 1e6 / calls)
    return statistics.median(per_call)
