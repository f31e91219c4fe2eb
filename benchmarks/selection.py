"""Time enable_apply on a traced dataset: 200 definitions × 5 solutions × 10,000 traces.

    python benchmarks/selection.py

Half of the definitions have a different winner per var-axis key (keyed entries), half one
winner throughout. In a quarter of them one solution failed one workload, its errors written
as flashinfer-bench writes non-finite ones ("NaN"): it serves the keys where it passed only.
Cold: the table cache is removed first; warm: it is current. Nothing is built at enable
(prebuild 0), as the target asks. flashinfer-bench 0.1.2 on the same shape: 0.5 s warm,
6.6-7.9 s cold (COMPAT.md).
"""

from __future__ import annotations

import os
import sys

# This file shares its name with the stdlib module `select`, which torch imports: keep the
# file's own folder off the import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

DEFINITIONS, SOLUTIONS, WORKLOADS = 200, 5, 10  # 200 × 5 × 10 = 10,000 traces


def make(root: Path) -> None:
    """Write the synthetic dataset with plain JSON (its construction is not timed)."""
    for d in range(DEFINITIONS):
        name = f"op{d}_h64"
        definition = {
            "name": name,
            "op_type": "synthetic",
            "tags": [],
            "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 64}},
            "inputs": {"x": {"shape": ["n", "h"], "dtype": "float32"}},
            "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
            "reference": "def run(x):\n    return x\n",
        }
        path = root / "definitions" / "synthetic" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(definition, indent=2))
        lines = []
        for s in range(SOLUTIONS):
            solution = {
                "name": f"s{s}",
                "definition": name,
                "author": "bench",
                "spec": {
                    "language": "python",
                    "target_hardware": ["cpu"],
                    "entry_point": "main.py::run",
                    "destination_passing_style": False,
                },
                "sources": [{"path": "main.py", "content": "def run(x):\n    return x\n"}],
            }
            spath = root / "solutions" / "bench" / "synthetic" / name / f"s{s}.json"
            spath.parent.mkdir(parents=True, exist_ok=True)
            spath.write_text(json.dumps(solution, indent=2))
            for w in range(WORKLOADS):
                # Keyed definitions (even d): solution w % 5 wins workload w.
                latency = 1.0 + ((s - w) % SOLUTIONS if d % 2 == 0 else s) * 0.1
                evaluation = {
                    "status": "PASSED",
                    "environment": {"hardware": "cpu", "libs": {"torch": "2"}},
                    "timestamp": "2026-01-01T00:00:00",
                    "log": "",
                    "correctness": {"max_relative_error": 1e-3, "max_absolute_error": 1e-3},
                    "performance": {
                        "latency_ms": latency,
                        "reference_latency_ms": 3.0,
                        "speedup_factor": 3.0 / latency,
                    },
                }
                if d % 4 == 0 and s == 0 and w == WORKLOADS - 1:
                    # A partial solution: wrong on one workload, NaN in its output.
                    evaluation["status"] = "INCORRECT_NUMERICAL"
                    evaluation["correctness"] = {
                        "max_relative_error": "NaN",
                        "max_absolute_error": "NaN",
                    }
                    del evaluation["performance"]
                workload = {"uuid": f"w{w}", "axes": {"n": 2**w}, "inputs": {}}
                trace = {"definition": name, "workload": workload, "solution": f"s{s}"}
                lines.append(json.dumps({**trace, "evaluation": evaluation}))
        tpath = root / "traces" / "bench" / "synthetic" / f"{name}.jsonl"
        tpath.parent.mkdir(parents=True, exist_ok=True)
        tpath.write_text("\n".join(lines) + "\n")


def main() -> None:
    """Print cold and warm enable times."""
    tmp = Path(tempfile.mkdtemp(prefix="fibgen-select-"))
    os.environ["FIBGEN_CACHE_DIR"] = str(tmp / "cache")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from fibgen.runtime import disable_apply, enable_apply
    from fibgen.runtime.selection.best import entries

    root = tmp / "dataset"
    make(root)
    cache = tmp / "cache" / "select"
    # Wall time, and this process's CPU time, which a busy machine inflates far less.
    cold, warm, cold_cpu, warm_cpu = [], [], [], []
    with warnings.catch_warnings():
        # Said at every enable (the partial solutions) and disable (nothing was called).
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(5):
            shutil.rmtree(cache, ignore_errors=True)
            start, cpu = time.perf_counter(), time.process_time()
            enable_apply(root, packages=[])
            cold.append(time.perf_counter() - start)
            cold_cpu.append(time.process_time() - cpu)
            disable_apply()
            start, cpu = time.perf_counter(), time.process_time()
            enable_apply(root, packages=[])
            warm.append(time.perf_counter() - start)
            warm_cpu.append(time.process_time() - cpu)
            disable_apply()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        keyed = sum(1 for e in entries(root).values() if e.fn is not None)
    print(
        f"{DEFINITIONS} definitions × {SOLUTIONS} solutions × "
        f"{DEFINITIONS * SOLUTIONS * WORKLOADS} traces ({keyed} keyed definitions)"
    )
    for label, wall, cpu in (
        ("cold (no table cache)", cold, cold_cpu),
        ("warm (cache current) ", warm, warm_cpu),
    ):
        print(
            f"enable_apply {label}: median {statistics.median(wall) * 1e3:.1f} ms "
            f"(CPU {statistics.median(cpu) * 1e3:.1f} ms)"
        )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
