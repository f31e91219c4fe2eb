"""Build speed: cold build, no-op rebuild, scaling in the number of definitions, parse rate.

    python benchmarks/build.py [--dataset ../shared/flashinfer-trace] [--repeat 3]

Every build is a separate `fibgen build` process, so the times include interpreter start and
imports, as a user sees them. Prints one table; ratios are against the 156-definition build.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_build(src: Path, out: Path, cache: Path, *, fresh: bool = False) -> float:
    env = dict(os.environ, FIBGEN_CACHE_DIR=str(cache))
    if fresh:
        # Nothing reused from an earlier build: black formats every file again.
        shutil.rmtree(cache, ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "fibgen.cli", "build", str(src), "-o", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"build of {src} failed:\n{proc.stderr}")
    return elapsed


def cold(src: Path, work: Path, repeat: int, *, warm_cache: bool = False) -> float:
    """An empty output folder; with warm_cache, black's results of an earlier build reused."""
    times = []
    for i in range(repeat):
        out = work / f"cold{i}"
        shutil.rmtree(out, ignore_errors=True)
        cache = work / ("warm-cache" if warm_cache else "cache")
        if warm_cache and not cache.exists():
            run_build(src, work / "prime", cache)
        times.append(run_build(src, out, cache, fresh=not warm_cache))
    return statistics.median(times)


def noop(src: Path, work: Path, repeat: int) -> float:
    out = work / "noop"
    run_build(src, out, work / "cache")
    return statistics.median(run_build(src, out, work / "cache") for _ in range(repeat))


def synthetic(n_defs: int, folder: Path) -> Path:
    """A catalogue of `n_defs` definitions: families of 100 instances, each a small gemm."""
    folder.mkdir(parents=True, exist_ok=True)
    per_family = 100
    parts = []
    for f in range(max(1, n_defs // per_family)):
        rows = "\n".join(
            f"    n={f * per_family + i + 1} k={64 * (i % 7 + 1)}" for i in range(per_family)
        )
        parts.append(
            f"family gemm{f} {{\n  op_type gemm\n  axes {{\n    M : var\n    N : const n\n"
            f"    K : const k\n  }}\n  inputs {{\n    A : bfloat16[M, K]\n    B : bfloat16[N, K]\n"
            f'  }}\n  outputs {{\n    C : bfloat16[M, N]\n  }}\n  reference """\n'
            f'    def run(A, B):\n        return A @ B.T\n  """\n  instances {{\n{rows}\n  }}\n}}\n'
        )
    (folder / "synthetic.fidef").write_text("\n".join(parts))
    return folder


def parse_rate(src: Path, repeat: int) -> tuple[float, float]:
    """Lines and definitions per second of parse + lower + check, in process."""
    sys.path.insert(0, str(ROOT))
    from fibgen.compiler import compile_paths

    compile_paths([str(src)])  # warm: grammar tables and imports
    lines = sum(len(p.read_text().splitlines()) for p in src.rglob("*.fidef"))
    best = float("inf")
    n_defs = 0
    for _ in range(repeat):
        start = time.perf_counter()
        result = compile_paths([str(src)])
        best = min(best, time.perf_counter() - start)
        n_defs = len(result.module.definitions)
    return lines / best, n_defs / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "flashinfer-trace"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    # On the checkout's file system (build/ is ignored): where a user's generated/ lives.
    (ROOT / "build").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fibgen-bench-", dir=ROOT / "build"))
    try:
        imported = work / "imported"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "fibgen.cli",
                "import",
                str(Path(args.dataset) / "definitions"),
                "-o",
                str(imported),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"import failed (is the dataset at {args.dataset}?):\n{proc.stderr}")
        rows = []
        base = cold(imported, work, args.repeat)
        rows.append(("cold build, imported dataset (156 defs)", base, "<= 2.0 s"))
        rows.append(
            ("same, black's results cached", cold(imported, work, args.repeat, warm_cache=True), "")
        )
        rows.append(
            ("no-op rebuild, imported dataset", noop(imported, work, args.repeat), "<= 0.5 s")
        )
        rows.append(
            (
                "cold build, catalogue (definitions/)",
                cold(ROOT / "definitions", work, args.repeat),
                "",
            )
        )
        for n in (1000, 5000, 10000):
            src = synthetic(n, work / f"syn{n}")
            rows.append(
                (
                    f"cold build, {n} synthetic defs",
                    cold(src, work, 1),
                    "<= 60 s" if n == 10000 else "",
                )
            )
        lines_s, defs_s = parse_rate(imported, args.repeat)
        print(f"{'case':<42} {'seconds':>9} {'x 156-def build':>16}  target")
        for name, secs, target in rows:
            print(f"{name:<42} {secs:>9.3f} {secs / base:>16.2f}  {target}")
        print(
            f"{'parse+check rate, imported dataset':<42} {lines_s:>9.0f} lines/s, "
            f"{defs_s:.0f} definitions/s"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
