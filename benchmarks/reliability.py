"""Reliability trials: what bench and the tracer lose when killed, and stats under threads.

Run from the repository root (each prints its figures; exit 1 when a trial lost anything):

    python benchmarks/reliability.py kill-resume [--trials 7] [--kills 3] [--seed 0]
    python benchmarks/reliability.py tracer-sigterm [--trials 5] [--seconds 2]
    python benchmarks/reliability.py threads [--trials 5] [--threads 8] [--calls 10000]

* kill-resume: a dataset of 30 workloads x 3 solutions is benchmarked by `fibgen bench`,
  which is killed with SIGKILL mid-run (once a random number of traces is written, plus a
  random delay), `--kills` times in a row (each restart with `--resume`), then run to the
  end with `--resume`. Every (workload, solution) must
  then have exactly one trace, every trace line must parse, no temporary file may be left,
  and no worker or resource tracker of a killed run may be alive 3 s after its kill.
* tracer-sigterm: a process calls a traced dispatcher in a loop (dump policy none, every
  call kept) and counts its calls in a shared file; it gets SIGTERM after a random time in
  `[seconds/2, seconds]`. Records lost = calls counted - workload lines written (a call
  interrupted between its record and its count is one line more, not a loss).
* threads: `--threads` threads each make `--calls` routed calls (half hit a registered
  solution, half miss) with apply on, then the same with tracing on; stats() and
  tracing_stats() must count every call exactly.

Not part of the test suite: the kills take minutes. tests/ holds the quick versions.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# Run as a script, sys.path[0] is benchmarks/, whose scripts would shadow modules of the same
# name (select.py shadows the standard library's).
sys.path[0] = str(ROOT)
sys.path.insert(1, str(TESTS))


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]), **extra)


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


# ---------------------------------------------------------------------------------------
# kill -9 and --resume


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _dataset(root: Path) -> set[tuple[str, str]]:
    """30 workloads x 3 solutions; the (workload uuid, solution) pairs a full run traces."""
    from _bench_dataset import make_dataset

    sizes = tuple(range(1, 31))
    names = ["good_returns", "good_dps", "slow_returns"]
    make_dataset(root, names, sizes=sizes)
    return {(f"n{n}", s) for n in sizes for s in names}


def _bench(root: Path, cache: Path, resume: bool) -> subprocess.Popen:
    argv = [sys.executable, "-m", "fibgen.cli", "bench", str(root), "--devices", "cpu"]
    argv += ["--quiet", "--warmup", "1", "--repeat", "3"] + (["--resume"] if resume else [])
    return subprocess.Popen(
        argv,
        env=_env(FIBGEN_CACHE_DIR=str(cache)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_resume(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    problems = 0
    totals = {"kills": 0, "traces": 0, "lost": 0, "duplicated": 0, "survivors": 0}
    for trial in range(args.trials):
        with tempfile.TemporaryDirectory(prefix="fibgen-kill-resume-") as tmp:
            root, cache = Path(tmp) / "ds", Path(tmp) / "cache"
            expected = _dataset(root)
            traces = root / "traces" / "scale" / "scale_h64.jsonl"
            survivors = 0
            at_kill = []  # traces on disk after each kill: a kill mid-run leaves some
            for kill in range(args.kills):
                done = _lines(traces)
                bench = _bench(root, cache, resume=kill > 0)
                # Mid-run: once a random number of further traces is on disk, then a random
                # moment later (inside the next workload's runs, or between them).
                low = min(done + 1, len(expected))
                target = rng.randint(low, max(low, len(expected) - 1))
                deadline = time.monotonic() + 300
                while (
                    _lines(traces) < target and bench.poll() is None and time.monotonic() < deadline
                ):
                    time.sleep(0.02)
                time.sleep(rng.uniform(0.0, 0.2))
                children = _children(bench.pid)
                bench.kill()
                bench.wait()
                totals["kills"] += 1
                deadline = time.monotonic() + 3.0
                while time.monotonic() < deadline and any(_alive(p) for p in children):
                    time.sleep(0.05)
                at_kill.append(_lines(traces))
                left = [p for p in children if _alive(p)]
                survivors += len(left)
                for pid in left:
                    os.kill(pid, signal.SIGKILL)
            final = _bench(root, cache, resume=True)
            _, err = final.communicate(timeout=600)
            seen: list[tuple[str, str]] = []
            bad_lines = 0
            for line in traces.read_text().splitlines() if traces.exists() else []:
                try:
                    record = json.loads(line)
                    seen.append((record["workload"]["uuid"], record["solution"]))
                except (ValueError, KeyError, TypeError):
                    bad_lines += 1
            lost = len(expected - set(seen))
            duplicated = len(seen) - len(set(seen))
            temps = [p for p in root.rglob("*") if p.name.endswith(".tmp")]
            ok = not (lost or duplicated or bad_lines or temps or survivors or final.returncode)
            problems += not ok
            totals["traces"] += len(seen)
            totals["lost"] += lost
            totals["duplicated"] += duplicated
            totals["survivors"] += survivors
            print(
                f"trial {trial + 1}: killed with {at_kill} traces on disk, final run exit "
                f"{final.returncode}; "
                f"{len(seen)} traces for {len(expected)} runs: lost {lost}, duplicated "
                f"{duplicated}, bad lines {bad_lines}, temp files {len(temps)}, processes alive "
                f"3 s after a kill {survivors}" + ("" if ok else f"  <-- {err.strip()[-300:]}"),
                flush=True,
            )
    print(
        f"{args.trials} trials, {totals['kills']} kills (SIGKILL) then --resume: "
        f"{totals['traces']} traces, lost {totals['lost']}, duplicated {totals['duplicated']}, "
        f"workers or trackers alive 3 s after a kill {totals['survivors']}"
    )
    return 1 if problems else 0


# ---------------------------------------------------------------------------------------
# SIGTERM and the tracer

_TRACED = """
import mmap, struct, sys
import torch
from fake_flashinfer.catalogue import generated_package
generated_package()
import fibgen.runtime as rt
from fake_kernels import rmsnorm

with open(sys.argv[2], "r+b") as f:
    counter = mmap.mmap(f.fileno(), 8)
rt.enable_tracing(sys.argv[1], max_pending_records=10**8, max_pending_bytes=1 << 34)
x, w = torch.randn(3, 4096), torch.randn(4096)
rmsnorm.rmsnorm(x, w)
counter[:8] = struct.pack("<q", 1)
print("ready", flush=True)
n = 1
while True:
    rmsnorm.rmsnorm(x, w)
    n += 1
    counter[:8] = struct.pack("<q", n)
"""


def tracer_sigterm(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    calls = records = lost = 0
    for trial in range(args.trials):
        with tempfile.TemporaryDirectory(prefix="fibgen-tracer-sigterm-") as tmp:
            dataset, count_file = Path(tmp) / "ds", Path(tmp) / "count"
            count_file.write_bytes(b"\0" * 8)
            child = subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(_TRACED), str(dataset), str(count_file)],
                env=_env(),
                stdout=subprocess.PIPE,
                text=True,
            )
            assert child.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(args.seconds / 2, args.seconds))
            child.send_signal(signal.SIGTERM)
            code = child.wait(timeout=120)
            with (
                open(count_file, "rb") as f,
                mmap.mmap(f.fileno(), 8, access=mmap.ACCESS_READ) as m,
            ):
                counted = struct.unpack("<q", m[:8])[0]
            lines = 0
            for path in (dataset / "workloads").rglob("*.jsonl"):
                lines += sum(1 for line in path.read_text().splitlines() if line.strip())
            trial_lost = max(0, counted - lines)
            calls += counted
            records += lines
            lost += trial_lost
            print(
                f"trial {trial + 1}: exit {code}, {counted} calls counted, {lines} records "
                f"written, lost {trial_lost}",
                flush=True,
            )
    print(f"{args.trials} SIGTERM trials: {calls} calls, {records} records, {lost} lost")
    return 1 if lost else 0


# ---------------------------------------------------------------------------------------
# Stats under threads


def threads(args: argparse.Namespace) -> int:
    import warnings

    import torch
    from fake_flashinfer.catalogue import generated_package

    generated_package()
    import fibgen.runtime as rt
    from fake_kernels import rmsnorm

    x, w = torch.randn(1, 4096), torch.randn(4096)
    x2, w2 = torch.randn(1, 2048), torch.randn(2048)
    label = "fake_flashinfer.norm.rmsnorm"
    wrong = 0

    def run(n_threads: int, calls: int) -> None:
        start = threading.Barrier(n_threads)

        def work(i: int) -> None:
            start.wait()
            for _ in range(calls):
                if i % 2:
                    rmsnorm.rmsnorm(x, w)  # a hit: rmsnorm_h4096 has a solution
                else:
                    rmsnorm.rmsnorm(x2, w2)  # a miss: rmsnorm_h2048 has none

        pool = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()

    half = args.threads // 2 * args.calls
    for trial in range(args.trials):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rt.enable_apply({"rmsnorm_h4096": lambda hidden_states, weight: hidden_states})
            run(args.threads, args.calls)
            counts = rt.stats()[label]
            rt.disable_apply()
        apply_ok = counts["hit"] == half and counts["fallback_no_candidate"] == half
        with tempfile.TemporaryDirectory(prefix="fibgen-threads-") as tmp:
            rt.enable_tracing(tmp, max_pending_records=10**8)
            run(args.threads, args.calls)
            rt.disable_tracing()
            stats = rt.tracing_stats()
        total = args.threads * args.calls
        tracing_ok = stats["recorded"] == total and stats["written"] == total
        wrong += not (apply_ok and tracing_ok)
        print(
            f"trial {trial + 1}: apply hit {counts['hit']} / miss "
            f"{counts['fallback_no_candidate']} of {half} each; tracing recorded "
            f"{stats['recorded']}, written {stats['written']} of {total}",
            flush=True,
        )
    print(
        f"{args.trials} trials of {args.threads} threads x {args.calls} calls: "
        f"{args.trials - wrong} exact, {wrong} not"
    )
    return 1 if wrong else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="trial", required=True)
    p = sub.add_parser("kill-resume")
    p.add_argument("--trials", type=int, default=7)
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=kill_resume)
    p = sub.add_parser("tracer-sigterm")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=tracer_sigterm)
    p = sub.add_parser("threads")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--calls", type=int, default=10_000)
    p.set_defaults(func=threads)
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
