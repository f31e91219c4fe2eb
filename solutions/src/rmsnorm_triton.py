"""RMSNorm in Triton: fp32 accumulation, several rows per program when rows are short."""

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    o_ptr,
    s_ptr,
    n_rows,
    n_cols,
    stride_x,
    stride_r,
    stride_o,
    stride_s,
    eps,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    STORE_SUM: tl.constexpr,
    WALK: tl.constexpr,
    EVICT: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        # Launched early (programmatic dependent launch): wait for the kernel before to finish
        # and its writes to show before reading anything.
        tl.extra.cuda.gdc_wait()
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    if WALK:
        # A persistent grid (see PERSISTENT): each program reads the weight once and walks
        # the rows, ROWS at a time, by the grid's size.
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0, eviction_policy="evict_last")
        w = w.to(tl.float32)[None, :]
        for first in range(tl.program_id(0) * ROWS, n_rows, tl.num_programs(0) * ROWS):
            _rmsnorm_rows(
                x_ptr,
                r_ptr,
                w_ptr,
                o_ptr,
                s_ptr,
                w,
                cols,
                col_ok,
                first,
                n_rows,
                n_cols,
                stride_x,
                stride_r,
                stride_o,
                stride_s,
                eps,
                ROWS,
                HAS_RESIDUAL,
                STORE_SUM,
                True,
                EVICT,
            )
    else:
        _rmsnorm_rows(
            x_ptr,
            r_ptr,
            w_ptr,
            o_ptr,
            s_ptr,
            0.0,
            cols,
            col_ok,
            tl.program_id(0) * ROWS,
            n_rows,
            n_cols,
            stride_x,
            stride_r,
            stride_o,
            stride_s,
            eps,
            ROWS,
            HAS_RESIDUAL,
            STORE_SUM,
            False,
            EVICT,
        )
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _rmsnorm_rows(
    x_ptr,
    r_ptr,
    w_ptr,
    o_ptr,
    s_ptr,
    w,
    cols,
    col_ok,
    first,
    n_rows,
    n_cols,
    stride_x,
    stride_r,
    stride_o,
    stride_s,
    eps,
    ROWS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    STORE_SUM: tl.constexpr,
    W_LOADED: tl.constexpr,
    EVICT: tl.constexpr,
):
    """ROWS rows from ``first``; ``w`` is the weight in fp32 when W_LOADED."""
    rows = first + tl.arange(0, ROWS)
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    # 64-bit row offsets: 65536 rows of 7168 elements overflow int32.
    rows = rows.to(tl.int64)
    x = tl.load(
        x_ptr + rows[:, None] * stride_x + cols[None, :],
        mask=mask,
        other=0.0,
        eviction_policy=EVICT,
    ).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(
            r_ptr + rows[:, None] * stride_r + cols[None, :],
            mask=mask,
            other=0.0,
            eviction_policy=EVICT,
        ).to(tl.float32)
    if STORE_SUM:
        # FlashInfer's fused_add_rmsnorm leaves the sum in `residual`. Each program reads its
        # rows whole before it writes them, so the sum and the output may alias the inputs.
        tl.store(
            s_ptr + rows[:, None] * stride_s + cols[None, :],
            x.to(s_ptr.dtype.element_ty),
            mask=mask,
        )
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    if not W_LOADED:
        # Read by every program: kept in L2. Read after the rows (measured: reading it first
        # costs 3% from 4096 rows of 4096 on an H100).
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0, eviction_policy="evict_last")
        w = w.to(tl.float32)[None, :]
    y = x * inv_rms[:, None] * w
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


# The fused add's persistent grid: programs per SM, warps, and up to how many elements
# (rows x columns). Measured on an H100 at hidden 4096 (benchmarks/kernel_settings.py): 4
# programs of 8 warps per SM walking the rows take 0.90x FlashInfer's GPU time at 1024 rows
# and 0.81x at 2048, where the data still sits in L2; from 4096 rows one program of 16 warps
# per row is as fast as FlashInfer's and a persistent grid is 3% slower.
PERSISTENT = (4, 8, 2048 * 4096)


def pdl_on(device):
    """Whether to launch with programmatic dependent launch on ``device`` (SM90 and later, as
    FlashInfer does by default): the kernel is scheduled while the one before it drains."""
    return (
        device.type == "cuda"
        and torch.cuda.get_device_capability(device)[0] >= 9
        and hasattr(tl.extra.cuda, "gdc_wait")  # Triton 3.3 and later
    )


def processors(device):
    """The number of SMs of ``device`` (1 off a GPU: Triton's interpreter)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


# (rows, columns) -> (grid, BLOCK_N, rows per program, warps): worked out once per shape, so a
# call does no more Python than it must (Note [triton launch] in fibgen/runtime/launch.py).
_PLANS = {}
_MAX_PLANS = 1 << 16


def _plan(n_rows, n_cols, rows_per_program, num_warps, residual, device):
    rows, warps = config(n_rows, n_cols)
    programs = triton.cdiv(n_rows, rows_per_program or rows)
    per_sm, persistent_warps, most = PERSISTENT
    walk = bool(residual and rows == 1 and n_rows * n_cols <= most)
    if walk:
        programs = min(programs, per_sm * processors(device))
        warps = persistent_warps
    rows = rows_per_program or rows
    warps = num_warps or warps
    plan = ((programs,), triton.next_power_of_2(n_cols), rows, warps, walk, pdl_on(device))
    if rows_per_program is None and num_warps is None and len(_PLANS) < _MAX_PLANS:
        _PLANS[n_rows, n_cols, residual, device] = plan
    return plan


def _rows(t, n_cols):
    """``t`` as contiguous rows of ``n_cols`` (a view where it is one already)."""
    if t.ndim == 2 and t.stride(-1) == 1:
        return t
    return t.reshape(-1, n_cols).contiguous()


def launch(x, residual, weight, out, eps, rows_per_program=None, num_warps=None, sum_out=None):
    """Normalize ``x`` (plus ``residual`` when given) with epsilon ``eps`` into ``out``;
    ``sum_out``, when given, receives ``x + residual`` (it may be ``residual`` itself)."""
    n_cols = x.shape[-1]
    x = _rows(x, n_cols)
    if residual is not None:
        residual = _rows(residual, n_cols)
    o2 = out if out.ndim == 2 and out.stride(-1) == 1 else torch.empty_like(x)
    s2 = sum_out
    if sum_out is not None and not (sum_out.ndim == 2 and sum_out.stride(-1) == 1):
        s2 = torch.empty_like(x)
    n_rows = x.shape[0]
    if n_rows == 0:
        return out
    plan = None
    residual_given = residual is not None
    if rows_per_program is None and num_warps is None:
        plan = _PLANS.get((n_rows, n_cols, residual_given, x.device))
    if plan is None:
        plan = _plan(n_rows, n_cols, rows_per_program, num_warps, residual_given, x.device)
    grid, block, rows, warps, walk, pdl = plan
    r = x if residual is None else residual
    s = o2 if s2 is None else s2
    _rmsnorm_kernel[grid](
        x,
        r,
        weight,
        o2,
        s,
        n_rows,
        n_cols,
        x.stride(0),
        r.stride(0),
        o2.stride(0),
        s.stride(0),
        eps,
        BLOCK_N=block,
        ROWS=rows,
        HAS_RESIDUAL=residual is not None,
        STORE_SUM=s2 is not None,
        WALK=walk,
        # Loads marked evict-first: measured faster for rmsnorm and for the fused add on a
        # persistent grid, 0.3 to 0.7% slower for the fused add one row per program.
        EVICT="" if residual is not None and not walk else "evict_first",
        PDL=pdl,
        **({"launch_pdl": True} if pdl else {}),
        num_warps=warps,
    )
    if o2 is not out:
        out.copy_(o2.view(out.shape))
    if s2 is not sum_out:
        sum_out.copy_(s2.view(sum_out.shape))
    return out
