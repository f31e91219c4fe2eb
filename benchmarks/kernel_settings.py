"""Kernel variants of silu_and_mul, rmsnorm and fused_add_rmsnorm against FlashInfer's.

    python benchmarks/kernel_settings.py [--rows 1024 4096 65536] [--all]

From about 1,024 rows a routed call costs what its kernel costs (the launch is replayed, see
``benchmarks/launch.py``), and inside a CUDA graph it does at every size. For silu_and_mul
(hidden 14336), rmsnorm and fused_add_rmsnorm (hidden 4096, in place, as FlashInfer's), bf16,
this times FlashInfer's kernel, the shipped solution's
default launch and variants of it: launch settings (rows per program, block, warps) and
kernels that walk rows (one program per row, or a persistent grid of a few programs per SM).
Each candidate is captured in a CUDA graph of 20 back-to-back calls and the graph replayed:
GPU time per call with the host's launch taken out (``--eager``: an eager loop instead, where
a variant's launch through Python may cost more than its kernel at small sizes). FlashInfer
is also timed with ``enable_pdl=False``: by default it launches with programmatic dependent
launch on SM90 and later. Rounds alternate between the candidates; medians. Every variant's result
is checked against FlashInfer's first. Needs the real FlashInfer.
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
sys.path.insert(0, str(ROOT / "solutions" / "src"))

EPS = 1e-5
ROUNDS = 5
CALLS = 20  # calls per captured graph


@triton.jit
def _silu_rows_kernel(x_ptr, o_ptr, n_rows, n_cols, stride_x, stride_o, BLOCK: tl.constexpr):
    """Programs walk rows (a grid of n_rows programs, or fewer: a persistent grid)."""
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        base_x = x_ptr + tl.cast(row, tl.int64) * stride_x
        base_o = o_ptr + tl.cast(row, tl.int64) * stride_o
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            gate = tl.load(base_x + cols, mask=mask, other=0.0).to(tl.float32)
            up = tl.load(base_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
            y = gate / (1.0 + tl.exp(-gate)) * up
            tl.store(base_o + cols, y.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fused_rows_kernel(
    x_ptr, r_ptr, w_ptr, n_rows, n_cols, stride, eps, BLOCK_N: tl.constexpr, HINTS: tl.constexpr
):
    """In-place fused add + RMSNorm, programs walking rows (persistent when fewer than rows)."""
    cols = tl.arange(0, BLOCK_N)
    ok = cols < n_cols
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        offs = tl.cast(row, tl.int64) * stride + cols
        if HINTS:
            x = tl.load(x_ptr + offs, mask=ok, other=0.0, eviction_policy="evict_first")
            r = tl.load(r_ptr + offs, mask=ok, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(x_ptr + offs, mask=ok, other=0.0)
            r = tl.load(r_ptr + offs, mask=ok, other=0.0)
        s = x.to(tl.float32) + r.to(tl.float32)
        tl.store(r_ptr + offs, s.to(r_ptr.dtype.element_ty), mask=ok)
        inv = tl.rsqrt(tl.sum(s * s, axis=0) / n_cols + eps)
        tl.store(x_ptr + offs, (s * inv * w).to(x_ptr.dtype.element_ty), mask=ok)


def sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def silu_variants(silu_mod):
    """{label: call(x, out)} of every silu_and_mul variant tried."""
    variants = {"default": lambda x, out: silu_mod.launch(x, out)}
    for block, warps in ((1024, 8), (2048, 16), (4096, 8), (4096, 16)):
        variants[f"block {block}, {warps} warps"] = (
            lambda x, out, b=block, w=warps: silu_mod.launch(x, out, b, w)
        )

    def walk(x, out, block, warps, per_sm):
        n_rows, n = x.shape[0], out.shape[-1]
        grid = n_rows if per_sm is None else min(n_rows, per_sm * sms())
        _silu_rows_kernel[(grid,)](
            x, out, n_rows, n, x.stride(0), out.stride(0), BLOCK=block, num_warps=warps
        )

    for block, warps in ((2048, 8), (2048, 16), (4096, 16)):
        for per_sm in (None, 2, 4, 8):
            where = "one per row" if per_sm is None else f"{per_sm}/SM"
            variants[f"row walk {where}, block {block}, {warps} warps"] = (
                lambda x, out, b=block, w=warps, p=per_sm: walk(x, out, b, w, p)
            )
    return variants


def norm_variants(norm_mod):
    """{label: call(x, r, w)} of every fused_add_rmsnorm variant tried (in place)."""
    variants = {"default": lambda x, r, w: norm_mod.launch(x, r, w, x, EPS, sum_out=r)}
    for warps in (4, 8, 32):
        variants[f"1 row/program, {warps} warps"] = lambda x, r, w, n=warps: norm_mod.launch(
            x, r, w, x, EPS, 1, n, sum_out=r
        )

    def walk(x, r, w, warps, per_sm, hints):
        n_rows, n = x.shape
        grid = n_rows if per_sm is None else min(n_rows, per_sm * sms())
        _fused_rows_kernel[(grid,)](
            x,
            r,
            w,
            n_rows,
            n,
            x.stride(0),
            EPS,
            BLOCK_N=triton.next_power_of_2(n),
            HINTS=hints,
            num_warps=warps,
        )

    for warps in (8, 16):
        for per_sm in (None, 2, 4, 8):
            for hints in (True, False):
                where = "one per row" if per_sm is None else f"{per_sm}/SM"
                label = f"row walk {where}, {warps} warps{', evict_first' if hints else ''}"
                variants[label] = lambda x, r, w, n=warps, p=per_sm, h=hints: walk(x, r, w, n, p, h)
    return variants


def rmsnorm_variants(norm_mod):
    """{label: call(x, out, w)} of every rmsnorm variant tried."""
    variants = {"default": lambda x, out, w: norm_mod.launch(x, None, w, out, EPS)}
    for rows, warps in ((1, 4), (1, 8), (1, 16), (2, 4), (2, 8), (4, 8)):
        variants[f"{rows} row/program, {warps} warps"] = (
            lambda x, out, w, p=rows, n=warps: norm_mod.launch(x, None, w, out, EPS, p, n)
        )
    return variants


def graph_timer(fn):
    """A sampler of GPU µs per call of ``fn``: CALLS calls captured once, the graph replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def take() -> float:
        graph.replay()
        start.record()
        for _ in range(5):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / (5 * CALLS)

    return take


def eager_timer(fn):
    """A sampler of µs per call of ``fn`` in an eager loop (launch included, no graph)."""
    from fibgen.bench.eager import time_eager

    return lambda: time_eager(fn, rounds=3)


def table(title, own, variants, make, check):
    """Time ``own`` and every variant per row count in alternating rounds; print ratios."""
    print(f"\n## {title}\n")
    print(
        "| rows | FlashInfer µs | default µs | default / FlashInfer | best | best µs "
        "| best / FlashInfer |"
    )
    print("|---|---|---|---|---|---|---|")
    for rows in ARGS.rows:
        args = make(rows)
        check(args, own, variants)
        timer = eager_timer if ARGS.eager else graph_timer
        timers = {"own": timer(lambda: own(*args))}
        timers.update({name: timer(lambda fn=fn: fn(*args)) for name, fn in variants.items()})
        samples = {name: [] for name in timers}
        for _ in range(ROUNDS):
            for name, take in timers.items():
                samples[name].append(take())
        t = {name: statistics.median(v) for name, v in samples.items()}
        best = min(variants, key=t.get)
        print(
            f"| {rows} | {t['own']:.2f} | {t['default']:.2f} | {t['default'] / t['own']:.3f} "
            f"| {best} | {t[best]:.2f} | {t[best] / t['own']:.3f} |"
        )
        if ARGS.all:
            for name in variants:
                print(f"|  | | | | {name} | {t[name]:.2f} | {t[name] / t['own']:.3f} |")
        del timers, args
        torch.cuda.empty_cache()


def main() -> None:
    """Print both tables."""
    import flashinfer
    import rmsnorm_triton
    import silu_and_mul_triton

    hidden, inter = 4096, 14336
    print(
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"triton {triton.__version__}"
    )

    def make_silu(rows):
        x = torch.randn(rows, 2 * inter, device="cuda", dtype=torch.bfloat16)
        return x, torch.empty(rows, inter, device="cuda", dtype=torch.bfloat16)

    def own_silu(x, out):
        flashinfer.activation.silu_and_mul(x, out)

    def check_silu(args, own, variants):
        x, out = args
        own(x, out)
        want = out.clone()
        for name, fn in variants.items():
            out.fill_(float("nan"))
            fn(x, out)
            torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2, msg=name)

    # FlashInfer launches with programmatic dependent launch by default on SM90 and later
    # (enable_pdl=None): the next kernel may start while this one finishes. Timed without it
    # too, to see what it is worth.
    kind = "µs per call, eager loop" if ARGS.eager else "GPU µs per call, back to back"
    silu = silu_variants(silu_and_mul_triton)
    silu["FlashInfer, enable_pdl=False"] = lambda x, out: flashinfer.activation.silu_and_mul(
        x, out, enable_pdl=False
    )
    table(
        f"silu_and_mul, hidden {inter}, bf16 ({kind})",
        own_silu,
        silu,
        make_silu,
        check_silu,
    )

    def make_norm(rows):
        # In place, as the API is: x and r change at each call, their sizes do not.
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        r = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        return x, r, torch.randn(hidden, device="cuda", dtype=torch.bfloat16)

    def own_norm(x, r, w):
        flashinfer.norm.fused_add_rmsnorm(x, r, w, EPS)

    def check_norm(args, own, variants):
        x, r, w = args
        x0, r0 = x.clone(), r.clone()
        own(x, r, w)
        want_x, want_r = x.clone(), r.clone()
        for name, fn in variants.items():
            x.copy_(x0)
            r.copy_(r0)
            fn(x, r, w)
            torch.testing.assert_close(x, want_x, atol=3e-2, rtol=2e-2, msg=name)
            torch.testing.assert_close(r, want_r, atol=3e-2, rtol=2e-2, msg=name)

    def make_rms(rows):
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        return x, torch.empty_like(x), w

    def own_rms(x, out, w):
        flashinfer.norm.rmsnorm(x, w, EPS, out=out)

    def check_rms(args, own, variants):
        x, out, w = args
        own(x, out, w)
        want = out.clone()
        for name, fn in variants.items():
            out.fill_(float("nan"))
            fn(x, out, w)
            torch.testing.assert_close(out, want, atol=3e-2, rtol=2e-2, msg=name)

    rms = rmsnorm_variants(rmsnorm_triton)
    rms["FlashInfer, enable_pdl=False"] = lambda x, out, w: flashinfer.norm.rmsnorm(
        x, w, EPS, out=out, enable_pdl=False
    )
    table(f"rmsnorm, hidden {hidden}, bf16 ({kind})", own_rms, rms, make_rms, check_rms)

    norm = norm_variants(rmsnorm_triton)
    norm["FlashInfer, enable_pdl=False"] = lambda x, r, w: flashinfer.norm.fused_add_rmsnorm(
        x, r, w, EPS, enable_pdl=False
    )
    table(
        f"fused_add_rmsnorm, hidden {hidden}, bf16 ({kind}, in place)",
        own_norm,
        norm,
        make_norm,
        check_norm,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1024, 2048, 4096, 16384, 65536])
    parser.add_argument("--all", action="store_true", help="print every variant's time")
    parser.add_argument(
        "--eager", action="store_true", help="time an eager loop instead of graph replays"
    )
    ARGS = parser.parse_args()
    main()
