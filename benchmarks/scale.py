"""`fibgen report` and `fibgen validate` on large trace files: time and peak memory.

    python benchmarks/scale.py [--sizes 200,1000] [--baseline REF] [--per-definition]
                               [--commands report,validate] [--work build/scale] [--keep]

Writes a synthetic dataset per size (megabytes of traces; not committed, under ``--work``):
8 definitions, 10 solutions each, 50 workloads each, traced on 2 kinds of hardware, so
8,000 distinct (definition, solution, workload, hardware); the traces are runs of them over
and over (9 in 10 PASSED, the rest failing with a log) until they reach the size, in one
file (or, with ``--per-definition``, a file per definition, as bench writes them).
Every command is a separate process, timed from its start to its exit, its peak memory the
``ru_maxrss`` that ``wait4`` returns for it. With ``--baseline REF``, the fibgen of that git
revision (``git archive``) runs the same commands in the same run, and the table gives the
ratios; a baseline whose peak would be over half the memory available now (it held about
11 times the traces) is left out and said so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fibgen.format import (  # noqa: E402
    Definition,
    Solution,
    Trace,
    Workload,
    dump_trace_line,
    write_definition,
    write_solution,
    write_workloads,
)

DEFINITIONS, SOLUTIONS, WORKLOADS = 8, 10, 50
HARDWARE = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
# What the baseline (every trace held as a model) took per byte of traces, and a margin.
BASELINE_BYTES_PER_TRACE_BYTE = 12


def _definition(i: int) -> Definition:
    tensor = {"dtype": "bfloat16"}
    return Definition.model_validate(
        {
            "name": f"scale{i}_h4096",
            "op_type": "scale",
            "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 4096}},
            "inputs": {"x": {**tensor, "shape": ["n", "h"]}, "w": {**tensor, "shape": ["h"]}},
            "outputs": {"y": {**tensor, "shape": ["n", "h"]}},
            "reference": "def run(x, w):\n    return x * w\n",
        }
    )


def _solution(definition: str, j: int) -> Solution:
    return Solution.model_validate(
        {
            "name": f"{definition}_sol{j}",
            "definition": definition,
            "author": "bench",
            "spec": {
                "language": "python",
                "target_hardware": ["cuda"],
                "entry_point": "main.py::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": "main.py", "content": "def run(x, w):\n    return x * w\n"}],
        }
    )


def _workload(k: int) -> Workload:
    return Workload.model_validate(
        {
            "uuid": f"00000000-0000-4000-8000-{k:012d}",
            "axes": {"n": 1 + 7 * k},
            "inputs": {"x": {"type": "random"}, "w": {"type": "random"}},
        }
    )


def _trace_lines(definition: str) -> list[tuple[str, str]]:
    """Each key's trace line, split where its latency goes: (before it, after it)."""
    out = []
    for j in range(SOLUTIONS):
        for k in range(WORKLOADS):
            for hw in HARDWARE:
                passed = (j + k) % 10 != 0
                evaluation = {
                    "status": "PASSED" if passed else "RUNTIME_ERROR",
                    "environment": {
                        "hardware": hw,
                        "libs": {"torch": "2.13.0", "flashinfer": "0.7.2.post1", "cuda": "12.9"},
                    },
                    "timestamp": "2026-12-01T12:00:00.000000",
                    "log": "" if passed else "RuntimeError: CUDA error: an illegal memory access",
                }
                if passed:
                    evaluation["correctness"] = {
                        "max_relative_error": 1.5e-3,
                        "max_absolute_error": 7.8e-3,
                    }
                    evaluation["performance"] = {
                        "latency_ms": 12345.0,
                        "reference_latency_ms": 0.05,
                        "speedup_factor": 2.5,
                        "e2e_latency_ms": 0.031,
                        "reference_e2e_latency_ms": 0.062,
                    }
                trace = Trace.model_validate(
                    {
                        "definition": definition,
                        "solution": f"{definition}_sol{j}",
                        "workload": _workload(k).model_dump(),
                        "evaluation": evaluation,
                    }
                )
                line = dump_trace_line(trace)
                if passed:
                    before, after = line.split("12345.0", 1)
                    out.append((before, after))
                else:
                    out.append((line, ""))
    return out


def make_dataset(root: Path, megabytes: int, one_file: bool) -> tuple[int, int]:
    """A dataset whose trace files hold ``megabytes`` MB, in one file or in one per
    definition; (trace lines, bytes) written."""
    shutil.rmtree(root, ignore_errors=True)
    names = []
    for i in range(DEFINITIONS):
        defn = _definition(i)
        write_definition(root, defn)
        names.append(defn.name)
        for j in range(SOLUTIONS):
            write_solution(root, _solution(defn.name, j), defn.op_type)
        write_workloads(root, defn.op_type, defn.name, [_workload(k) for k in range(WORKLOADS)])
    templates = {name: _trace_lines(name) for name in names}
    target = megabytes * 1_000_000
    files = {}
    (root / "traces" / "scale").mkdir(parents=True, exist_ok=True)
    for name in names:
        # Readers take a record's definition from its content, not from its file's name.
        path = root / "traces" / "scale" / f"{'all' if one_file else name}.jsonl"
        files[name] = files.get(names[0]) if one_file and files else open(path, "w")
    written = lines = run = 0
    try:
        while written < target:
            # One run of every key: latencies that differ from run to run.
            for name in names:
                chunk = "".join(
                    (
                        f"{before}{0.02 + 1e-5 * ((run + n) % 97):.6f}{after}\n"
                        if after
                        else before + "\n"
                    )
                    for n, (before, after) in enumerate(templates[name])
                )
                files[name].write(chunk)
                written += len(chunk)
                lines += len(templates[name])
            run += 1
    finally:
        for f in set(files.values()):
            f.close()
    return lines, written


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def measure(pythonpath: Path, args: list[str]) -> tuple[float, float]:
    """(seconds, peak MiB) of one `fibgen` process with ``pythonpath`` first on the path."""
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fibgen.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=pythonpath,
    )
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"fibgen {' '.join(args)} exited {proc.returncode}:\n{stderr.decode()}")
    return elapsed, usage.ru_maxrss / 1024  # KiB on Linux


def current_tree(work: Path) -> Path:
    """A copy of this checkout's fibgen package under ``work``: edits made while the
    benchmark runs do not reach it."""
    out = work / "current"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(ROOT / "fibgen", out / "fibgen", ignore=shutil.ignore_patterns("__pycache__"))
    return out


def baseline_tree(ref: str, work: Path) -> Path:
    """The fibgen package of git revision ``ref``, unpacked under ``work``."""
    out = work / f"baseline-{ref.replace('/', '_')}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryFile() as f:
        subprocess.run(["git", "archive", ref, "fibgen"], cwd=ROOT, stdout=f, check=True)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(out, filter="data")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="200,1000", help="megabytes of traces, comma-separated")
    parser.add_argument("--baseline", help="a git revision to run beside this checkout")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "scale")
    parser.add_argument("--commands", default="report,validate", help="which to run")
    parser.add_argument("--keep", action="store_true", help="keep the datasets")
    parser.add_argument(
        "--per-definition",
        action="store_true",
        help="a trace file per definition, as bench writes them (default: one file of all)",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    current = current_tree(args.work)
    base = baseline_tree(args.baseline, args.work) if args.baseline else None
    commands = {"report": ["report", "{ds}", "--format", "json"], "validate": ["validate", "{ds}"]}
    commands = {name: commands[name] for name in args.commands.split(",")}
    header = ["traces", "lines", "command", "seconds", "peak MiB", "x traces"]
    if base is not None:
        header += ["before s", "before MiB", "x traces", "time ratio", "memory ratio"]
    rows = []
    for megabytes in (int(s) for s in args.sizes.split(",")):
        ds = args.work / f"ds{megabytes}"
        lines, size = make_dataset(ds, megabytes, one_file=not args.per_definition)
        for name, argv in commands.items():
            argv = [a.format(ds=ds) for a in argv]
            seconds, peak = measure(current, argv)
            row = [f"{size / 1e6:.0f} MB", f"{lines}", name, f"{seconds:.1f}", f"{peak:.0f}"]
            row.append(f"{peak * 2**20 / size:.2f}")
            if base is not None:
                if BASELINE_BYTES_PER_TRACE_BYTE * size > _available_bytes() / 2:
                    row += ["(not run: too little memory free)", "", "", "", ""]
                else:
                    before_s, before_mb = measure(base, argv)
                    row += [
                        f"{before_s:.1f}",
                        f"{before_mb:.0f}",
                        f"{before_mb * 2**20 / size:.2f}",
                        f"{before_s / seconds:.1f}x",
                        f"{before_mb / peak:.1f}x",
                    ]
            rows.append(row)
            print("  ".join(row), file=sys.stderr, flush=True)
        if not args.keep:
            shutil.rmtree(ds)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print(
            "  ".join(
                c.rjust(w) if i > 2 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
            ).rstrip()
        )


if __name__ == "__main__":
    main()
