"""Why fibgen's timer flushes L2 by reading: the evidence behind Note [flushing L2].

    python benchmarks/l2_flush.py

On one GPU (torch and triton only), three tables:

1. A plain device-to-device copy of 32 MB and 128 MB, timed after each flush, as a share of
   a 1 GiB copy's bandwidth: what any kernel of that size can reach under that flush.
2. Cache hints on the rmsnorm kernel (hidden 4096, bf16) under the zeroing flush: whether a
   kernel can avoid paying for the flush's dirty lines by how it loads and stores.
3. Twelve rounds of the median of a few-µs kernel under each flush, next to a
   compute-bound spin kernel whose time follows the SM clock: whether the jumps between
   rounds come from the clock or from the flush.

``triton.testing.do_bench`` flushes by zeroing; its numbers equal fibgen's ``flush="zero"``
(see the last table of ``benchmarks/gpu.py``).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fibgen.bench.timing import time_cuda  # noqa: E402

HIDDEN = 4096


@triton.jit
def _norm(
    x_ptr,
    w_ptr,
    o_ptr,
    n_cols,
    eps,
    BLOCK_N: tl.constexpr,
    LOAD_POLICY: tl.constexpr,
    LOAD_CACHE: tl.constexpr,
    STORE_POLICY: tl.constexpr,
    STORE_CACHE: tl.constexpr,
):
    # One row per program, as the shipped kernel runs at hidden 4096.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < n_cols
    x = tl.load(
        x_ptr + row * n_cols + cols,
        mask=ok,
        other=0.0,
        eviction_policy=LOAD_POLICY,
        cache_modifier=LOAD_CACHE,
    ).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
    y = (x * inv_rms * w).to(o_ptr.dtype.element_ty)
    tl.store(
        o_ptr + row * n_cols + cols,
        y,
        mask=ok,
        eviction_policy=STORE_POLICY,
        cache_modifier=STORE_CACHE,
    )


@triton.jit
def _spin(o_ptr, n, a, b):
    x = tl.program_id(0).to(tl.float32)
    for _ in range(n):
        x = x * a + b
    tl.store(o_ptr, x)


# name -> (load eviction policy, load cache modifier, store eviction policy, store modifier)
HINTS = {
    "shipped: loads evict_first": ("evict_first", "", "", ""),
    "stores evict_first": ("evict_first", "", "evict_first", ""),
    "stores .cs (streaming)": ("evict_first", "", "", ".cs"),
    "stores .wt (write-through)": ("evict_first", "", "", ".wt"),
    "stores .cg": ("evict_first", "", "", ".cg"),
    "loads .cg, stores evict_first": ("", ".cg", "evict_first", ""),
    "loads .cv (no cache)": ("", ".cv", "", ""),
    "loads .cv, stores .wt": ("", ".cv", "", ".wt"),
}


def norm(x, w, out, hints=HINTS["shipped: loads evict_first"]):
    """The rmsnorm kernel with the given cache hints."""
    load_policy, load_cache, store_policy, store_cache = hints
    _norm[(x.shape[0],)](
        x,
        w,
        out,
        x.shape[1],
        1e-6,
        BLOCK_N=triton.next_power_of_2(x.shape[1]),
        LOAD_POLICY=load_policy,
        LOAD_CACHE=load_cache,
        STORE_POLICY=store_policy,
        STORE_CACHE=store_cache,
        num_warps=16,
    )


def main() -> None:
    """Print the three tables."""
    torch.manual_seed(0)
    print(
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}"
    )
    big = torch.randn(1 << 28, device="cuda")
    big_out = torch.empty_like(big)
    copy_ms = time_cuda(lambda: big_out.copy_(big), warmup=5, repeat=30, flush="none")
    copy_gbs = 2 * big.numel() * 4 / copy_ms / 1e6
    del big, big_out
    print(f"device-to-device copy (1 GiB, read + write): {copy_gbs:.0f} GB/s")

    print("\n## A plain copy after each flush\n")
    print("| bytes moved | µs, zeroing flush | % of copy | µs, reading flush | % of copy |")
    print("|---|---|---|---|---|")
    for mib in (32, 128):
        src = torch.randn(mib << 18, device="cuda")
        dst = torch.empty_like(src)
        moved = 2 * src.numel() * 4
        zero = time_cuda(lambda: dst.copy_(src), flush="zero")
        read = time_cuda(lambda: dst.copy_(src), flush="read")
        print(
            f"| {moved >> 20} MiB | {zero * 1e3:.2f} | {100 * moved / zero / 1e6 / copy_gbs:.1f}% "
            f"| {read * 1e3:.2f} | {100 * moved / read / 1e6 / copy_gbs:.1f}% |"
        )
        del src, dst

    print("\n## Cache hints under the zeroing flush (rmsnorm, hidden 4096, bf16)\n")
    print("| rows | variant | µs, zeroing flush | % of copy | µs, reading flush | % of copy |")
    print("|---|---|---|---|---|---|")
    for rows in (4096, 16384):
        x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(x)
        moved = 2 * x.numel() * 2
        expected = None
        for name, hints in HINTS.items():
            out.fill_(float("nan"))
            try:
                norm(x, w, out, hints)
                torch.cuda.synchronize()
            except Exception as exc:  # ptxas refuses some combinations
                print(f"| {rows} | {name} | not compiled: {str(exc).splitlines()[-1][:80]} | | | |")
                continue
            if expected is None:
                expected = out.clone()
            # A hint changes where data is cached, never the result.
            assert torch.equal(out, expected), name
            zero = time_cuda(lambda: norm(x, w, out, hints), flush="zero")
            read = time_cuda(lambda: norm(x, w, out, hints), flush="read")
            print(
                f"| {rows} | {name} | {zero * 1e3:.2f} "
                f"| {100 * moved / zero / 1e6 / copy_gbs:.1f}% | {read * 1e3:.2f} "
                f"| {100 * moved / read / 1e6 / copy_gbs:.1f}% |"
            )
        del x, w, out

    print("\n## Rounds: medians of rmsnorm at 16 and 1024 rows, and the SM clock\n")
    print(
        "| round | spin kernel µs | 16 rows, zeroing | 16 rows, reading | 1024 rows, zeroing | 1024 rows, reading |"
    )
    print("|---|---|---|---|---|---|")
    sink = torch.empty(1, device="cuda")
    cases = {}
    for rows in (16, 1024):
        x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(x)
        cases[rows] = lambda x=x, w=w, out=out: norm(x, w, out)
    columns: dict[str, list[float]] = {}
    for round_ in range(12):
        spin = time_cuda(lambda: _spin[(1,)](sink, 20000, 0.999, 0.001), repeat=20, flush="none")
        row = {"spin": spin}
        for rows, fn in cases.items():
            row[f"{rows} zero"] = time_cuda(fn, flush="zero")
            row[f"{rows} read"] = time_cuda(fn, flush="read")
        for key, value in row.items():
            columns.setdefault(key, []).append(value)
        print(f"| {round_} | " + " | ".join(f"{v * 1e3:.2f}" for v in row.values()) + " |")
    spread = {k: max(v) / min(v) - 1 for k, v in columns.items()}
    print(
        "| largest / smallest | " + " | ".join(f"+{100 * spread[k]:.1f}%" for k in columns) + " |"
    )
    print(f"\nmedian of the spin kernel: {statistics.median(columns['spin']) * 1e3:.2f} µs")


if __name__ == "__main__":
    main()
