"""Whether a process's host speed follows the CPU it runs on: pinned and unpinned processes.

    python benchmarks/host_speed.py [--free 8] [--per-cpu 2] [--cpus 0-15] [--no-aslr 4]

Needs a CUDA GPU. Each row is a fresh process that times a bare CUDA ``torch.empty`` (host
work only: the caching allocator) and a pure-Python loop, and says which CPU it ran on. Run
unpinned (``--free``), pinned to each CPU of ``--cpus`` in turn (``--per-cpu`` processes
each, through ``os.sched_setaffinity`` before torch is imported) and unpinned with address
space randomisation off (``--no-aslr``, through ``setarch -R``). If a process's speed is set
by its CPU, the pinned rows of one CPU agree with each other and the unpinned rows match the
CPU they landed on; if it is set by something else (the layout of the address space, say),
pinned rows of one CPU still differ.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time


def _cpu_now() -> int:
    # Field 39 of /proc/self/stat: the CPU the process last ran on.
    with open("/proc/self/stat") as f:
        text = f.read()
    return int(text[text.rindex(")") + 2 :].split()[36])


def _node(cpu: int) -> int:
    base = f"/sys/devices/system/cpu/cpu{cpu}"
    try:
        return next(int(n[4:]) for n in os.listdir(base) if n.startswith("node"))
    except (OSError, StopIteration):
        return -1


def _per_call(fn, calls: int) -> float:
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(best)


def child(pin: int | None) -> dict:
    if pin is not None:
        os.sched_setaffinity(0, {pin})
    import torch

    torch.empty(1, device="cuda")
    torch.cuda.synchronize()

    def empty():
        torch.empty((1, 4096), device="cuda", dtype=torch.bfloat16)

    def loop():
        s = 0
        for i in range(100):
            s += i
        return s

    _per_call(empty, 20000)  # settle
    row = {
        "empty_us": round(_per_call(empty, 20000), 2),
        "loop_us": round(_per_call(loop, 20000), 3),
        "cpu": _cpu_now(),
    }
    row["node"] = _node(row["cpu"])
    row["affinity"] = len(os.sched_getaffinity(0))
    return row


def _spawn(label: str, pin: int | None, prefix: list[str]) -> dict:
    argv = prefix + [sys.executable, __file__, "--child"]
    if pin is not None:
        argv += ["--pin", str(pin)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    row["run"] = label
    return row


def _cpus(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--pin", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--free", type=int, default=8)
    p.add_argument("--per-cpu", type=int, default=2)
    p.add_argument("--cpus", default=f"0-{os.cpu_count() - 1}")
    p.add_argument("--no-aslr", type=int, default=4)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.pin)))
        return
    rows = [_spawn("free", None, []) for _ in range(a.free)]
    for cpu in _cpus(a.cpus):
        rows += [_spawn(f"pin {cpu}", cpu, []) for _ in range(a.per_cpu)]
    setarch = shutil.which("setarch")
    if setarch:
        rows += [_spawn("no-aslr", None, [setarch, "-R"]) for _ in range(a.no_aslr)]
    else:
        print("setarch not found: no rows with address space randomisation off")
    print("| process | ran on CPU (node) | torch.empty µs | Python loop µs |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['cpu']} ({r['node']}) | {r['empty_us']} | {r['loop_us']} |")


if __name__ == "__main__":
    main()
