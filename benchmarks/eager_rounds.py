"""What a timed round of an eager loop costs beyond its calls (Note [eager rounds]).

    python benchmarks/eager_rounds.py

fused_add_rmsnorm, hidden 4096, bf16, in place, at 16,384 and 65,536 rows, on a CUDA GPU with
the real FlashInfer: FlashInfer's own call, the shipped Triton solution launched through its
Python (``launch``), the call routed by ``enable_apply`` through FlashInfer's patched API,
and a one-row-per-program kernel written here with programmatic dependent launch at its end
or at its start. Each is timed in rounds of 4 to 128 back-to-back calls from a synchronized
device (wall time per call), and in a CUDA graph of 20 calls. A round's time is
``fixed + calls x per_call``: the table fits both from the shortest and longest rounds, so
one sees what dividing a short round by its calls adds, and to whom. Seven rounds, the
candidates in a random order each time; medians. Then one call from an idle device, and the
synchronize after it.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "solutions" / "src"))

EPS = 1e-5
HIDDEN = 4096
INTER = 14336


@triton.jit
def _fused_row_kernel(
    x_ptr, r_ptr, w_ptr, n_cols, stride, eps, BLOCK_N: tl.constexpr, PDL: tl.constexpr
):
    """In-place fused add + RMSNorm, one row per program; PDL: 0 off, 1 trigger at the end,
    2 trigger at the start (after waiting for the kernel before)."""
    if PDL > 0:
        tl.extra.cuda.gdc_wait()
    if PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < n_cols
    offs = row * stride + cols
    x = tl.load(x_ptr + offs, mask=ok, other=0.0)
    r = tl.load(r_ptr + offs, mask=ok, other=0.0)
    s = x.to(tl.float32) + r.to(tl.float32)
    tl.store(r_ptr + offs, s.to(r_ptr.dtype.element_ty), mask=ok)
    inv = tl.rsqrt(tl.sum(s * s, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(x_ptr + offs, (s * inv * w).to(x_ptr.dtype.element_ty), mask=ok)
    if PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()


def row_kernel(pdl: int):
    """A call of ``_fused_row_kernel`` with 16 warps and the given PDL placement."""

    def call(x, r, w):
        _fused_row_kernel[(x.shape[0],)](
            x, r, w, HIDDEN, x.stride(0), EPS, BLOCK_N=4096, PDL=pdl, num_warps=16, launch_pdl=True
        )

    return call


def wall(fn, calls: int) -> float:
    """µs per call of ``calls`` back-to-back calls, from a synchronized device to the sync."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / calls


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("error: benchmarks/eager_rounds.py needs a CUDA GPU")
    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001
        sys.exit(f"error: benchmarks/eager_rounds.py compares with FlashInfer: {exc}")
    import rmsnorm_triton
    from _shipped import routes
    from kernel_settings import graph_timer  # 20 calls captured, the graph replayed

    import fibgen.runtime as rt

    print(torch.cuda.get_device_name(), f"torch {torch.__version__}, triton {triton.__version__}")
    own = flashinfer.norm.fused_add_rmsnorm
    candidates = {
        "FlashInfer": lambda x, r, w: own(x, r, w, EPS),
        "solution's launch": lambda x, r, w: rmsnorm_triton.launch(x, r, w, x, EPS, sum_out=r),
        "row kernel, PDL at end": row_kernel(1),
        "row kernel, PDL at start": row_kernel(2),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.enable_apply(
            {"fused_add_rmsnorm_h4096": routes(HIDDEN, INTER)["fused_add_rmsnorm_h4096"]}
        )
    try:
        candidates["routed"] = lambda x, r, w: flashinfer.norm.fused_add_rmsnorm(x, r, w, EPS)
        for rows, counts in ((16384, (8, 32, 128)), (65536, (4, 8, 32, 64))):
            x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
            r = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
            for fn in candidates.values():
                fn(x, r, w)
            torch.cuda.synchronize()
            graphs = {k: graph_timer(lambda fn=fn: fn(x, r, w)) for k, fn in candidates.items()}
            eager = {(k, n): [] for k in candidates for n in counts}
            graph = {k: [] for k in candidates}
            for _ in range(7):
                order = list(candidates)
                random.shuffle(order)
                for k in order:
                    graph[k].append(graphs[k]())
                    for n in counts:
                        eager[k, n].append(wall(lambda fn=candidates[k]: fn(x, r, w), n))
            med = {key: statistics.median(v) for key, v in eager.items()}
            print(f"\n{rows} rows: µs per call by calls per round; per call and fixed µs fitted")
            print(
                "| candidate | graph | "
                + " | ".join(f"{n} calls" for n in counts)
                + " | per call | fixed µs/round |"
            )
            print("|---|---|" + "---|" * len(counts) + "---|---|")
            for k in candidates:
                n1, n2 = counts[0], counts[-1]
                t1, t2 = med[k, n1] * n1, med[k, n2] * n2
                per_call = (t2 - t1) / (n2 - n1)
                print(
                    f"| {k} | {statistics.median(graph[k]):.2f} | "
                    + " | ".join(f"{med[k, n]:.2f}" for n in counts)
                    + f" | {per_call:.2f} | {t1 - per_call * n1:.1f} |"
                )
            del graphs, x, r, w
            torch.cuda.empty_cache()
        x = torch.randn(16384, HIDDEN, device="cuda", dtype=torch.bfloat16)
        r, w = x.clone(), x[0].clone()
        print("\none call from an idle device and its synchronize, 16384 rows (µs, median of 30)")
        for k, fn in candidates.items():
            print(
                f"| {k} | {statistics.median(wall(lambda: fn(x, r, w), 1) for _ in range(30)):.1f} "
                "|"
            )
    finally:
        rt.disable_apply()


if __name__ == "__main__":
    main()
