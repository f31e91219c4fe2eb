"""What isolating each solution costs `fibgen bench` (Note [isolated solutions] in
fibgen/bench/isolation.py): the wall time of one bench over the same dataset, each solution
in a fresh process of its own (the default) and all in the worker as before
(``BenchOptions(isolate=False)``, kept only for this measurement).

    python benchmarks/isolation.py [--devices cpu] [--workloads 4] [--trials 3]

The dataset is the test suite's (tests/_bench_dataset.py): one definition (64-wide rows
scaled by a weight), 8 solutions of which 4 fail in different ways, ``--workloads`` row
counts from 1 to 4,096. Trials alternate the two modes, each on a fresh copy of the dataset
(no trace to resume from), and a mode's figure is the median. Each bench runs with
``--warmup 1 --repeat 10``, so that the process work, not the timing loops, dominates.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, sys.path[0] is benchmarks/, whose scripts would shadow modules of the same
# name (select.py shadows the standard library's).
sys.path[0] = str(ROOT)
sys.path.insert(1, str(ROOT / "tests"))

SOLUTIONS = [
    "good_returns",
    "good_dps",
    "slow_returns",
    "wrong_numbers",
    "wrong_shape",
    "wrong_dtype",
    "raises",
    "bad_import",
]


def _bench(dataset: Path, devices: tuple[str, ...], isolate: bool) -> tuple[float, int]:
    from fibgen.bench.runner import BenchOptions, run_bench

    options = BenchOptions(devices=devices, warmup=1, repeat=10, timeout=60, isolate=isolate)
    started = time.perf_counter()
    summary = run_bench(dataset, options, progress=False)
    seconds = time.perf_counter() - started
    if summary.problems:
        raise SystemExit(f"bench failed: {summary.problems}")
    return seconds, summary.traces


def main() -> None:
    """Print the table of bench wall times with and without isolation."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="cpu")
    parser.add_argument("--workloads", type=int, default=4)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    from _bench_dataset import make_dataset

    devices = tuple(args.devices.split(","))
    sizes = tuple(4**i for i in range(args.workloads))
    with tempfile.TemporaryDirectory(prefix="fibgen-isolation-") as tmp:
        template = make_dataset(Path(tmp) / "template", SOLUTIONS, sizes=sizes)
        import os

        os.environ.setdefault("FIBGEN_CACHE_DIR", str(Path(tmp) / "cache"))
        times: dict[bool, list[float]] = {True: [], False: []}
        runs = 0
        for trial in range(args.trials):
            order = (True, False) if trial % 2 == 0 else (False, True)
            for isolate in order:
                dataset = Path(tmp) / f"ds-{trial}-{isolate}"
                shutil.copytree(template, dataset)
                seconds, runs = _bench(dataset, devices, isolate)
                times[isolate].append(seconds)
    shared, isolated = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"{len(SOLUTIONS)} solutions x {len(sizes)} workloads = {runs} runs on "
        f"{','.join(devices)}, median of {args.trials} trials (warmup 1, repeat 10)"
    )
    print(f"{'mode':<34}{'wall s':>8}{'per run s':>11}   trials")
    for label, isolate in (("all in the worker (isolate=False)", False), ("a process each", True)):
        median = statistics.median(times[isolate])
        shown = " ".join(f"{t:.1f}" for t in times[isolate])
        print(f"{label:<34}{median:>8.1f}{median / runs:>11.3f}   {shown}")
    print(
        f"isolation costs {isolated - shared:+.1f} s ({(isolated / shared - 1) * 100:+.0f}%), "
        f"{(isolated - shared) / runs:+.3f} s per run"
    )


if __name__ == "__main__":
    main()
