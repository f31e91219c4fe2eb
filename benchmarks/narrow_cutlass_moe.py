"""Narrow FlashInfer's SM90 CUTLASS fused-MoE JIT module to unquantized bfloat16.

``python3 benchmarks/narrow_cutlass_moe.py FLASHINFER_DIR`` edits an unpacked FlashInfer
0.7.2 package (``FLASHINFER_DIR`` is its ``flashinfer/`` folder) so that the module
``cutlass_fused_moe`` builds on SM90 (``fused_moe_90``) holds what a bfloat16 call runs and
little else: its CUTLASS generator keeps the bfloat16 grouped GEMMs alone (the TMA
warp-specialized SM90 ones and the SM80 fused ones), and the module leaves out the MoE GEMM
runners of the other dtypes (``moe_gemm_kernels_<act>_<weight>.cu`` but ``bf16_bf16``). The
module then has 29 sources instead of 248 and builds in about six minutes on 32 cores; the
kernels of a bfloat16 call are generated and compiled as in the whole module. A call of
another dtype would find its runner's symbols missing (the module is loaded with lazy
binding): run only the unquantized cases against it (``flashinfer_conformance.py --only
cutlass_moe``). The package is edited in place: give it a copy, never the FlashInfer an
engine uses. Editing twice changes nothing. ``benchmarks/README.md`` ("CUTLASS MoE on an H200
host") has the run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

GENERATOR = "jit/gemm/cutlass/generate_kernels.py"
MODULE = "jit/fused_moe.py"
KEEP_ALL = "        return False  # All kernels have a public implementation\n"
KEEP_BF16 = (
    '        act = getattr(op, "act_type", getattr(op, "dtype", None))\n'
    '        weight = getattr(op, "weight_type", act)\n'
    "        return not (op.gemm_kind == GemmKind.Grouped and act == weight == DataType.bf16)\n"
)
OTHER_RUNNERS = re.compile(
    r"        jit_env\.FLASHINFER_CSRC_DIR\n"
    r'        / "nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_kernels_'
    r'(?!bf16_bf16)\w+\.cu",\n'
)


def main() -> int:
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / GENERATOR).is_file():
        print(
            f"usage: {sys.argv[0]} FLASHINFER_DIR (the folder holding {GENERATOR})", file=sys.stderr
        )
        return 2
    root = Path(sys.argv[1])
    generator, module = root / GENERATOR, root / MODULE
    gen_text = generator.read_text()
    narrowed_before = KEEP_BF16 in gen_text
    if KEEP_ALL not in gen_text and not narrowed_before:
        print(
            f"{generator}: no `should_skip` as FlashInfer 0.7.2 has it; nothing edited",
            file=sys.stderr,
        )
        return 1
    module_text, dropped = OTHER_RUNNERS.subn("", module.read_text())
    if dropped == 0 and not narrowed_before:
        # Another FlashInfer's source list: editing the generator alone would leave runners
        # whose instantiations are gone.
        print(
            f"{module}: no MoE GEMM runner sources as FlashInfer 0.7.2 lists them; nothing edited",
            file=sys.stderr,
        )
        return 1
    generator.write_text(gen_text.replace(KEEP_ALL, KEEP_BF16))
    module.write_text(module_text)
    print(f"narrowed: bfloat16 grouped GEMMs only; {dropped} MoE GEMM runners left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
