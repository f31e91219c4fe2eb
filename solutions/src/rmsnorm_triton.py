"""RMSNorm in Triton: fp32 accumulation, several rows per program when rows are short."""

import torch
import triton
import triton.language as tl

EPS = 1e-6


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    o_ptr,
    n_rows,
    n_cols,
    stride_x,
    stride_r,
    stride_o,
    eps,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    # 64-bit row offsets: 65536 rows of 7168 elements overflow int32.
    rows = rows.to(tl.int64)
    x = tl.load(
        x_ptr + rows[:, None] * stride_x + cols[None, :],
        mask=mask,
        other=0.0,
        eviction_policy="evict_first",
    ).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(
            r_ptr + rows[:, None] * stride_r + cols[None, :],
            mask=mask,
            other=0.0,
            eviction_policy="evict_first",
        ).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    # The weight is read by every program: keep it in L2.
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0, eviction_policy="evict_last")
    y = x * inv_rms[:, None] * w.to(tl.float32)[None, :]
    tl.store(
        o_ptr + rows[:, None] * stride_o + cols[None, :], y.to(o_ptr.dtype.element_ty), mask=mask
    )


def config(n_rows, n_cols):
    """(rows per program, warps per program) for a problem size."""
    block = triton.next_power_of_2(n_cols)
    # Measured on an H100 (benchmarks/gpu.md): about 1024 elements per program at most 4 warps
    # for short rows (several rows per program), one row per program with 8 to 16 warps for
    # long ones.
    rows = max(1, min(1024 // block, triton.next_power_of_2(n_rows)))
    elements = rows * block
    warps = 4 if elements <= 1024 else 8 if elements <= 2048 else 16
    return rows, warps


def launch(x, residual, weight, out, rows_per_program=None, num_warps=None):
    """Normalize ``x`` (plus ``residual`` when given) into ``out``."""
    n_cols = x.shape[-1]
    x2 = x.reshape(-1, n_cols)
    o2 = out.view(-1, n_cols)
    r2 = x2 if residual is None else residual.reshape(-1, n_cols)
    n_rows = x2.shape[0]
    if n_rows == 0:
        return out
    rows, warps = config(n_rows, n_cols)
    rows = rows_per_program or rows
    warps = num_warps or warps
    _rmsnorm_kernel[(triton.cdiv(n_rows, rows),)](
        x2,
        r2,
        weight,
        o2,
        n_rows,
        n_cols,
        x2.stride(0),
        r2.stride(0),
        o2.stride(0),
        EPS,
        BLOCK_N=triton.next_power_of_2(n_cols),
        ROWS=rows,
        HAS_RESIDUAL=residual is not None,
        num_warps=warps,
    )
    return out
