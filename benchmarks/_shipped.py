"""The shipped solutions, for the GPU benchmarks: Solution models read from solutions/."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def shipped_solution(name: str):
    """The shipped Solution model called ``name`` (one JSON file per solution)."""
    from fibgen.format.models import Solution

    found = sorted((ROOT / "solutions").rglob(f"{name}.json"))
    if not found:
        sys.exit(f"error: no {name}.json under {ROOT / 'solutions'}")
    return Solution.model_validate_json(found[0].read_text(encoding="utf-8"))


def routes(hidden: int = 4096, inter: int = 14336) -> dict:
    """{definition: Solution} of the shipped Triton norm and activation solutions."""
    return {
        f"rmsnorm_h{hidden}": shipped_solution(f"triton_rmsnorm_h{hidden}"),
        f"fused_add_rmsnorm_h{hidden}": shipped_solution(f"triton_fused_add_rmsnorm_h{hidden}"),
        f"silu_and_mul_h{inter}_bf16": shipped_solution(f"triton_silu_and_mul_h{inter}_bf16"),
    }
