"""Write the shipped Solution JSON files from the kernel sources in ``src/``.

Run ``python solutions/pack.py`` after editing a file in ``src/``; a test checks that the
JSON files hold the current sources.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
AUTHOR = "fibgen"

RMSNORM_SIZES = (128, 512, 1536, 2048, 3072, 4096, 5120, 5376, 7168)
FUSED_ADD_SIZES = (2048, 3072, 4096, 5120, 5376, 7168)
SILU_SIZES = (12288, 14336, 18944)

_NORM_FILES = ("rmsnorm_triton.py",)


def _solutions() -> list[tuple[str, str, str, str, tuple[str, ...], str]]:
    """(op_type, definition, solution name, description, source files, entry point)."""
    out = []
    for h in RMSNORM_SIZES:
        out.append(
            (
                "rmsnorm",
                f"rmsnorm_h{h}",
                f"triton_rmsnorm_h{h}",
                "Triton RMSNorm: fp32 accumulation, rows grouped per program for short rows.",
                _NORM_FILES + ("rmsnorm_entry.py",),
                "rmsnorm_entry.py::run",
            )
        )
    for h in FUSED_ADD_SIZES:
        out.append(
            (
                "rmsnorm",
                f"fused_add_rmsnorm_h{h}",
                f"triton_fused_add_rmsnorm_h{h}",
                "Triton fused residual add and RMSNorm in one pass, fp32 accumulation.",
                _NORM_FILES + ("fused_add_rmsnorm_entry.py",),
                "fused_add_rmsnorm_entry.py::run",
            )
        )
    for h in SILU_SIZES:
        for dtype in ("bf16", "fp16"):
            out.append(
                (
                    "activation",
                    f"silu_and_mul_h{h}_{dtype}",
                    f"triton_silu_and_mul_h{h}_{dtype}",
                    "Triton silu(gate) * up, fp32 arithmetic.",
                    ("silu_and_mul_triton.py",),
                    "silu_and_mul_triton.py::run",
                )
            )
    return out


def render() -> dict[Path, str]:
    """Every shipped solution file and its JSON text."""
    files = {}
    for op_type, definition, name, description, sources, entry in _solutions():
        doc = {
            "name": name,
            "definition": definition,
            "author": AUTHOR,
            "description": description,
            "spec": {
                "language": "triton",
                "target_hardware": ["cuda"],
                "entry_point": entry,
                "dependencies": ["triton"],
                "destination_passing_style": True,
            },
            "sources": [
                {"path": s, "content": (HERE / "src" / s).read_text(encoding="utf-8")}
                for s in sources
            ],
        }
        path = HERE / AUTHOR / op_type / definition / f"{name}.json"
        files[path] = json.dumps(doc, indent=2) + "\n"
    return files


if __name__ == "__main__":
    for path, text in render().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(path.relative_to(HERE.parent))
