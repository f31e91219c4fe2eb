"""Routable calls of the GEMM and MoE APIs of ``gemm_*.fidef`` and ``moe_*.fidef``.

Each builder returns a ``Call`` (``_routable_calls``) that gives every parameter of the real
signature at a value the family's rules accept, a non-default one where a rule allows it, so
that ``test_flashinfer_apply.py`` can check the call is routed; ``test_catalogue_gemm.py``
varies them one parameter at a time. Shapes are the catalogue's smallest instances.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# What ``_routable_calls`` defines; imported lazily by its users to avoid a cycle.
Catalogue = Any

MM_BF16 = "gemm_bf16_N2048_K512"
MM_BF16_BIAS = "gemm_bf16_bias_N576_K3584"
BMM_BF16 = "bmm_bf16_N128_K512"
TINYGEMM = "tinygemm_bf16_n32_k2880"
ROUTER_7168 = "mm_M1_16_K7168_N256_k7168_n256"
ROUTER_6144 = "mm_M1_16_K6144_N256_k6144_n256"
TGV = "tgv_gemm_sm100_N640_K2880"
SEGMENT = "segment_gemm_run_k64_n6144"
MM_FP8 = "gemm_fp8_N4096_K4096"
MM_FP8_PER_TENSOR = "gemm_fp8_per_tensor_N8192_K1024"
BMM_FP8 = "bmm_fp8_N128_K512"
GROUPWISE = "gemm_fp8_nt_groupwise_n256_k256"
GROUPED = "group_gemm_fp8_nt_groupwise_contiguous_g4_n256_k256"
DEEPGEMM = "batch_deepgemm_fp8_nt_groupwise_n256_k256"
SM90 = "fp8_blockscale_gemm_sm90_n256_k256"
MM_FP4 = "gemm_fp4_N8192_K1024"
MM_MXFP8 = "gemm_mxfp8_N8192_K1024"
BMM_MXFP8 = "bmm_mxfp8_N512_K128"


def _call(*args, **kwargs):
    from _routable_calls import Call

    return Call(*args, **kwargs)


def mm_bf16(c: Catalogue) -> Any:
    x, axes = c.inputs(MM_BF16, M=3)
    kwargs = {"bias": None, "pdl": True, "out": c.buffer(MM_BF16, "C", axes)}
    kwargs |= {"out_dtype": torch.bfloat16, "backend": "cutlass"}
    return _call(MM_BF16, (x["A"], x["B"]), kwargs)


def bmm_bf16(c: Catalogue) -> Any:
    x, axes = c.inputs(BMM_BF16, batch_size=2, M=3)
    kwargs = {"out": c.buffer(BMM_BF16, "C", axes), "out_dtype": torch.bfloat16}
    return _call(BMM_BF16, (x["A"], x["B"]), kwargs | {"backend": "cublas"})


def tinygemm_bf16(c: Catalogue) -> Any:
    x, axes = c.inputs(TINYGEMM, M=3)
    args = (x["input"], x["weight"], c.buffer(TINYGEMM, "output", axes))
    return _call(TINYGEMM, args, {"bias": x["bias"], "use_pdl": True})


def router(name: str) -> Callable[[Catalogue], Any]:
    def build(c: Catalogue) -> Any:
        x, axes = c.inputs(name, M=5)
        args = (x["mat_a"], x["mat_b"], c.buffer(name, "output", axes))
        return _call(name, args, {"launch_with_pdl": False})

    return build


def tgv_gemm(c: Catalogue) -> Any:
    x, axes = c.inputs(TGV, M=3)
    kwargs = {"pdl": True, "out": c.buffer(TGV, "output", axes)}
    kwargs |= {"a_descale": None, "b_descale": None}
    b = x["b"].T.contiguous().T  # [K, N] column-major, as FlashInfer documents it
    return _call(TGV, (x["a"], b, x["bias"]), kwargs)


def segment_gemm(c: Catalogue) -> Any:
    from flashinfer.gemm import SegmentGEMMWrapper

    x, axes = c.inputs(SEGMENT, total_rows=7, num_weights=3, batch_size=2, len_indptr=3)
    wrapper = object.__new__(SegmentGEMMWrapper)
    indptr = x["seg_indptr"]
    # Column-major weights, [num_weights, N, K], and both spellings of the segments.
    weights = x["weights"].transpose(-1, -2).contiguous()
    kwargs = {"out": c.buffer(SEGMENT, "output", axes), "seg_lens": indptr.diff()}
    kwargs |= {"seg_indptr": indptr, "weight_indices": x["weight_indices"]}
    return _call(SEGMENT, (wrapper, x["x"], weights, 2, True), kwargs)


def mm_fp8(c: Catalogue) -> Any:
    x, axes = c.inputs(MM_FP8, M=3)
    kwargs = {"alpha": x["alpha"].reshape(1), "out_dtype": torch.bfloat16}
    kwargs |= {"out": c.buffer(MM_FP8, "C", axes), "backend": "auto"}
    return _call(MM_FP8, (x["A"], x["B"]), kwargs)


def bmm_fp8(c: Catalogue) -> Any:
    x, axes = c.inputs(BMM_FP8, batch_size=2, M=3)
    args = (x["A"], x["B"], x["A_scale"].reshape(1), x["B_scale"].reshape(1), torch.bfloat16)
    return _call(BMM_FP8, args, {"out": c.buffer(BMM_FP8, "C", axes), "backend": "cudnn"})


def gemm_fp8_nt_groupwise(c: Catalogue) -> Any:
    x, axes = c.inputs(GROUPWISE, M=4)
    # MN-major scales: the transposes of the definition's K-major ones.
    args = (x["a"], x["b"], x["a_scale"].T.contiguous(), x["b_scale"].T.contiguous())
    kwargs = {"scale_major_mode": "MN", "mma_sm": 2, "scale_granularity_mnk": (1, 128, 128)}
    kwargs |= {"out": c.buffer(GROUPWISE, "out", axes), "out_dtype": None, "backend": "cutlass"}
    return _call(GROUPWISE, args, kwargs)


def group_gemm_fp8(c: Catalogue) -> Any:
    x, axes = c.inputs(GROUPED, M=8)
    m_indices = x["m_indices"].sort().values
    args = (x["a"], x["b"], x["a_scale"], x["b_scale"], m_indices)
    kwargs = {"scale_granularity_mnk": (1, 128, 128), "out": c.buffer(GROUPED, "out", axes)}
    return _call(GROUPED, args, kwargs | {"out_dtype": None, "validate_indices": True})


def batch_deepgemm(c: Catalogue) -> Any:
    x, axes = c.inputs(DEEPGEMM, batch_size=2, M_max=4)
    args = (x["a"], x["b"], x["a_scale"], x["b_scale"], x["masked_m"], 2)
    kwargs = {"scale_granularity_mnk": (1, 128, 128), "out": c.buffer(DEEPGEMM, "out", axes)}
    return _call(DEEPGEMM, args, kwargs | {"out_dtype": torch.bfloat16, "backend": "deepgemm"})


def tma_aligned(scale: torch.Tensor) -> torch.Tensor:
    """Per-token scales [M, K // 128] in the layout FlashInfer 0.7.2's SM90 block-scaled GEMM
    reads: M-major, M padded to a multiple of 4 (Note [blockscale input scales])."""
    m, blocks = scale.shape
    padded = scale.new_zeros(blocks, (m + 3) // 4 * 4)
    padded[:, :m] = scale.T
    return padded.T[:m]


def fp8_blockscale_gemm_sm90(c: Catalogue) -> Any:
    x, axes = c.inputs(SM90, M=3)
    kwargs = {"input_scale": tma_aligned(x["input_scale"]), "weight_scale": x["weight_scale"]}
    kwargs |= {"out": c.buffer(SM90, "out", axes), "out_dtype": torch.bfloat16}
    return _call(SM90, (x["input"], x["weight"]), kwargs)


def mm_fp4(c: Catalogue) -> Any:
    x, axes = c.inputs(MM_FP4, M=3, M_padded=128)
    # As nvfp4_quantize returns them (uint8), B and its scales as transposed views.
    args = (x["A"].view(torch.uint8), x["B"].view(torch.uint8).T)
    args += (x["a_descale"].view(torch.uint8), x["b_descale"].view(torch.uint8).T)
    kwargs = {"alpha": x["alpha"].reshape(1), "out_dtype": torch.bfloat16}
    kwargs |= {"out": c.buffer(MM_FP4, "C", axes), "block_size": 16}
    kwargs |= {"use_8x4_sf_layout": False, "backend": "cutlass", "use_nvfp4": True}
    return _call(MM_FP4, args, kwargs | {"enable_pdl": False})


def mm_mxfp8(c: Catalogue) -> Any:
    x, axes = c.inputs(MM_MXFP8, M=3, a_scale_size=128 * 32)
    # As mxfp8_quantize returns the scales (uint8), B the column-major view of [N, K].
    args = (
        x["A"],
        x["B"].T.contiguous().T,
        x["a_descale"].view(torch.uint8),
        x["b_descale"].view(torch.uint8),
    )
    kwargs = {"out": c.buffer(MM_MXFP8, "C", axes), "out_dtype": torch.bfloat16}
    return _call(MM_MXFP8, args, kwargs | {"use_8x4_sf_layout": False, "backend": "cutlass"})


def bmm_mxfp8(c: Catalogue) -> Any:
    # Two batch entries of 3 rows: each entry's scales padded to 128 rows of 4 columns.
    sizes = {"a_scale_size": 2 * 128 * 4, "b_scale_size": 2 * 512 * 4}
    x, axes = c.inputs(BMM_MXFP8, batch_size=2, M=3, **sizes)
    # As mxfp8_quantize returns the scales (uint8), B the column-major view of [N, K].
    args = (x["A"], x["B"].transpose(1, 2).contiguous().transpose(1, 2))
    args += (x["A_scale"].view(torch.uint8), x["B_scale"].view(torch.uint8), torch.bfloat16)
    return _call(BMM_MXFP8, args, {"out": c.buffer(BMM_MXFP8, "C", axes), "backend": "cudnn"})


MM_BF16_FP4 = "gemm_bf16_fp4_N2048_K7168"


def mm_bf16_fp4(c: Catalogue) -> Any:
    x, axes = c.inputs(MM_BF16_FP4, M=3)
    # As prepare_bf16_fp4_weights(..., backend="cudnn") returns them: the packed weight as
    # uint8, its scales linear e4m3.
    args = (x["A"], x["B"].view(torch.uint8), x["b_descale"], x["alpha"].reshape(1))
    kwargs = {"backend": "cudnn", "out_dtype": torch.bfloat16}
    kwargs |= {"out": c.buffer(MM_BF16_FP4, "C", axes), "block_size": 16, "enable_pdl": False}
    return _call(MM_BF16_FP4, args, kwargs)


MASKED_NVFP4 = "grouped_gemm_nt_masked_nvfp4_n2048_k768"


def grouped_gemm_nt_masked(c: Catalogue) -> Any:
    x, axes = c.inputs(MASKED_NVFP4, num_groups=2, M=3, M_padded=128)

    def scales(s: torch.Tensor) -> torch.Tensor:
        # [G, rows, cols] swizzled -> the [32, 4, rows / 128, 4, cols / 4, G] view of it.
        g, rows, cols = s.shape
        return s.reshape(g, rows // 128, cols // 4, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)

    # As scaled_fp4_grouped_quantize returns the activation: uint8 [M, K / 2, G] views.
    lhs = (x["a"].view(torch.uint8).permute(1, 2, 0), scales(x["a_sf"]))
    rhs = (x["b"].view(torch.uint8).permute(1, 2, 0), scales(x["b_sf"]))
    # The output as FlashInfer asks for it: an [M, N, G] view of group-major memory.
    out = torch.zeros(axes["num_groups"], axes["M"], axes["N"], dtype=torch.bfloat16)
    out = out.permute(1, 2, 0)
    kwargs: dict = {"ab_dtype": "float4_e2m1fn", "sf_dtype": "float8_e4m3fn"}
    kwargs |= {"c_dtype": "bfloat16", "sf_vec_size": 16, "topk_weights": None}
    kwargs |= {"idx_src_info": None, "rank_src_info": None, "out_ptrs": None, "num_ranks": 0}
    kwargs |= {"dst_signals": None, "sm_count": 148, "barrier_flag_local": None}
    kwargs |= {"barrier_flag_multicast": None, "is_combine_fusion": False, "is_swap_ab": False}
    kwargs |= {"mma_tiler_mn": (256, 128), "cluster_shape_mn": (2, 1)}
    kwargs |= {"alpha": x["alpha"], "alpha_dtype": "float32"}
    return _call(MASKED_NVFP4, (lhs, rhs, out, x["masked_m"]), kwargs)


SVDQUANT = "gemm_nvfp4_svdquant_N3072_K3072_r32"


def mm_nvfp4_svdquant(c: Catalogue) -> Any:
    x, axes = c.inputs(SVDQUANT, M=3, M_padded=128)
    # As nvfp4_quantize_smooth returns them: uint8 values and flat uint8 scale buffers.
    args = (x["a"].view(torch.uint8), x["b"].view(torch.uint8))
    args += (x["a_sf"].view(torch.uint8).reshape(-1), x["b_sf"].view(torch.uint8).reshape(-1))
    args += (x["alpha"].reshape(1), x["d"], x["l1"])
    kwargs = {"bias": x["bias"], "out": c.buffer(SVDQUANT, "C", axes)}
    return _call(SVDQUANT, args, kwargs | {"backend": "cutlass", "enable_pdl": True})


SVDQUANT_LINEAR = "svdquant_linear_N3072_K3072_r32"


def svdquant_linear(c: Catalogue) -> Any:
    x, _ = c.inputs(SVDQUANT_LINEAR, M=3)
    # As FlashInfer takes them: uint8 weight bytes and its flat uint8 scale buffer.
    args = (x["x"], x["weight_fp4"].view(torch.uint8))
    args += (x["weight_sf"].view(torch.uint8).reshape(-1), x["alpha"].reshape(1))
    args += (x["pre_quant_scale"], x["l2t_smoothed"], x["l1_scaled"], x["global_scale"])
    kwargs = {"bias": x["bias"], "enable_pdl": True, "backend": "cutlass"}
    return _call(SVDQUANT_LINEAR, args, kwargs)


CUTLASS_MOE = "cutlass_fused_moe_e8_h256_i128_topk2"


def cutlass_fused_moe(c: Catalogue) -> Any:
    from flashinfer.fused_moe import ActivationType

    x, _ = c.inputs(CUTLASS_MOE, seq_len=5)
    args = (x["input"], x["token_selected_experts"], x["token_final_scales"])
    args += (x["fc1_expert_weights"], x["fc2_expert_weights"], torch.bfloat16, [])
    kwargs: dict = {"fc1_expert_biases": None, "fc2_expert_biases": None, "input_sf": None}
    kwargs |= {"swiglu_alpha": None, "swiglu_beta": None, "swiglu_limit": None}
    kwargs |= {"tp_size": 1, "tp_rank": 0, "ep_size": 1, "ep_rank": 0}
    kwargs |= {"cluster_size": 1, "cluster_rank": 0, "output": None}
    kwargs |= {"enable_alltoall": False, "use_deepseek_fp8_block_scale": False}
    kwargs |= {"use_w4_group_scaling": False, "use_mxfp8_act_scaling": False}
    kwargs |= {"min_latency_mode": False, "use_packed_weights": False}
    kwargs |= {"use_wfp4afp8_humming": False, "tune_max_num_tokens": 1024, "enable_pdl": True}
    kwargs |= {"activation_type": ActivationType.Swiglu, "swizzled_input_sf": False}
    kwargs |= {"use_fused_finalize": False, "profile_ids": [0, 1]}
    kwargs |= {"workspace_buffer": torch.empty(16, dtype=torch.uint8)}
    kwargs |= {"clamped_relu2_limit": None, "situ_beta": None, "situ_linear_beta": None}
    return _call(CUTLASS_MOE, args, kwargs | {"backend": "cutlass"})


FP8_BLOCK_ROUTED = "trtllm_fp8_block_scale_routed_moe_topk2_e8_h256"
FP8_PER_TENSOR_ROUTED = "trtllm_fp8_per_tensor_scale_routed_moe_topk2_e8_h256"


def fp8_block_scale_routed_moe(c: Catalogue) -> Any:
    from flashinfer.fused_moe import Fp8QuantizationType

    x, axes = c.inputs(FP8_BLOCK_ROUTED, seq_len=5)
    args = (x["topk_ids"], torch.zeros(8), x["hidden_states"], x["hidden_states_scale"])
    args += (x["gemm1_weights"], x["gemm1_weights_scale"])
    args += (x["gemm2_weights"], x["gemm2_weights_scale"])
    args += (8, 2, 1, 1, 128, int(x["local_expert_offset"]), 8, 1.0)
    kwargs: dict = {"routing_method_type": 2, "use_shuffled_weight": False, "weight_layout": 0}
    kwargs |= {"do_finalize": True, "enable_pdl": True, "gemm1_lora_delta": None}
    kwargs |= {"output": c.buffer(FP8_BLOCK_ROUTED, "output", axes)}
    kwargs |= {"tune_max_num_tokens": 1024}
    kwargs |= {"fp8_quantization_type": Fp8QuantizationType.DeepSeekFp8, "activation_type": 3}
    kwargs |= {"gemm1_alpha": None, "gemm1_beta": None, "gemm1_clamp_limit": None}
    kwargs |= {"valid_hidden_size": None, "valid_intermediate_size": None}
    return _call(FP8_BLOCK_ROUTED, args, kwargs)


def fp8_per_tensor_scale_routed_moe(c: Catalogue) -> Any:
    x, axes = c.inputs(FP8_PER_TENSOR_ROUTED, seq_len=5)
    args = (x["topk_ids"], None, x["hidden_states"], x["gemm1_weights"])
    args += (x["output1_scales_scalar"], x["output1_scales_gate_scalar"])
    args += (x["gemm2_weights"], x["output2_scales_scalar"])
    args += (8, 2, None, None, 128, int(x["local_expert_offset"]), 8, None, False)
    kwargs: dict = {"routing_method_type": 1, "do_finalize": True, "enable_pdl": False}
    kwargs |= {"tune_max_num_tokens": 1024, "activation_type": 3, "routing_replay_out": None}
    kwargs |= {"output": c.buffer(FP8_PER_TENSOR_ROUTED, "output", axes)}
    return _call(FP8_PER_TENSOR_ROUTED, args, kwargs | {"gemm1_clamp_limit": None})


BF16_MOE_DS = "trtllm_bf16_moe_ds_routing_topk4_ng4_kg2_e8_h256_i128"
BF16_ROUTED = "trtllm_bf16_routed_moe_topk2_e8_h256"


def _bf16_moe_tail(c: Catalogue, name: str, axes: dict) -> dict:
    """The keywords after routed_scaling_factor common to both bf16 MoE APIs."""
    kwargs: dict = {"use_shuffled_weight": True, "weight_layout": 2, "do_finalize": True}
    kwargs |= {"enable_pdl": False, "tune_max_num_tokens": 1024, "activation_type": 3}
    kwargs |= {"routing_replay_out": None, "gemm1_alpha": None, "gemm1_beta": None}
    return kwargs | {"gemm1_clamp_limit": None, "output": c.buffer(name, "output", axes)}


def trtllm_bf16_moe(c: Catalogue) -> Any:
    x, axes = c.inputs(BF16_MOE_DS, seq_len=5)
    args = (x["routing_logits"].bfloat16(), x["routing_bias"], x["hidden_states"])
    args += (x["gemm1_weights"], x["gemm2_weights"], 16, 4, 4, 2, 128)
    args += (int(x["local_expert_offset"]), 8)
    kwargs = {"routed_scaling_factor": float(x["routed_scaling_factor"])}
    kwargs |= {"routing_method_type": 2, "norm_topk_prob": True}
    return _call(BF16_MOE_DS, args, kwargs | _bf16_moe_tail(c, BF16_MOE_DS, axes))


def trtllm_bf16_routed_moe(c: Catalogue) -> Any:
    x, axes = c.inputs(BF16_ROUTED, seq_len=5)
    args = (x["topk_ids"], x["hidden_states"], x["gemm1_weights"], x["gemm2_weights"])
    args += (8, 2, None, None, 128, int(x["local_expert_offset"]), 8)
    kwargs = {"routed_scaling_factor": None, "routing_method_type": 1, "gemm1_lora_delta": None}
    return _call(BF16_ROUTED, args, kwargs | _bf16_moe_tail(c, BF16_ROUTED, axes))


FP4_RENORM = "moe_fp4_block_scale_renormalize_routing_topk2_e8_h256_i128_act3"
FP4_ROUTED = "trtllm_fp4_block_scale_routed_moe_topk2_e8_h256_act3"


def _fp4_weights(x: dict) -> tuple:
    """From hidden_states_scale to output2_scale_scalar, as FlashInfer takes them (uint8)."""
    u8 = torch.uint8
    args = (None, x["gemm1_weights"].view(u8), x["gemm1_weights_scale"].view(u8))
    args += (x.get("gemm1_bias"), x.get("gemm1_alpha"), x.get("gemm1_beta"))
    args += (x.get("gemm1_clamp_limit"), x["gemm2_weights"].view(u8))
    args += (x["gemm2_weights_scale"].view(u8), x.get("gemm2_bias"), None, None, None)
    return args


def _fp4_tail() -> dict:
    kwargs: dict = {"do_finalize": True, "enable_pdl": True, "activation_type": 3}
    kwargs |= {"per_token_scale": None, "output": None, "tune_max_num_tokens": 1024}
    kwargs |= {"valid_hidden_size": None, "valid_intermediate_size": None}
    return kwargs | {"num_fused_shared_experts": 0, "hidden_states_scale_layout": None}


def trtllm_fp4_block_scale_moe(c: Catalogue) -> Any:
    x, _ = c.inputs(FP4_RENORM, seq_len=5)
    args = (x["routing_logits"].bfloat16(), None, x["hidden_states"], *_fp4_weights(x))
    args += (8, 2, None, None, 128, 0, 8, None)
    kwargs = {"routing_method_type": 1, "norm_topk_prob": True, "routing_replay_out": None}
    return _call(FP4_RENORM, args, kwargs | _fp4_tail())


def trtllm_fp4_block_scale_routed_moe(c: Catalogue) -> Any:
    x, _ = c.inputs(FP4_ROUTED, seq_len=5)
    args = (x["topk_ids"], None, x["hidden_states"], *_fp4_weights(x))
    args += (8, 2, None, None, 128, int(x["local_expert_offset"]), 8, 1.0)
    kwargs = {"routing_method_type": 1, "gemm1_lora_delta": None}
    return _call(FP4_ROUTED, args, kwargs | _fp4_tail())


TOPK_DEEPSEEK = "fused_topk_deepseek_e16_k4_ng4_kg2_bf16"
HASH_TOPK = "hash_topk_e16_k4_sh1"


def fused_topk_deepseek(c: Catalogue) -> Any:
    x, axes = c.inputs(TOPK_DEEPSEEK, num_tokens=5)
    values = c.buffer(TOPK_DEEPSEEK, "topk_values", axes)
    indices = c.buffer(TOPK_DEEPSEEK, "topk_indices", axes)
    args = (x["scores"], x["bias"], 4, 2, 4, float(x["routed_scaling_factor"]), values, indices)
    kwargs = {"launch_with_pdl": False, "routing_replay_out": None, "backend": "cake"}
    return _call(TOPK_DEEPSEEK, args, kwargs)


def hash_topk(c: Catalogue) -> Any:
    x, _ = c.inputs(HASH_TOPK, num_tokens=5, vocab=32)
    args = (x["router_logits"], x["input_ids"], x["tid2eid"])
    kwargs = {"num_fused_shared_experts": 1, "launch_with_pdl": False}
    return _call(
        HASH_TOPK, args, kwargs | {"routed_scaling_factor": float(x["routed_scaling_factor"])}
    )


PT_BF16_RENORM = "prims_ts_bf16_moe_renorm_topk2_e8_h256_i128"
PT_BF16_ROUTED = "prims_ts_bf16_routed_moe_topk2_e8_h256"


def prims_ts_bf16_moe(c: Catalogue) -> Any:
    # Prims-TS takes no DeepSeek-V3 routing for BF16: the renormalize family's call.
    x, axes = c.inputs(PT_BF16_RENORM, seq_len=5)
    args = (x["routing_logits"].bfloat16(), None, x["hidden_states"])
    args += (x["gemm1_weights"], x["gemm2_weights"], 8, 2, None, None, 128, 0, 8)
    kwargs = {"routed_scaling_factor": None, "routing_method_type": 1, "norm_topk_prob": True}
    return _call(PT_BF16_RENORM, args, kwargs | _bf16_moe_tail(c, PT_BF16_RENORM, axes))


def prims_ts_bf16_routed_moe(c: Catalogue) -> Any:
    x, axes = c.inputs(PT_BF16_ROUTED, seq_len=5)
    args = (x["topk_ids"], x["hidden_states"], x["gemm1_weights"], x["gemm2_weights"])
    args += (8, 2, None, None, 128, int(x["local_expert_offset"]), 8)
    kwargs = {"routed_scaling_factor": None, "routing_method_type": 1, "gemm1_lora_delta": None}
    return _call(PT_BF16_ROUTED, args, kwargs | _bf16_moe_tail(c, PT_BF16_ROUTED, axes))


PT_BF16_PARTITIONED = "prims_ts_bf16_moe_partitioned_renorm_tpnn_topk2_e8_h256_i128"


def prims_ts_bf16_moe_partitioned(c: Catalogue) -> Any:
    from flashinfer.prims_ts.moe.partition import MoePartitionResources

    # Its streams must be green contexts of a GPU; the routed call never reads them.
    resources = object.__new__(MoePartitionResources)
    x, axes = c.inputs(PT_BF16_PARTITIONED, seq_len=5)
    gemm1 = (x["gemm1_weights_0"], x["gemm1_weights_1"])
    gemm2 = (x["gemm2_weights_0"], x["gemm2_weights_1"])
    args = (x["routing_logits"].bfloat16(), None, None, None, x["hidden_states"], gemm1, gemm2)
    args += (8, 2, None, None, 128, 0, 8, resources, "tp_n_tp_n")
    kwargs = {"routed_scaling_factor": None, "routing_method_type": 1, "norm_topk_prob": True}
    return _call(PT_BF16_PARTITIONED, args, kwargs | _bf16_moe_tail(c, PT_BF16_PARTITIONED, axes))


PT_FP4_RENORM = "prims_ts_fp4_block_scale_moe_renorm_topk2_e8_h256_i128"
PT_FP4_ROUTED = "prims_ts_fp4_block_scale_routed_moe_topk2_e8_h256"


def _prims_ts_fp4_weights(x: dict) -> tuple:
    """``_fp4_weights`` with the three output scales Prims-TS requires, at ones."""
    ones = torch.ones(8)
    return _fp4_weights(x)[:-3] + (ones, ones.clone(), ones.clone())


def _prims_ts_fp4_tail() -> dict:
    kwargs: dict = {"weight_layout": 0, "do_finalize": True, "enable_pdl": True}
    kwargs |= {"activation_type": 3, "per_token_scale": None, "output": None}
    return kwargs | {"tune_max_num_tokens": 1024}


def prims_ts_fp4_block_scale_moe(c: Catalogue) -> Any:
    x, _ = c.inputs(PT_FP4_RENORM, seq_len=5)
    args = (x["routing_logits"].bfloat16(), None, x["hidden_states"])
    args += (*_prims_ts_fp4_weights(x), 8, 2, None, None, 128, 0, 8, None)
    kwargs = {"routing_method_type": 1, "norm_topk_prob": True, "routing_replay_out": None}
    kwargs |= {"routing_input_mode": 0, "topk_ids": None, "topk_weights": None}
    kwargs |= {"num_fused_shared_experts": 0}
    return _call(PT_FP4_RENORM, args, kwargs | _prims_ts_fp4_tail())


def prims_ts_fp4_block_scale_routed_moe(c: Catalogue) -> Any:
    x, _ = c.inputs(PT_FP4_ROUTED, seq_len=5)
    args = (x["topk_ids"], None, x["hidden_states"], *_prims_ts_fp4_weights(x))
    args += (8, 2, None, None, 128, int(x["local_expert_offset"]), 8, 1.0)
    return _call(PT_FP4_ROUTED, args, {"routing_method_type": 1} | _prims_ts_fp4_tail())


PT_FP4_PARTITIONED = "prims_ts_fp4_block_scale_moe_partitioned_renorm_tpnn_topk2_e8_h256_i128"


def prims_ts_fp4_block_scale_moe_partitioned(c: Catalogue) -> Any:
    from flashinfer.prims_ts.moe.partition import MoePartitionResources

    # Its streams must be green contexts of a GPU; the routed call never reads them.
    resources = object.__new__(MoePartitionResources)
    x, _ = c.inputs(PT_FP4_PARTITIONED, seq_len=5)

    def pair(key: str) -> tuple:
        return (x[f"{key}_0"].view(torch.uint8), x[f"{key}_1"].view(torch.uint8))

    ones = torch.ones(8)
    args = (x["routing_logits"].bfloat16(), None, None, None, x["hidden_states"], None)
    args += (pair("gemm1_weights"), pair("gemm1_weights_scale"), pair("gemm2_weights"))
    args += (pair("gemm2_weights_scale"), ones, ones.clone(), ones.clone())
    args += (8, 2, None, None, 128, 0, 8, resources, "tp_n_tp_n")
    kwargs = {"routed_scaling_factor": None, "routing_method_type": 1, "norm_topk_prob": True}
    kwargs |= {"routing_replay_out": None, "gemm1_alpha": x.get("gemm1_alpha")}
    kwargs |= {"gemm1_beta": x.get("gemm1_beta"), "gemm1_clamp_limit": x.get("gemm1_clamp_limit")}
    return _call(PT_FP4_PARTITIONED, args, kwargs | _prims_ts_fp4_tail())


PT_FP8_PER_TENSOR = "prims_ts_fp8_per_tensor_scale_moe_renorm_topk2_e8_h256_i128"


def prims_ts_fp8_per_tensor_scale_moe(c: Catalogue) -> Any:
    x, axes = c.inputs(PT_FP8_PER_TENSOR, seq_len=5)
    args = (x["routing_logits"], None, x["hidden_states"], x["gemm1_weights"])
    args += (x["output1_scales_scalar"], x["output1_scales_gate_scalar"])
    args += (x["gemm2_weights"], x["output2_scales_scalar"])
    args += (8, 2, None, None, 128, 0, 8, None, False)
    kwargs: dict = {"routing_method_type": 1, "do_finalize": True, "enable_pdl": False}
    kwargs |= {"tune_max_num_tokens": 1024, "activation_type": 3, "norm_topk_prob": True}
    kwargs |= {"routing_replay_out": None, "gemm1_clamp_limit": None, "weight_layout": 0}
    kwargs |= {"fc1_per_channel_weight_scale": None, "fc2_per_channel_weight_scale": None}
    return _call(
        PT_FP8_PER_TENSOR,
        args,
        kwargs | {"output": c.buffer(PT_FP8_PER_TENSOR, "output", axes)},
    )


PT_FP8_PER_TENSOR_PARTITIONED = (
    "prims_ts_fp8_per_tensor_scale_moe_partitioned_renorm_tpnn_topk2_e8_h256_i128"
)


def prims_ts_fp8_per_tensor_scale_moe_partitioned(c: Catalogue) -> Any:
    from flashinfer.prims_ts.moe.partition import MoePartitionResources

    # Its streams must be green contexts of a GPU; the routed call never reads them.
    resources = object.__new__(MoePartitionResources)
    name = PT_FP8_PER_TENSOR_PARTITIONED
    x, axes = c.inputs(name, seq_len=5)
    args = (x["routing_logits"], None, None, None, x["hidden_states"])
    args += ((x["gemm1_weights_0"], x["gemm1_weights_1"]), x["output1_scales_scalar"])
    args += (x["output1_scales_gate_scalar"], (x["gemm2_weights_0"], x["gemm2_weights_1"]))
    args += (x["output2_scales_scalar"], 8, 2, None, None, 128, 0, 8, resources, "tp_n_tp_n")
    kwargs: dict = {"routed_scaling_factor": None, "use_routing_scales_on_input": False}
    kwargs |= {"routing_method_type": 1, "do_finalize": True, "enable_pdl": False}
    kwargs |= {"tune_max_num_tokens": 1024, "activation_type": 3, "norm_topk_prob": True}
    kwargs |= {"routing_replay_out": None, "weight_layout": 0}
    return _call(name, args, kwargs | {"output": c.buffer(name, "output", axes)})


PT_FP8_BLOCK_DS = "prims_ts_fp8_block_scale_moe_ds_routing_topk4_ng4_kg2_e8_h256_i128"
PT_FP8_BLOCK_ROUTED = "prims_ts_fp8_block_scale_routed_moe_topk2_e8_h256"


def _prims_ts_fp8_block_tail(c: Catalogue, name: str, axes: dict) -> dict:
    """The keywords both Prims-TS FP8 block-scale APIs take, at values the families route."""
    from flashinfer.fused_moe import Fp8QuantizationType

    kwargs: dict = {"use_shuffled_weight": True, "weight_layout": 0, "do_finalize": True}
    kwargs |= {"enable_pdl": False, "tune_max_num_tokens": 1024, "activation_type": 3}
    kwargs |= {"fp8_quantization_type": Fp8QuantizationType.DeepSeekFp8}
    kwargs |= {"gemm1_alpha": None, "gemm1_beta": None, "gemm1_clamp_limit": None}
    kwargs |= {"gemm1_bias": None, "gemm2_bias": None}
    return kwargs | {"output": c.buffer(name, "output", axes)}


def _prims_ts_fp8_block_tensors(x: dict) -> tuple:
    """From hidden_states to gemm2_weights_scale."""
    args = (x["hidden_states"], x["hidden_states_scale"], x["gemm1_weights"])
    return args + (x["gemm1_weights_scale"], x["gemm2_weights"], x["gemm2_weights_scale"])


def prims_ts_fp8_block_scale_moe(c: Catalogue) -> Any:
    x, axes = c.inputs(PT_FP8_BLOCK_DS, seq_len=5)
    # float32 logits, which Prims-TS takes for DeepSeek-V3 routing as well as bfloat16 ones.
    args = (x["routing_logits"], x["routing_bias"], *_prims_ts_fp8_block_tensors(x))
    args += (16, 4, 4, 2, 128, int(x["local_expert_offset"]), 8)
    args += (float(x["routed_scaling_factor"]),)
    kwargs = {"routing_method_type": 2, "num_fused_shared_experts": 0, "norm_topk_prob": True}
    kwargs |= {"routing_replay_out": None}
    return _call(PT_FP8_BLOCK_DS, args, kwargs | _prims_ts_fp8_block_tail(c, PT_FP8_BLOCK_DS, axes))


def prims_ts_fp8_block_scale_routed_moe(c: Catalogue) -> Any:
    name = PT_FP8_BLOCK_ROUTED
    x, axes = c.inputs(name, seq_len=5)
    args = (x["topk_ids"], torch.zeros(16), *_prims_ts_fp8_block_tensors(x))
    args += (16, 2, 1, 1, 128, int(x["local_expert_offset"]), 8, 1.0)
    kwargs = {"routing_method_type": 2, "gemm1_lora_delta": None}
    return _call(name, args, kwargs | _prims_ts_fp8_block_tail(c, name, axes))


PT_FP8_BLOCK_PARTITIONED = "prims_ts_fp8_block_scale_moe_partitioned_renorm_tpnn_topk2_e8_h256_i128"


def prims_ts_fp8_block_scale_moe_partitioned(c: Catalogue) -> Any:
    from flashinfer.fused_moe import Fp8QuantizationType
    from flashinfer.prims_ts.moe.partition import MoePartitionResources

    # Its streams must be green contexts of a GPU; the routed call never reads them.
    resources = object.__new__(MoePartitionResources)
    name = PT_FP8_BLOCK_PARTITIONED
    x, axes = c.inputs(name, seq_len=5)

    def pair(key: str, u8: bool = False) -> tuple:
        shards = (x[f"{key}_0"], x[f"{key}_1"])
        return tuple(s.view(torch.uint8) for s in shards) if u8 else shards

    # float32 logits, and the activation scales as the flat storage FlashInfer's template
    # describes.
    args = (x["routing_logits"], None, None, None, x["hidden_states"])
    args += (x["hidden_states_scale"].view(torch.uint8).flatten(), pair("gemm1_weights"))
    args += (pair("gemm1_weights_scale", True), pair("gemm2_weights"))
    args += (pair("gemm2_weights_scale", True), 8, 2, None, None, 128, 0, 8)
    args += (resources, "tp_n_tp_n")
    kwargs: dict = {"routed_scaling_factor": None, "routing_method_type": 1}
    kwargs |= {"use_shuffled_weight": True, "weight_layout": 0, "do_finalize": True}
    kwargs |= {"enable_pdl": False, "tune_max_num_tokens": 1024}
    kwargs |= {"fp8_quantization_type": Fp8QuantizationType.MxFp8, "activation_type": 3}
    kwargs |= {"norm_topk_prob": True, "routing_replay_out": None}
    kwargs |= {"output": c.buffer(name, "output", axes), "gemm1_alpha": x.get("gemm1_alpha")}
    kwargs |= {"gemm1_beta": x.get("gemm1_beta"), "gemm1_clamp_limit": x.get("gemm1_clamp_limit")}
    return _call(name, args, kwargs)


SM90_SCALES = "sm90_mixed_gemm_scale_interleave_g32_i8"
SM90_WEIGHTS = "sm90_mixed_gemm_weight_interleave_fp4_fp8"


def sm90_scale_interleave(c: Catalogue) -> Any:
    x, _ = c.inputs(SM90_SCALES, num_experts=2, m64_blocks=2, k128_blocks=2)
    # FlashInfer's logical [E, rows, K / 32] uint8 scales.
    scales = x["scales"].reshape(2, 128, 8).view(torch.uint8)
    return _call(SM90_SCALES, (scales,), {"group_size": 32})


def sm90_weight_interleave(c: Catalogue) -> Any:
    x, _ = c.inputs(SM90_WEIGHTS, num_experts=2, row_blocks=2, k_blocks=2)
    # FlashInfer's [E, rows, K / 2] uint8 bytes.
    weight = x["weight"].reshape(2, 32, 64).view(torch.uint8)
    return _call(SM90_WEIGHTS, (weight,), {"quant_type": "fp4_fp8"})


CUTE_DSL_BF16 = "cute_dsl_fused_moe_bf16_e8_h256_i128_topk2"


def cute_dsl_fused_moe_bf16(c: Catalogue) -> Any:
    x, axes = c.inputs(CUTE_DSL_BF16, seq_len=5)
    args = (x["x"], x["token_selected_experts"], x["token_final_scales"])
    args += (x["w1_weight"], x["w2_weight"], 8, 2)
    kwargs: dict = {"num_local_experts": 8, "local_expert_offset": int(x["local_expert_offset"])}
    kwargs |= {"use_fused_finalize": False, "moe_output": c.buffer(CUTE_DSL_BF16, "output", axes)}
    kwargs |= {"enable_pdl": False, "activation_type": 3}
    kwargs |= {"swiglu_alpha": float(x["swiglu_alpha"]), "swiglu_beta": float(x["swiglu_beta"])}
    kwargs |= {"swiglu_limit": float(x["swiglu_limit"]), "situ_beta": None}
    kwargs |= {"situ_linear_beta": None, "intermediate_buffer": None, "tactic": None}
    return _call(CUTE_DSL_BF16, args, kwargs)


CUTE_DSL_W4A4 = "cute_dsl_fused_moe_w4a4_e8_h256_i128_topk2"


def cute_dsl_fused_moe(c: Catalogue) -> Any:
    x, axes = c.inputs(CUTE_DSL_W4A4, seq_len=5)
    u8 = torch.uint8
    # FlashInfer's uint8 bytes; the activation's scales as its runner passes them, [T, H / 16, 1].
    args = (x["x"].view(u8), x["x_sf"].view(u8).unsqueeze(-1), x["token_selected_experts"])
    args += (x["token_final_scales"], x["w1_weight"].view(u8), x["w1_weight_sf"].view(u8))
    args += (x["w1_alpha"], x["fc2_input_scale"].reshape(1), x["w2_weight"].view(u8))
    args += (x["w2_weight_sf"].view(u8), x["w2_alpha"], 8, 2)
    kwargs: dict = {"num_local_experts": 8, "local_expert_offset": int(x["local_expert_offset"])}
    kwargs |= {"output_dtype": torch.bfloat16, "use_fused_finalize": False}
    kwargs |= {"moe_output": c.buffer(CUTE_DSL_W4A4, "output", axes), "aux_stream": None}
    kwargs |= {"enable_pdl": False, "activation_type": 3}
    kwargs |= {"swiglu_alpha": float(x["swiglu_alpha"]), "swiglu_beta": float(x["swiglu_beta"])}
    kwargs |= {"swiglu_limit": float(x["swiglu_limit"]), "situ_beta": None}
    kwargs |= {"situ_linear_beta": None, "quant_mode": "w4a4", "per_token_scale": None}
    kwargs |= {"tactic": None, "localized_weights": None, "localized_streams": None}
    kwargs |= {"localized_sm_count": None, "localized_memset_stream": None}
    kwargs |= {"localized_allow_nonlocalized": False, "autotune_use_cuda_graph": False}
    return _call(CUTE_DSL_W4A4, args, kwargs)


CUTE_DSL_NVFP4 = "cute_dsl_fused_moe_nvfp4_e8_h256_i128_topk2"
CUTE_DSL_WRAPPER = "cute_dsl_moe_wrapper_w4a4_e8_h256_i128_topk2"


def cute_dsl_fused_moe_nvfp4(c: Catalogue) -> Any:
    call = cute_dsl_fused_moe(c)
    kwargs = {k: v for k, v in call.kwargs.items() if k != "tactic"}
    return _call(CUTE_DSL_NVFP4, call.args, kwargs)


def cute_dsl_moe_wrapper(c: Catalogue) -> Any:
    from flashinfer.fused_moe import ActivationType, CuteDslMoEWrapper

    x, _ = c.inputs(CUTE_DSL_WRAPPER, seq_len=5)
    # What CuteDslMoEWrapper.__init__ keeps (it needs an SM100 GPU to run).
    wrapper = object.__new__(CuteDslMoEWrapper)
    wrapper.__dict__ |= {"num_experts": 8, "top_k": 2, "num_local_experts": 8}
    wrapper.__dict__ |= {"hidden_size": 256, "intermediate_size": 128, "quant_mode": "w4a4"}
    wrapper.__dict__ |= {"local_expert_offset": int(x["local_expert_offset"])}
    wrapper.__dict__ |= {"output_dtype": torch.bfloat16, "activation_type": ActivationType.Swiglu}
    wrapper.__dict__ |= {"swiglu_alpha": float(x["swiglu_alpha"])}
    wrapper.__dict__ |= {"swiglu_beta": float(x["swiglu_beta"])}
    wrapper.__dict__ |= {"swiglu_limit": float(x["swiglu_limit"])}
    wrapper.__dict__ |= {"situ_beta": None, "situ_linear_beta": None}
    u8 = torch.uint8
    args = (wrapper, x["x"].view(u8), x["x_sf"].view(u8), x["token_selected_experts"])
    args += (x["token_final_scales"], x["w1_weight"].view(u8), x["w1_weight_sf"].view(u8))
    args += (x["w1_alpha"], x["fc2_input_scale"].reshape(1), x["w2_weight"].view(u8))
    args += (x["w2_weight_sf"].view(u8), x["w2_alpha"])
    return _call(CUTE_DSL_WRAPPER, args, {"tactic": None, "per_token_scale": None})


CUTE_DSL_W4A8 = "cute_dsl_fused_moe_mxfp8_mxfp4_e8_h256_i128_topk2"
CUTE_DSL_W4A8_WRAPPER = "cute_dsl_mxfp8_mxfp4_moe_wrapper_e8_h256_i128_topk2"


def _w4a8_tensors(x: dict) -> tuple:
    """From x to w2_alpha, as FlashInfer takes them (uint8 bytes), less the wrapper's."""
    u8 = torch.uint8
    args = (x["x"], x["x_sf"].view(u8), x["token_selected_experts"], x["token_final_scales"])
    args += (x["w1_weight"].view(u8), x["w1_weight_sf"].view(u8), x["w1_alpha"])
    return args + (x["w2_weight"].view(u8), x["w2_weight_sf"].view(u8), x["w2_alpha"])


def cute_dsl_fused_moe_mxfp8_mxfp4(c: Catalogue) -> Any:
    x, axes = c.inputs(CUTE_DSL_W4A8, seq_len=5)
    args = _w4a8_tensors(x) + (8, 2)
    kwargs: dict = {"num_local_experts": 8, "local_expert_offset": int(x["local_expert_offset"])}
    kwargs |= {"moe_output": c.buffer(CUTE_DSL_W4A8, "output", axes), "aux_stream": None}
    kwargs |= {"tactic": None, "enable_pdl": False, "activation_type": 3}
    kwargs |= {"swiglu_alpha": float(x["swiglu_alpha"]), "swiglu_beta": float(x["swiglu_beta"])}
    return _call(CUTE_DSL_W4A8, args, kwargs | {"swiglu_limit": float(x["swiglu_limit"])})


def cute_dsl_mxfp8_mxfp4_moe_wrapper(c: Catalogue) -> Any:
    from flashinfer.fused_moe import ActivationType, CuteDslMxfp8Mxfp4MoEWrapper

    x, _ = c.inputs(CUTE_DSL_W4A8_WRAPPER, seq_len=5)
    # What the wrapper's __init__ keeps (it needs an SM100 GPU to run).
    wrapper = object.__new__(CuteDslMxfp8Mxfp4MoEWrapper)
    wrapper.__dict__ |= {"num_experts": 8, "top_k": 2, "num_local_experts": 8}
    wrapper.__dict__ |= {"hidden_size": 256, "intermediate_size": 128, "quant_mode": "w4a8"}
    wrapper.__dict__ |= {"local_expert_offset": int(x["local_expert_offset"])}
    wrapper.__dict__ |= {"output_dtype": torch.bfloat16, "activation_type": ActivationType.Swiglu}
    wrapper.__dict__ |= {"swiglu_alpha": float(x["swiglu_alpha"])}
    wrapper.__dict__ |= {"swiglu_beta": float(x["swiglu_beta"])}
    wrapper.__dict__ |= {"swiglu_limit": float(x["swiglu_limit"])}
    wrapper.__dict__ |= {"situ_beta": None, "situ_linear_beta": None}
    return _call(CUTE_DSL_W4A8_WRAPPER, (wrapper,) + _w4a8_tensors(x), {"tactic": None})


B12X = "b12x_fused_moe_nvfp4_e8_h256_i128_topk2"
B12X_WRAPPER = "b12x_moe_wrapper_nvfp4_e8_h256_i128_topk2"


def _b12x_tensors(x: dict) -> tuple[tuple, dict]:
    """The tensors as FlashInfer takes them: uint8 bytes, one shared FC2 input scale, and the
    FC1 input scale given apart from w1_alpha (the definition's fc1_alpha is their product)."""
    u8 = torch.uint8
    args = (x["x"], x["w1_weight"].view(u8), x["w1_weight_sf"].view(u8))
    args += (x["w2_weight"].view(u8), x["w2_weight_sf"].view(u8))
    args += (x["token_selected_experts"], x["token_final_scales"])
    igs = x["fc1_input_scale"]
    kwargs = {"w1_alpha": x["fc1_alpha"] / igs, "w2_alpha": x["w2_alpha"]}
    kwargs |= {"fc2_input_scale": x["fc2_input_scale"][:1].clone(), "input_global_scale": igs}
    return args, kwargs


def b12x_fused_moe(c: Catalogue) -> Any:
    x, axes = c.inputs(B12X, seq_len=5)
    args, kwargs = _b12x_tensors(x)
    kwargs |= {"num_local_experts": 8, "expert_map": None}
    kwargs |= {"output": c.buffer(B12X, "output", axes), "output_dtype": torch.bfloat16}
    kwargs |= {"activation": "swigluoai_uninterleave", "swiglu_alpha": float(x["swiglu_alpha"])}
    kwargs |= {"swiglu_beta": float(x["swiglu_beta"]), "swiglu_limit": float(x["swiglu_limit"])}
    kwargs |= {"activation_precision": "fp4", "quant_mode": "nvfp4", "source_format": "modelopt"}
    return _call(B12X, args + (8, 2), kwargs)


def b12x_moe_wrapper(c: Catalogue) -> Any:
    from flashinfer.fused_moe import B12xMoEWrapper

    x, _ = c.inputs(B12X_WRAPPER, seq_len=5)
    # What B12xMoEWrapper.__init__ keeps (it needs an SM120 GPU to run).
    wrapper = object.__new__(B12xMoEWrapper)
    wrapper.__dict__ |= {"num_experts": 8, "top_k": 2, "num_local_experts": 8}
    wrapper.__dict__ |= {"hidden_size": 256, "intermediate_size": 128, "quant_mode": "nvfp4"}
    wrapper.__dict__ |= {"activation_precision": "fp4", "source_format": "modelopt"}
    wrapper.__dict__ |= {"expert_map": None, "output_dtype": torch.bfloat16}
    wrapper.__dict__ |= {"activation": "swigluoai_uninterleave"}
    wrapper.__dict__ |= {"swiglu_alpha": float(x["swiglu_alpha"])}
    wrapper.__dict__ |= {"swiglu_beta": float(x["swiglu_beta"])}
    wrapper.__dict__ |= {"swiglu_limit": float(x["swiglu_limit"])}
    args, kwargs = _b12x_tensors(x)
    return _call(B12X_WRAPPER, (wrapper,) + args, kwargs)


MONO_MOE = "mono_moe_e8_h256_i128_topk2"


def mono_moe(c: Catalogue) -> Any:
    x, axes = c.inputs(MONO_MOE, seq_len=3)
    args = (x["activations_in"], x["router_logits"], x["expert_weights_up"])
    args += (x["expert_scales_up"], x["expert_weights_down"], x["expert_scales_down"], 2)
    kwargs = {"scoring_func": "softmax", "renormalize": True}
    kwargs |= {"out": c.buffer(MONO_MOE, "output", axes), "scratchpad": None}
    return _call(MONO_MOE, args, kwargs | {"interleave_up": True})


HUMMING = "sm90_mixed_gemm_humming_preprocess_r11"


def humming_preprocess(c: Catalogue) -> Any:
    x, _ = c.inputs(HUMMING, num_experts=2, row_blocks=4, k_blocks=2, m64_blocks=1, k128_blocks=1)
    # FlashInfer's [E, rows, K / 2] and [E, rows, K / 32] uint8 bytes.
    weight = x["weight"].reshape(2, 64, 64).view(torch.uint8)
    raw_scale = x["raw_scale"].reshape(2, 64, 4).view(torch.uint8)
    return _call(HUMMING, (weight, raw_scale, 11), {"interleave": True})


ALPHAMOE_INTERLEAVE = "alphamoe_interleave_gated_weights_h256_i128"


def alphamoe_interleave(c: Catalogue) -> Any:
    x, _ = c.inputs(ALPHAMOE_INTERLEAVE, num_experts=4)
    return _call(ALPHAMOE_INTERLEAVE, (x["gemm1_weights"], x["gemm1_weights_scale"]))


ROUTABLE: dict[str, Callable[[Any], Any]] = {
    "flashinfer.fused_moe.alphamoe_interleave_gated_weights": alphamoe_interleave,
    "flashinfer.fused_moe.interleave_moe_scales_for_sm90_mixed_gemm": sm90_scale_interleave,
    "flashinfer.fused_moe.interleave_moe_weights_for_sm90_mixed_gemm": sm90_weight_interleave,
    "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_moe": prims_ts_bf16_moe,
    "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_routed_moe": prims_ts_bf16_routed_moe,
    "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_moe_partitioned": (
        prims_ts_bf16_moe_partitioned
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp4_op.prims_ts_fp4_block_scale_moe": (
        prims_ts_fp4_block_scale_moe
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp4_op.prims_ts_fp4_block_scale_routed_moe": (
        prims_ts_fp4_block_scale_routed_moe
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp4_op.prims_ts_fp4_block_scale_moe_partitioned": (
        prims_ts_fp4_block_scale_moe_partitioned
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_per_tensor_scale_moe": (
        prims_ts_fp8_per_tensor_scale_moe
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_per_tensor_scale_moe_partitioned": (
        prims_ts_fp8_per_tensor_scale_moe_partitioned
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_block_scale_moe": (
        prims_ts_fp8_block_scale_moe
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_block_scale_routed_moe": (
        prims_ts_fp8_block_scale_routed_moe
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_block_scale_moe_partitioned": (
        prims_ts_fp8_block_scale_moe_partitioned
    ),
    "flashinfer.fused_moe.fused_topk_deepseek": fused_topk_deepseek,
    "flashinfer.fused_moe.hash_topk.hash_topk": hash_topk,
    "flashinfer.fused_moe.trtllm_fp4_block_scale_moe": trtllm_fp4_block_scale_moe,
    "flashinfer.fused_moe.trtllm_fp4_block_scale_routed_moe": trtllm_fp4_block_scale_routed_moe,
    "flashinfer.fused_moe.trtllm_bf16_moe": trtllm_bf16_moe,
    "flashinfer.fused_moe.trtllm_bf16_routed_moe": trtllm_bf16_routed_moe,
    "flashinfer.fused_moe.trtllm_fp8_block_scale_routed_moe": fp8_block_scale_routed_moe,
    "flashinfer.fused_moe.trtllm_fp8_per_tensor_scale_routed_moe": fp8_per_tensor_scale_routed_moe,
    "flashinfer.fused_moe.cutlass_fused_moe": cutlass_fused_moe,
    "flashinfer.fused_moe.cute_dsl_fused_moe_bf16": cute_dsl_fused_moe_bf16,
    "flashinfer.fused_moe.cute_dsl_fused_moe": cute_dsl_fused_moe,
    "flashinfer.fused_moe.cute_dsl_fused_moe_nvfp4": cute_dsl_fused_moe_nvfp4,
    "flashinfer.fused_moe.CuteDslMoEWrapper.run": cute_dsl_moe_wrapper,
    "flashinfer.fused_moe.cute_dsl_fused_moe_mxfp8_mxfp4": cute_dsl_fused_moe_mxfp8_mxfp4,
    "flashinfer.fused_moe.CuteDslMxfp8Mxfp4MoEWrapper.run": cute_dsl_mxfp8_mxfp4_moe_wrapper,
    "flashinfer.fused_moe.b12x_fused_moe": b12x_fused_moe,
    "flashinfer.fused_moe.mono_moe": mono_moe,
    "flashinfer.fused_moe.preprocess_moe_weights_for_sm90_mixed_gemm_humming": humming_preprocess,
    "flashinfer.fused_moe.B12xMoEWrapper.run": b12x_moe_wrapper,
    "flashinfer.gemm.mm_bf16": mm_bf16,
    "flashinfer.gemm.bmm_bf16": bmm_bf16,
    "flashinfer.gemm.tinygemm_bf16": tinygemm_bf16,
    "flashinfer.gemm.mm_M1_16_K7168_N256": router(ROUTER_7168),
    "flashinfer.gemm.mm_M1_16_K6144_N256": router(ROUTER_6144),
    "flashinfer.gemm.tgv_gemm_sm100": tgv_gemm,
    "flashinfer.gemm.SegmentGEMMWrapper.run": segment_gemm,
    "flashinfer.gemm.mm_fp8": mm_fp8,
    "flashinfer.gemm.bmm_fp8": bmm_fp8,
    "flashinfer.gemm.gemm_fp8_nt_groupwise": gemm_fp8_nt_groupwise,
    "flashinfer.gemm.group_gemm_fp8_nt_groupwise_contiguous": group_gemm_fp8,
    "flashinfer.gemm.batch_deepgemm_fp8_nt_groupwise": batch_deepgemm,
    "flashinfer.gemm.fp8_blockscale_gemm_sm90": fp8_blockscale_gemm_sm90,
    "flashinfer.gemm.mm_fp4": mm_fp4,
    "flashinfer.gemm.mm_mxfp8": mm_mxfp8,
    "flashinfer.gemm.bmm_mxfp8": bmm_mxfp8,
    "flashinfer.gemm.gemm_svdquant.mm_nvfp4_svdquant": mm_nvfp4_svdquant,
    "flashinfer.gemm.gemm_svdquant.svdquant_linear": svdquant_linear,
    "flashinfer.gemm.gemm_bf16_fp4.mm_bf16_fp4": mm_bf16_fp4,
    "flashinfer.gemm.kernels.grouped_gemm_masked_wrapper.grouped_gemm_nt_masked": (
        grouped_gemm_nt_masked
    ),
}
