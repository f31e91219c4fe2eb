"""End-to-end eager latency: what a call costs in a loop of back-to-back calls.

The GPU timer (``timing.py``) times kernels behind an L2 flush: the CPU's launch work is
hidden in the gaps. A serving engine in eager mode pays it: its decode step is a loop of
launches, and a small kernel whose launch costs 30 µs is a 30 µs op however fast it runs.
``time_eager`` measures that: calls issued back to back with no flush and no sync between
them. A call costs the larger of its CPU work (Python, checks, allocation, launch) and its GPU
time, as it does in an engine's loop.

Note [eager rounds]
~~~~~~~~~~~~~~~~~~~
A timed round starts from a synchronized device and ends with a synchronize: its wall time is a
fixed part (the first launch reaching an idle GPU, the last kernel's completion reaching the
host) plus one per-call cost for each call. Dividing a round's time by its calls charges the
fixed part to the calls, and it is not the same for every candidate: a call whose launch goes
through more Python reaches the idle GPU later. On an H100 host that part was 89 µs for
FlashInfer's fused_add_rmsnorm at 16,384 rows and 111 to 158 µs for the same work launched
through Triton, which made a 180 µs kernel of 5 ms rounds read 1% slower than an equally fast
one (``benchmarks/eager_rounds.py``; ``benchmarks/README.md``, "Eager rounds"). So each round
is timed twice, with ``n`` and ``2n`` calls: the difference is ``n`` calls' worth of loop, and
the fixed part drops out. ``eager_costs`` returns both parts; ``time_eager`` the per-call one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

ROUND_MS = 5.0  # the shorter of a round's two timings lasts about this long
MAX_CALLS = 2000  # calls in the shorter timing at most (tiny calls)

# The clock rounds are timed with; tests put a fake one here, which only their calls advance.
_clock: Callable[[], float] = time.perf_counter


class EagerCost(NamedTuple):
    """Microseconds: what each call of a loop adds, what a round pays once, and a round's time
    over its calls (the fixed part included)."""

    per_call: float
    fixed: float
    average: float


def _sync(device: torch.device | None) -> Callable[[], Any]:
    if device is not None and device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _timed(fn: Callable[[], Any], calls: int, sync: Callable[[], Any]) -> float:
    """Seconds for ``calls`` back-to-back calls, from a synchronized device to the next sync."""
    sync()
    start = _clock()
    for _ in range(calls):
        fn()
    sync()
    return _clock() - start


def eager_rounds(
    fns: Mapping[str, Callable[[], Any]],
    *,
    device: torch.device | str | None = None,
    rounds: int = 7,
    warmup: int | None = None,
    calls: int | None = None,
    round_ms: float = ROUND_MS,
) -> dict[str, list[EagerCost]]:
    """Each round's per-call and fixed cost, in microseconds, of back-to-back calls of every
    function of ``fns`` (Note [eager rounds]). A round times the functions one after the other,
    starting each round from the next one: ratios of one round's figures compare functions
    timed within milliseconds of each other, on a host whose speed drifts over seconds.

    ``device``: what to synchronize (default: the current CUDA device, if any). ``warmup``:
    calls first, untimed (default: 20, or 2 for calls slower than a millisecond). ``calls``:
    calls in a round's shorter timing (default: about ``round_ms`` of them, per function);
    a call of a millisecond gets few calls in 5 ms, and their spread is then the host's jitter
    over a handful of calls, so a whole decode step is timed in longer rounds.
    """
    dev = torch.device(device) if device is not None else None
    if dev is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    sync = _sync(dev)
    counts = {}
    for name, fn in fns.items():
        first = _timed(fn, 1, sync)
        for _ in range(warmup if warmup is not None else 20 if first < 1e-3 else 2):
            fn()
        if calls is None:
            probe = 10 if first < 1e-3 else 2
            each_ms = max(_timed(fn, probe, sync) * 1e3 / probe, 1e-4)
            counts[name] = max(1, min(MAX_CALLS, int(round_ms / each_ms)))
        else:
            counts[name] = calls
    names = list(fns)
    costs: dict[str, list[EagerCost]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            fn, n = fns[name], counts[name]
            short = _timed(fn, n, sync)
            long = _timed(fn, 2 * n, sync)
            costs[name].append(
                EagerCost(
                    (long - short) / n * 1e6,
                    (2 * short - long) * 1e6,
                    (short + long) / (3 * n) * 1e6,
                )
            )
    return costs


def per_call(cost: EagerCost) -> float:
    """One round's per-call figure: the n/2n difference, or where noise made it 0 or less the
    round's average (Note [eager rounds])."""
    return cost.per_call if cost.per_call > 0 else cost.average


def eager_costs(
    fn: Callable[[], Any],
    *,
    device: torch.device | str | None = None,
    rounds: int = 7,
    warmup: int | None = None,
    calls: int | None = None,
) -> EagerCost:
    """Per-call and fixed cost of ``fn``, in microseconds: medians of ``eager_rounds``."""
    costs = eager_rounds({"fn": fn}, device=device, rounds=rounds, warmup=warmup, calls=calls)["fn"]
    each, fixed, average = (statistics.median(column) for column in zip(*costs))
    if each <= 0:  # noise larger than the calls themselves: the plain average instead
        return EagerCost(average, 0.0, average)
    return EagerCost(each, max(fixed, 0.0), average)


def time_eager(
    fn: Callable[[], Any],
    *,
    device: torch.device | str | None = None,
    rounds: int = 7,
    warmup: int | None = None,
    calls: int | None = None,
) -> float:
    """Microseconds each call of ``fn`` adds to a loop of back-to-back calls (``eager_costs``)."""
    return eager_costs(fn, device=device, rounds=rounds, warmup=warmup, calls=calls).per_call
