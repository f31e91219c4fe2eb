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


def alphamoe_nvfp4_routed(c: Catalogue) -> Call:
    """The plan workspaces sized as FlashInfer asks, every prepared layout left None."""
    x, _ = c.inputs(ALPHAMOE_NVFP4_ROUTED, num_tokens=5)
    u8, i32 = torch.uint8, torch.int32
    capacity = 5 * 2 + 8 * 7  # M * top_k + E * (block_m - 1), rounded to blocks below
    args = (x["hidden_states"].view(u8), x["hidden_states_scale"])
    args += (x["gemm1_weights"].view(u8), x["gemm1_weights_scale"])
    args += (x["gemm2_weights"].view(u8), x["gemm2_weights_scale"])
    args += (x["output1_scale_gate_scalar"], x["output1_scale_scalar"], x["output2_scale_scalar"])
    args += (torch.zeros(capacity // 8 * 8, dtype=i32), torch.zeros(capacity // 8, dtype=i32))
    args += (torch.zeros(1, dtype=i32), x["topk_weights"], x["out"], x["topk_ids"])
    args += (torch.zeros(8 + 2, dtype=i32), 2)
    kwargs: dict = {"block_m": 8, "routed_scaling_factor": float(x["routed_scaling_factor"])}
    for name in ("w1_scale_prepared", "w2_scale_prepared", "w1_data_prepared"):
        kwargs[name] = None
    for name in ("w1_gate_up_data_prepared", "w1_gate_up_scale_prepared"):
        kwargs[name] = None
    for name in ("w1_scale_prepared_interleaved", "w2_data_prepared"):
        kwargs[name] = None
    kwargs |= {"w2_data_prepared_k256": None, "w2_scale_prepared_k256": None}
    return _call(ALPHAMOE_NVFP4_ROUTED, args, kwargs | {"accumulate": True})


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
