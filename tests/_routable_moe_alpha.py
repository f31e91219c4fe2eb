"""Routable calls (see ``_routable_calls``) of AlphaMoE's fused MoE APIs (moe_alphamoe.fidef)
and TensorRT-LLM's MXINT4 MoE (moe_trtllm_mxint4.fidef): every parameter given, each at a
value the rules accept, at the catalogue's smallest instances."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


ROUTABLE: dict[str, Callable[[Catalogue], Call]] = {
    "flashinfer.fused_moe.alphamoe_fp8_block_scale_aligned_moe": alphamoe_fp8_aligned,
}
