"""Calls that give every parameter and are routed, for the MiniMax-H3 APIs of
``definitions/minimax_h3.fidef`` (see ``_routable_calls`` for the convention).

The prepared MiniMax-H3 operations bind their tensors at construction, which needs an SM100
GPU; a builder makes the instance as the constructor leaves it (``_bound_tensors``, the very
tensors of the call) without running it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

PACK_NVFP4 = "minimax_h3_qkv_quantize_pack_p8_hdst7_d128_pk64"
PACK_MXFP8 = "minimax_h3_qkv_quantize_pack_p2_hdst28_d128_pk128"
BF16 = "minimax_h3_bf16_pre_attention_h5376_qkv3_d128_w21504_rope96"


def scale_stride(m: int, p: int, columns: int) -> int:
    """Bytes of one destination's scale tile: its rows padded to 128, times the columns."""
    rows = m * (56 // p) * 3
    return (rows + 127) // 128 * 128 * columns


def pack_call(c: Any, name: str, m: int = 3) -> Any:
    """A MiniMaxH3QkvQuantizePack.run call of definition ``name`` (either format)."""
    from _routable_calls import Call
    from flashinfer.cake_minimax_h3 import MiniMaxH3QkvQuantizePack

    x, _ = c.inputs(name, M=m)
    nvfp4 = name.endswith("_pk64")
    p = int(re.search(r"_p(\d+)_hdst", name).group(1))
    width, columns = (64, 8) if nvfp4 else (128, 4)
    dtype = torch.uint8 if nvfp4 else torch.float8_e4m3fn
    kwargs = {"q": x["q"], "k": x["k"], "v": x["v"]}
    kwargs["out_q"] = torch.zeros(p, m, 56 // p, 3, width, dtype=torch.uint8).view(dtype)
    kwargs["out_sf"] = torch.full((p, scale_stride(m, p, columns)), 0xFF, dtype=torch.uint8)
    kwargs["out_global_scale"] = x["out_global_scale"] if nvfp4 else None
    # What __init__ keeps; it needs an SM100 GPU to run.
    op = object.__new__(MiniMaxH3QkvQuantizePack)
    op.__dict__["_bound_tensors"] = dict(kwargs)
    return Call(name, (op,), kwargs)


def bf16_call(c: Any, m: int = 3, p: int = 4) -> Any:
    """A minimax_h3_bf16_pre_attention call. Its tensors are made here, not by the input
    generator: the projection weight is [21504, 5376] (231 MB), zero but for its first 64
    columns, which costs a memset instead of 115 million random draws."""
    from _routable_calls import Call

    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int, s: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * s).bfloat16()

    weight = torch.zeros(21504, 5376, dtype=torch.bfloat16)
    weight[:, :64] = rnd(21504, 64, s=0.1)
    args = (rnd(m, 5376), rnd(5376, s=0.1) + 1, rnd(9, 5376, s=0.2), rnd(9, 5376, s=0.2))
    args += (torch.randint(0, 9, (m,), generator=g), weight, rnd(128, s=0.1) + 1)
    args += (rnd(128, s=0.1) + 1, rnd(m + 2, 96).clamp(-1, 1))
    out = torch.zeros(p, m, 56 // p, 3, 128, dtype=torch.bfloat16)
    kwargs = {"ulysses_degree": p, "out": out, "eps": 1e-5, "qk_eps": 1e-6}
    kwargs |= {"rope_positions": torch.randint(0, m + 2, (m,), generator=g)}
    kwargs |= {"workspace": torch.empty(m, 5376, dtype=torch.bfloat16)}
    return Call(BF16, args, kwargs)


ROUTABLE: dict[str, Callable[[Any], Any]] = {
    "flashinfer.cake_minimax_h3.MiniMaxH3QkvQuantizePack.run": lambda c: pack_call(c, PACK_NVFP4),
    "flashinfer.diffusion_ops.minimax_h3.minimax_h3_bf16_pre_attention": bf16_call,
}


MXFP8 = "minimax_h3_mxfp8_pre_attention_p8_hdst7_d128"


def mxfp8_call(c: Any, m: int = 3) -> Any:
    """A MiniMaxH3Mxfp8PreAttention.run call: the projection weight (115 MB of e4m3) is
    made here, ones but for a random first 64 columns; its scales vary by row and block."""
    from _routable_calls import Call
    from flashinfer.cake_minimax_h3 import MiniMaxH3Mxfp8PreAttention

    g = torch.Generator().manual_seed(1)

    def rnd(*shape: int, s: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * s).bfloat16()

    weight = torch.ones(21504, 5376, dtype=torch.float8_e4m3fn)
    weight[:, :64] = torch.randn(21504, 64, generator=g).to(torch.float8_e4m3fn)
    kwargs: dict = {"x": rnd(m, 5376), "x_norm_weight": rnd(5376, s=0.1) + 1}
    kwargs |= {"adaln_scale": rnd(9, 5376, s=0.2), "adaln_shift": rnd(9, 5376, s=0.2)}
    kwargs["adaln_index"] = torch.randint(0, 9, (m,), generator=g, dtype=torch.int32)
    kwargs["qkv_weight_q"] = weight
    sf = torch.randint(112, 122, (21504 * 168,), generator=g, dtype=torch.int32)
    kwargs["qkv_weight_sf"] = sf.to(torch.uint8)
    kwargs |= {"q_norm_weight": rnd(128, s=0.1) + 1, "k_norm_weight": rnd(128, s=0.1) + 1}
    kwargs["rope_cos_sin"] = rnd(m, 96).clamp(-1, 1)
    kwargs["out_q"] = torch.zeros(8, m, 7, 3, 128, dtype=torch.float8_e4m3fn)
    kwargs["out_sf"] = torch.full((8, scale_stride(m, 8, 4)), 0xFF, dtype=torch.uint8)
    kwargs |= {"debug_q_bf16": None, "debug_k_bf16": None}
    # What __init__ keeps; it needs an SM100 GPU to run.
    op = object.__new__(MiniMaxH3Mxfp8PreAttention)
    op.__dict__["_bound_tensors"] = dict(kwargs)
    return Call(MXFP8, (op,), kwargs)


ROUTABLE["flashinfer.cake_minimax_h3.MiniMaxH3Mxfp8PreAttention.run"] = mxfp8_call


NVFP4 = "minimax_h3_nvfp4_pre_attention_p8_hdst7_d128"


def nvfp4_call(c: Any, m: int = 3) -> Any:
    """A MiniMaxH3Nvfp4PreAttention.run call: the projection weight (58 MB of E2M1 pairs) is
    made here, 1.0 (code 2) but for a random first 64 values a row; its scales are random."""
    from _routable_calls import Call
    from flashinfer.cake_minimax_h3 import MiniMaxH3Nvfp4PreAttention

    g = torch.Generator().manual_seed(2)

    def rnd(*shape: int, s: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * s).bfloat16()

    weight = torch.full((21504, 2688), 0x22, dtype=torch.uint8)
    weight[:, :32] = torch.randint(0, 256, (21504, 32), generator=g, dtype=torch.int32).to(
        torch.uint8
    )
    sf = (torch.rand(21504 * 336, generator=g) * 0.015 + 0.005).to(torch.float8_e4m3fn)
    kwargs: dict = {"x": rnd(m, 5376), "x_norm_weight": rnd(5376, s=0.1) + 1}
    kwargs |= {"adaln_scale": rnd(9, 5376, s=0.2), "adaln_shift": rnd(9, 5376, s=0.2)}
    kwargs["adaln_index"] = torch.randint(0, 9, (m,), generator=g, dtype=torch.int32)
    kwargs["x_global_scale"] = torch.tensor([400.0])
    kwargs |= {"qkv_weight_q": weight, "qkv_weight_sf": sf.view(torch.uint8)}
    kwargs["w_global_scale"] = torch.tensor([1.5])
    kwargs |= {"q_norm_weight": rnd(128, s=0.1) + 1, "k_norm_weight": rnd(128, s=0.1) + 1}
    kwargs["rope_cos_sin"] = rnd(m, 96).clamp(-1, 1)
    kwargs["out_global_scale"] = torch.tensor([150.0])
    kwargs["out_q"] = torch.zeros(8, m, 7, 3, 64, dtype=torch.uint8)
    kwargs["out_sf"] = torch.full((8, scale_stride(m, 8, 8)), 0xFF, dtype=torch.uint8)
    kwargs |= {"debug_q_bf16": None, "debug_k_bf16": None, "debug_adaln_bf16": None}
    # What __init__ keeps; it needs an SM100 GPU to run.
    op = object.__new__(MiniMaxH3Nvfp4PreAttention)
    op.__dict__["_bound_tensors"] = dict(kwargs)
    return Call(NVFP4, (op,), kwargs)


ROUTABLE["flashinfer.cake_minimax_h3.MiniMaxH3Nvfp4PreAttention.run"] = nvfp4_call
