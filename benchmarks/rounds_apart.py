"""Which statistic of a host-bound call agrees from process to process: rounds back to back,
or rounds apart with a warm-up, summarized by their median or their low decile.

    python benchmarks/rounds_apart.py [--processes 5] [--rounds 40] [--calls 200]

Needs a CUDA GPU and FlashInfer. Each row is a fresh process that times FlashInfer's own
``rmsnorm`` at one row of 4,096 columns (``out=`` given: the host's launch path is the whole
cost) in rounds of ``--calls`` calls, under each setting: ``busy`` (rounds back to back, as
bench's e2e rounds run) and ``apart`` (100 ms asleep before each round, then 100 calls untimed
before its timed ones). It prints each process's median and low decile (p10) of its round
figures, then per setting how far apart the processes are (largest over smallest). On hosts
whose processes run their host work at one of two speeds ("Host speed" in
benchmarks/README.md), a figure that agrees across processes is one they all reach.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

SETTINGS = {"busy": (0.0, 0), "apart": (0.1, 100)}  # (seconds asleep, warm-up calls) a round


def child(setting: str, rounds: int, calls: int) -> dict:
    import flashinfer
    import torch

    gap, warm = SETTINGS[setting]
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)

    def call() -> None:
        flashinfer.norm.rmsnorm(x, w, 1e-5, out=out)

    for _ in range(500):
        call()
    torch.cuda.synchronize()
    figures = []
    for _ in range(rounds):
        time.sleep(gap)
        for _ in range(warm):
            call()
        start = time.perf_counter_ns()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        figures.append((time.perf_counter_ns() - start) / calls / 1e3)
    return {
        "median": statistics.median(figures),
        "p10": statistics.quantiles(figures, n=10)[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--processes", type=int, default=5)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--calls", type=int, default=200)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.rounds, a.calls)))
        return
    rows: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    for _ in range(a.processes):  # the settings interleaved, so that both see the same hours
        for setting in SETTINGS:
            argv = [sys.executable, __file__, "--child", setting]
            argv += ["--rounds", str(a.rounds), "--calls", str(a.calls)]
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            rows[setting].append(json.loads(out.strip().splitlines()[-1]))
    print("| setting | process | median µs | p10 µs |")
    print("|---|---|---|---|")
    for setting, found in rows.items():
        for i, r in enumerate(found):
            print(f"| {setting} | {i + 1} | {r['median']:.2f} | {r['p10']:.2f} |")
    print()
    print("| setting | median: largest / smallest | p10: largest / smallest |")
    print("|---|---|---|")
    for setting, found in rows.items():
        spread = {k: max(r[k] for r in found) / min(r[k] for r in found) for k in ("median", "p10")}
        print(f"| {setting} | {spread['median']:.3f} | {spread['p10']:.3f} |")


if __name__ == "__main__":
    main()
