"""Time the compiler on inputs that once cost the square of their size.

    python benchmarks/compiler_scaling.py [--sizes 5000,10000,20000]

Each case is one `.fidef` whose size is one number (tests/_scaling.py builds them): a
constraint or a rule continued over N lines, N unknown keys on one instance line (N errors
quoting one long line), and one error at the end of a line of N characters. Each is compiled
and its diagnostics rendered, as `fibgen check` does, in this process; the best of 3, in
CPU seconds of this process (steadier than wall time on a shared machine), is printed with
the cost per unit of size, which stays flat when the work is linear. Not a test:
tests/test_scaling.py holds the same cases to linear growth by counting calls.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from _scaling import (  # noqa: E402
    constraint_over_lines,
    errors_on_one_line,
    one_error_on_a_long_line,
    rule_over_lines,
)

from fibgen.compiler import compile_sources  # noqa: E402
from fibgen.compiler.diagnostics import render_all  # noqa: E402

# (case, builder, unit of N, scale of the default sizes)
CASES = [
    ("constraint over N lines", constraint_over_lines, "lines", 1),
    ("rule over N lines", rule_over_lines, "lines", 1),
    ("N errors on one line", errors_on_one_line, "errors", 2),
    ("one error, line of N chars", one_error_on_a_long_line, "chars", 100),
]


def run(text: str) -> tuple[float, int]:
    """CPU seconds to compile ``text`` and render its diagnostics (best of 3), and their
    count."""
    best, count = float("inf"), 0
    for _ in range(3):
        start = time.process_time()
        result = compile_sources([("f.fidef", "f.fidef", text)])
        render_all(result.diagnostics, result.sources)
        best = min(best, time.process_time() - start)
        count = len(result.diagnostics)
    return best, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="5000,10000,20000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    run(constraint_over_lines(8))  # load the grammar
    print(f"{'case':<28} {'N':>9} {'KB':>7} {'diags':>6} {'cpu s':>8} {'us per unit':>12}")
    for name, build, unit, scale in CASES:
        for size in sizes:
            n = size * scale
            text = build(n)
            seconds, count = run(text)
            per = f"{seconds / n * 1e6:.1f}/{unit[:-1]}"
            print(
                f"{name:<28} {n:>9,} {len(text) / 1024:>7.0f} {count:>6} "
                f"{seconds:>8.3f} {per:>12}"
            )


if __name__ == "__main__":
    main()
