"""Launch settings of the shipped fused_add_rmsnorm and silu_and_mul kernels against FlashInfer.

    python benchmarks/tune_eager.py [--rows 1024 4096 65536]

Where the GPU time decides (from about 1,024 rows), a routed call costs what its kernel costs.
For fused_add_rmsnorm (hidden 4096) and silu_and_mul (hidden 14336), bf16, this times in an
eager loop (``fibgen.bench.eager.time_eager``: back-to-back calls, no flush) FlashInfer's own
function, the solution's default pick and every variant of its launch settings (rows per
program and warps; block and warps; and for silu_and_mul a kernel that walks a whole row per
program), in interleaved rounds, and prints each variant's time over FlashInfer's. Every
variant's result is checked against FlashInfer's first. Needs the real FlashInfer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "solutions" / "src"))

from fibgen.bench.eager import time_eager  # noqa: E402

EPS = 1e-5
ROUNDS = 3


@triton.jit
def _silu_rows_kernel(x_ptr, o_ptr, n_cols, stride_x, stride_o, BLOCK: tl.constexpr):
    """One program per row, walking the row in blocks (FlashInfer's layout of the work)."""
    row = tl.program_id(0).to(tl.int64)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0)
        y = gate / (1.0 + tl.exp(-gate)) * up.to(tl.float32)
        tl.store(o_ptr + row * stride_o + cols, y.to(o_ptr.dtype.element_ty), mask=mask)


def silu_rows(x, out, block, warps):
    """Launch the row-walking variant."""
    n = out.shape[-1]
    _silu_rows_kernel[(x.shape[0],)](
        x, out, n, x.stride(0), out.stride(0), BLOCK=block, num_warps=warps
    )


def silu_variants(silu_mod):
    """{label: call(x, out)} of every silu_and_mul launch setting tried."""
    variants = {"default": lambda x, out: silu_mod.launch(x, out)}
    for block in (1024, 2048, 4096):
        for warps in (2, 4, 8, 16):
            if block // (32 * warps) < 2:
                continue
            variants[f"block {block}, {warps} warps"] = (
                lambda x, out, b=block, w=warps: silu_mod.launch(x, out, b, w)
            )
    for block in (1024, 2048, 4096):
        for warps in (4, 8, 16):
            variants[f"row walk, block {block}, {warps} warps"] = (
                lambda x, out, b=block, w=warps: silu_rows(x, out, b, w)
            )
    return variants


def norm_variants(norm_mod):
    """{label: call(x, r, w)} of every fused_add_rmsnorm launch setting tried (in place)."""
    variants = {"default": lambda x, r, w: norm_mod.launch(x, r, w, x, EPS, sum_out=r)}
    for rpp in (1, 2):
        for warps in (2, 4, 8, 16, 32):
            variants[f"{rpp} row(s)/program, {warps} warps"] = (
                lambda x, r, w, p=rpp, n=warps: norm_mod.launch(x, r, w, x, EPS, p, n, sum_out=r)
            )
    return variants


def table(title, own, variants, make, check):
    """Time ``own`` and every variant per row count, interleaved; print ratios to ``own``."""
    print(f"\n## {title}\n")
    print(
        "| rows | FlashInfer µs | default µs | default / FlashInfer | best | best µs | best / FlashInfer |"
    )
    print("|---|---|---|---|---|---|---|")
    for rows in ARGS.rows:
        args = make(rows)
        check(args, own, variants)
        samples = {name: [] for name in ("own", *variants)}
        for _ in range(ROUNDS):
            samples["own"].append(time_eager(lambda: own(*args()), rounds=3))
            for name, fn in variants.items():
                samples[name].append(time_eager(lambda fn=fn: fn(*args()), rounds=3))
        t = {name: statistics.median(v) for name, v in samples.items()}
        best = min(variants, key=t.get)
        print(
            f"| {rows} | {t['own']:.1f} | {t['default']:.1f} | {t['default'] / t['own']:.3f} "
            f"| {best} | {t[best]:.1f} | {t[best] / t['own']:.3f} |"
        )
        if ARGS.all:
            for name in variants:
                print(f"|  | | | | {name} | {t[name]:.1f} | {t[name] / t['own']:.3f} |")


def main() -> None:
    """Print both tables."""
    import flashinfer
    import rmsnorm_triton
    import silu_and_mul_triton

    from fibgen.runtime.launch import accelerate_modules

    for module in (rmsnorm_triton, silu_and_mul_triton, sys.modules[__name__]):
        accelerate_modules([module], module.__name__)
    hidden, inter = 4096, 14336
    print(
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}"
    )

    def make_silu(rows):
        x = torch.randn(rows, 2 * inter, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(rows, inter, device="cuda", dtype=torch.bfloat16)
        return lambda: (x, out)

    def own_silu(x, out):
        flashinfer.activation.silu_and_mul(x, out)

    def check_silu(args, own, variants):
        x, out = args()
        own(x, out)
        want = out.clone()
        for name, fn in variants.items():
            out.fill_(float("nan"))
            fn(x, out)
            torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2, msg=name)

    table(
        f"silu_and_mul, hidden {inter}, bf16 (µs per call, eager loop)",
        own_silu,
        silu_variants(silu_and_mul_triton),
        make_silu,
        check_silu,
    )

    def make_norm(rows):
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        r = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        # In place, as the API is: x and r change each call; sizes stay, so times hold.
        return lambda: (x, r, w)

    def own_norm(x, r, w):
        flashinfer.norm.fused_add_rmsnorm(x, r, w, EPS)

    def check_norm(args, own, variants):
        x0, r0, w = args()
        x0, r0 = x0.clone(), r0.clone()
        x, r = x0.clone(), r0.clone()
        own(x, r, w)
        want_x, want_r = x.clone(), r.clone()
        for name, fn in variants.items():
            x.copy_(x0)
            r.copy_(r0)
            fn(x, r, w)
            torch.testing.assert_close(x, want_x, atol=3e-2, rtol=2e-2, msg=name)
            torch.testing.assert_close(r, want_r, atol=3e-2, rtol=2e-2, msg=name)

    table(
        f"fused_add_rmsnorm, hidden {hidden}, bf16 (µs per call, eager loop, in place)",
        own_norm,
        norm_variants(rmsnorm_triton),
        make_norm,
        check_norm,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1024, 2048, 4096, 16384, 65536])
    parser.add_argument("--all", action="store_true", help="print every variant's time")
    ARGS = parser.parse_args()
    main()
