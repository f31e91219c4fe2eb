"""Routable calls (see ``_routable_calls``) of AlphaMoE's fused MoE APIs (moe_alphamoe.fidef)
and TensorRT-LLM's MXINT4 MoE (moe_trtllm_mxint4.fidef): every parameter given, each at a
value the rules accept, at the catalogue's smallest instances."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# What ``_routable_calls`` defines; imported lazily to avoid a cycle (it imports this module).
Catalogue = Any
Call = Any


def _call(*args, **kwargs) -> Any:
    from _routable_calls import Call

    return Call(*args, **kwargs)


ALPHAMOE_FP8 = "alphamoe_fp8_block_scale_aligned_moe_topk2_e8_h256_i128"


def alphamoe_fp8_aligned(c: Catalogue) -> Call:
    x, _ = c.inputs(ALPHAMOE_FP8, num_tokens=5, route_blocks=4)
    names = ["hidden_states", "hidden_states_scale", "gemm1_weights", "gemm1_weights_scale"]
    names += ["gemm2_weights", "gemm2_weights_scale", "sorted_token_ids", "expert_ids"]
    names += ["num_tokens_post_padded", "topk_weights"]
    kwargs = {"top_k": 2, "block_m": 8, "routed_scaling_factor": float(x["routed_scaling_factor"])}
    return _call(ALPHAMOE_FP8, tuple(x[n] for n in names), kwargs | {"out": x["out"]})


ALPHAMOE_NVFP4 = "alphamoe_nvfp4_aligned_moe_topk2_e8_h256_i128"


def alphamoe_nvfp4_aligned(c: Catalogue) -> Call:
    """Packed tensors as FlashInfer takes them (uint8), the prepared scale panels given."""
    x, _ = c.inputs(ALPHAMOE_NVFP4, num_tokens=5, route_block_capacity=4)
    u8 = torch.uint8
    args = (x["hidden_states"].view(u8), x["hidden_states_scale"])
    args += (x["gemm1_weights"].view(u8), x["gemm1_weights_scale"])
    args += (x["gemm2_weights"].view(u8), x["gemm2_weights_scale"])
    args += (x["output1_scale_gate_scalar"], x["output1_scale_scalar"], x["output2_scale_scalar"])
    args += (x["sorted_token_ids"], x["expert_ids"], x["num_tokens_post_padded"])
    args += (x["topk_weights"], x["out"], 2)
    kwargs = {"block_m": 8, "routed_scaling_factor": float(x["routed_scaling_factor"])}
    panels = {"w1_scale_prepared": torch.zeros(8, 16, 128, dtype=u8)}
    panels |= {"w2_scale_prepared": torch.zeros(8, 8, 128, dtype=u8)}
    return _call(ALPHAMOE_NVFP4, args, kwargs | panels)


ALPHAMOE_NVFP4_ROUTED = "alphamoe_nvfp4_routed_moe_topk2_e8_h256_i128"


ALPHAMOE_NVFP4_ROUTED_DS = "alphamoe_nvfp4_routed_moe_topk8_e256_h7168_i2048"


def alphamoe_nvfp4_routed(c: Catalogue) -> Call:
    """One token of DeepSeek-R1's shape, the one the small instance cannot be: FlashInfer
    routes only 1 or 8 tokens of 8 experts among 256 or 512. Every expert holds one
    expert's random weights (zero-stride views: the rules read shapes, the reference the
    eight experts it routes to); the plan workspaces sized as FlashInfer asks, every
    prepared layout left None."""
    small, _ = c.inputs(ALPHAMOE_NVFP4_ROUTED, num_tokens=1)  # for its value ranges
    g = torch.Generator().manual_seed(7)
    u8, i32, f8 = torch.uint8, torch.int32, torch.float8_e4m3fn
    E, H, I, T = 256, 7168, 2048, 1

    def experts(t: torch.Tensor) -> torch.Tensor:
        return t[None].expand(E, *t.shape)

    def scales(*shape: int) -> torch.Tensor:
        return (torch.rand(*shape, generator=g) * 0.04 + 0.01).to(f8)

    args = (torch.randint(0, 256, (T, H // 2), dtype=u8, generator=g), scales(T, H // 16))
    args += (experts(torch.randint(0, 256, (2 * I, H // 2), dtype=u8, generator=g)),)
    args += (experts(scales(2 * I, H // 16)),)
    args += (experts(torch.randint(0, 256, (H, I // 2), dtype=u8, generator=g)),)
    args += (experts(scales(H, I // 16)),)
    args += tuple(torch.rand(E, generator=g) + 0.5 for _ in range(3))
    capacity = T * 8 + E * 7  # M * top_k + E * (block_m - 1)
    args += (torch.zeros(capacity // 8 * 8, dtype=i32), torch.zeros(capacity // 8, dtype=i32))
    ids = torch.randperm(E, generator=g)[:8].to(i32)[None].contiguous()
    out = torch.randn(T, H, generator=g).bfloat16()
    args += (torch.zeros(1, dtype=i32), torch.rand(T, 8, generator=g), out, ids)
    args += (torch.zeros(E + 2, dtype=i32), 8)
    scale = float(small["routed_scaling_factor"])
    kwargs: dict = {"block_m": 8, "routed_scaling_factor": scale}
    for name in ("w1_scale_prepared", "w2_scale_prepared", "w1_data_prepared"):
        kwargs[name] = None
    for name in ("w1_gate_up_data_prepared", "w1_gate_up_scale_prepared"):
        kwargs[name] = None
    for name in ("w1_scale_prepared_interleaved", "w2_data_prepared"):
        kwargs[name] = None
    kwargs |= {"w2_data_prepared_k256": None, "w2_scale_prepared_k256": None}
    return _call(ALPHAMOE_NVFP4_ROUTED_DS, args, kwargs | {"accumulate": True})


MXINT4_DS = "trtllm_mxint4_block_scale_moe_ds_routing_topk4_ng4_kg2_e8_h256_i256"


def trtllm_mxint4_block_scale_moe(c: Catalogue) -> Call:
    x, _ = c.inputs(MXINT4_DS, seq_len=5)
    u8 = torch.uint8
    args = (x["routing_logits"], x["routing_bias"], x["hidden_states"])
    args += (x["gemm1_weights"].view(u8), x["gemm1_weights_scale"])
    args += (x["gemm1_alpha"], x["gemm1_beta"], x["gemm1_clamp_limit"])
    args += (x["gemm2_weights"].view(u8), x["gemm2_weights_scale"], 16, 4, 4, 2, 256)
    args += (int(x["local_expert_offset"]), 8, float(x["routed_scaling_factor"]))
    kwargs: dict = {"routing_method_type": 2, "do_finalize": True, "enable_pdl": False}
    kwargs |= {"output": None, "tune_max_num_tokens": 1024, "norm_topk_prob": True}
    kwargs |= {"routing_replay_out": None, "valid_hidden_size": None}
    return _call(MXINT4_DS, args, kwargs | {"valid_intermediate_size": None})


ROUTABLE: dict[str, Callable[[Catalogue], Call]] = {
    "flashinfer.fused_moe.alphamoe_fp8_block_scale_aligned_moe": alphamoe_fp8_aligned,
    "flashinfer.fused_moe.alphamoe_nvfp4_aligned_moe": alphamoe_nvfp4_aligned,
    "flashinfer.fused_moe.alphamoe_nvfp4_routed_moe": alphamoe_nvfp4_routed,
    "flashinfer.fused_moe.trtllm_mxint4_block_scale_moe": trtllm_mxint4_block_scale_moe,
}
