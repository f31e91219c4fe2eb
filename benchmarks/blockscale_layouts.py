"""Which layout of the per-token input scales FlashInfer's SM90 block-scaled FP8 GEMM reads.

    python benchmarks/blockscale_layouts.py     (on an SM90 GPU, with FlashInfer 0.7.2)

``flashinfer.gemm.fp8_blockscale_gemm_sm90`` documents its input scales as (M, K // 128).
For M = 1, 5, 77 and 128 it is called with the same scale values in four layouts (row-major,
M-major without padding, DeepGEMM's TMA-aligned M-major with M padded to a multiple of 4)
and with all-one scales, and each result is compared with the definition's reference (the
relative Frobenius error). Note [blockscale input scales] in definitions/gemm_fp8.fidef
records what it found.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import flashinfer_conformance as fc  # noqa: E402

NAME = "fp8_blockscale_gemm_sm90_n2112_k7168"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def tma_aligned(scale: torch.Tensor) -> torch.Tensor:
    m, blocks = scale.shape
    padded = scale.new_zeros(blocks, (m + 3) // 4 * 4)
    padded[:, :m] = scale.T
    return padded.T[:m]


def main() -> int:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("error: needs an SM90 GPU (H100, H200) and FlashInfer 0.7.2", file=sys.stderr)
        return 2
    from flashinfer.gemm import fp8_blockscale_gemm_sm90 as gemm

    ref = fc.solution(NAME)
    print("| M | row-major | M-major | M-major, M padded to 4 | all-one scales |")
    print("|---|---|---|---|---|")
    for m in (1, 5, 77, 128):
        x = fc._inputs(NAME, 281, M=m)
        a, w, scale, w_scale = x["input"], x["weight"], x["input_scale"], x["weight_scale"]
        want = ref(input=a, weight=w, input_scale=scale, weight_scale=w_scale)
        ones = torch.ones_like(scale)
        want_ones = ref(input=a, weight=w, input_scale=ones, weight_scale=w_scale)
        errors = [
            rel(gemm(a, w, laid_out, w_scale), want)
            for laid_out in (scale, scale.T.contiguous().T, tma_aligned(scale))
        ]
        errors.append(rel(gemm(a, w, ones, w_scale), want_ones))
        print(f"| {m} | " + " | ".join(f"{e:.3g}" for e in errors) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
