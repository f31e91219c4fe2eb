"""How much a routed call's eager figure moves from one process to the next, and why.

    python benchmarks/e2e_spread.py [--processes 4] [--rows 1,64] [--bench]

Needs a CUDA GPU (not FlashInfer). For the shipped Triton solutions of ``rmsnorm_h4096``,
``fused_add_rmsnorm_h4096`` and ``silu_and_mul_h14336_bf16``, each of ``--processes`` fresh
processes routes the API's call through the generated dispatcher (apply on, not patched),
waits for launch replay to settle, and times it in eager rounds (``fibgen/bench/eager.py``),
beside the solution called directly with its outputs given and a bare ``torch.empty``. With
each figure it prints the state of launch replay in that process (its table native or in
Python, layouts replayed, layouts called normally), so that a figure that differs between
processes can be told from one that differs in what ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HIDDEN, INTER, EPS = 4096, 14336, 1e-5
NAMES = {
    "rmsnorm": f"rmsnorm_h{HIDDEN}",
    "fused_add_rmsnorm": f"fused_add_rmsnorm_h{HIDDEN}",
    "silu_and_mul": f"silu_and_mul_h{INTER}_bf16",
}


def child(api: str, rows: int) -> dict:
    import torch

    sys.path[:0] = [str(ROOT), str(ROOT / "generated" / "python")]
    import fibgen.runtime as rt
    from fibgen.bench.eager import eager_rounds, per_call
    from fibgen.runtime.inputs import api_calls
    from fibgen.runtime.launch import replay
    from fibgen.runtime.selection.entries import LazySolution

    replayers: list = []
    init = replay.Replayer.__init__

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        replayers.append(self)

    replay.Replayer.__init__ = keep  # type: ignore[method-assign]
    name = NAMES[api]
    path = next((ROOT / "solutions").rglob(f"triton_{name}.json"))
    dispatcher = api_calls.api_for(name)
    assert dispatcher is not None, name
    width = 2 * INTER if api == "silu_and_mul" else HIDDEN
    x = torch.randn(rows, width, device="cuda").bfloat16()
    r = torch.randn(rows, HIDDEN, device="cuda").bfloat16()
    w = torch.randn(HIDDEN, device="cuda").bfloat16()
    fn = dispatcher.function
    call = {
        "rmsnorm": lambda: fn(x, w, EPS),
        "fused_add_rmsnorm": lambda: fn(x, r, w, EPS),
        "silu_and_mul": lambda: fn(x),
    }[api]
    rt.enable_apply({name: LazySolution(path)}, patch=False)
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    replay.wait_native(strict=True)
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    fns = {"routed": call, "empty": lambda: torch.empty(rows, HIDDEN, device="cuda")}
    eager_rounds(fns, rounds=3)
    costs = eager_rounds(fns, rounds=11)
    counts = rt.stats()
    rt.disable_apply()
    tables = [
        {
            "table": type(rp.table).__module__.rsplit(".", 1)[-1] + "." + type(rp.table).__name__,
            "replayed_layouts": rp.table.size(),
            "never": len(rp.never),
            "pending": len(rp.pending),
        }
        for rp in replayers
    ]
    return {
        "routed": statistics.median(per_call(c) for c in costs["routed"]),
        "empty": statistics.median(per_call(c) for c in costs["empty"]),
        "stats": {k: {n: v for n, v in c.items() if v} for k, c in counts.items()},
        "replay": tables,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rows", default="1,64")
    parser.add_argument("--bench", action="store_true", help="also run fibgen bench on them")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    print("| definition | rows | process | routed µs | torch.empty µs | replay |")
    print("|---|---|---|---|---|---|")
    for api, name in NAMES.items():
        for rows in map(int, args.rows.split(",")):
            for p in range(args.processes):
                done = subprocess.run(
                    [sys.executable, __file__, "--child", api, str(rows)],
                    capture_output=True,
                    text=True,
                )
                if done.returncode:
                    print(f"| {name} | {rows} | {p} | failed: {done.stderr[-2000:]} |")
                    continue
                got = json.loads(done.stdout.strip().splitlines()[-1])
                print(
                    f"| {name} | {rows} | {p} | {got['routed']:.2f} | {got['empty']:.2f} "
                    f"| {got['replay']} {got['stats']} |"
                )
    if args.bench:
        bench(args.rows)


def bench(rows: str) -> None:
    """``fibgen bench`` of the same solutions at the same rows: its e2e figures and notes."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp()) / "ds"
    for api, name in NAMES.items():
        axis = "num_tokens" if api == "silu_and_mul" else "batch_size"
        cli = [sys.executable, "-m", "fibgen.cli"]
        subprocess.run([*cli, "workloads", name, "--axes", f"{axis}={rows}", "-o", str(root)])
        source = next((ROOT / "solutions").rglob(f"triton_{name}.json"))
        target = root / source.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    subprocess.run(
        [sys.executable, "-m", "fibgen.cli", "bench", str(root), "--devices", "cuda:0"], check=False
    )
    print("\n| definition | axes | bench e2e µs | reference e2e µs | log |")
    print("|---|---|---|---|---|")
    for path in sorted((root / "traces").rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            t = json.loads(line)
            perf = t["evaluation"].get("performance") or {}
            e2e = perf.get("e2e_latency_ms")
            ref = perf.get("reference_e2e_latency_ms")
            print(
                f"| {t['definition']} | {t['workload']['axes']} "
                f"| {e2e * 1e3 if e2e else float('nan'):.2f} "
                f"| {ref * 1e3 if ref else float('nan'):.2f} | {t['evaluation']['log'][-300:]} |"
            )


if __name__ == "__main__":
    main()
