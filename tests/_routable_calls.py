"""One call per patched FlashInfer API that gives every parameter and is routed.

Each builder returns a ``Call``: the definition it is for, the arguments of the API's run
(every parameter of the real signature given explicitly, ``*args`` left empty), those of its
``plan`` for a wrapper (every parameter, the keywords of ``**kwargs`` included), and the
state the wrapper's constructor leaves (its KV layout). Every value is one the definition's
rules accept, so apply routes the call: a non-default value where a rule allows one
(an ignored launch option, ``window_left=-1``, ``q_len_per_req=1``, an explicit
``sm_scale``), the default otherwise. Tensors come from the definition's own input
generator, small; the MoE layers take gigabytes of weights, so theirs are meta tensors
(nothing of their rules reads a value).

``test_flashinfer_apply.py`` checks that each call gives every parameter and is a hit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fibgen.runtime.inputs.make import InputSpec, generate_inputs_with_axes, torch_dtype


@dataclass
class Call:
    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    plan: tuple[tuple, dict] | None = None
    state: dict = field(default_factory=dict)


class Catalogue:
    """The compiled catalogue's definitions and families, and inputs made for them."""

    def __init__(self, module: Any) -> None:
        self.defs = {d.name: d for d in module.definitions}
        self.families = {f.name: f for f in module.families()}

    def inputs(self, name: str, seed: int = 0, **axes: int) -> tuple[dict, dict]:
        d = self.defs[name]
        spec = InputSpec.from_ir(d, self.families[d.family])
        return generate_inputs_with_axes(spec, axes, seed=seed)

    def buffer(self, name: str, output: str, axes: dict, device: str = "cpu") -> torch.Tensor:
        (t,) = [t for t in self.defs[name].outputs if t.name == output]
        return torch.zeros([axes[a] for a in t.shape], dtype=torch_dtype(t.dtype), device=device)

    def meta_inputs(self, name: str, **axes: int) -> tuple[dict, dict]:
        d = self.defs[name]
        sizes = {a.name: a.value for a in d.axes if a.value is not None} | axes
        out = {}
        for t in d.inputs:
            if t.shape is not None:
                shape = [sizes[a] for a in t.shape]
                out[t.name] = torch.empty(shape, dtype=torch_dtype(t.dtype), device="meta")
        return out, sizes

    def input_bytes(self, name: str, **axes: int) -> int:
        """The bytes of a definition's inputs at its const axes and ``axes`` (1 elsewhere)."""
        d = self.defs[name]
        sizes = {a.name: a.value for a in d.axes if a.value is not None} | axes
        total = 0
        for t in d.inputs:
            if t.shape is not None:
                n = math.prod(sizes.get(a, 1) for a in t.shape)
                total += n * torch_dtype(t.dtype).itemsize
        return total

    def param(self, name: str, key: str) -> Any:
        return dict(self.defs[name].param_values)[key]


def _norm(fn: str, name: str, with_out: bool) -> Callable[[Catalogue], Call]:
    def build(c: Catalogue) -> Call:
        x, axes = c.inputs(name, batch_size=3)
        kwargs: dict = {"eps": c.param(name, "EPS"), "enable_pdl": True}
        args = [x["hidden_states"]]
        if fn == "fused_add_rmsnorm":
            args.append(x["residual"])
        args.append(x["weight"])
        if with_out:
            kwargs["out"] = c.buffer(name, "output", axes)
        return Call(name, tuple(args), kwargs)

    return build


def _layernorm(c: Catalogue) -> Call:
    name = "layernorm_h768"
    x, _ = c.inputs(name, batch_size=3)
    kwargs = {"gemma": x["weight"], "beta": x["bias"], "eps": c.param(name, "EPS")}
    return Call(name, (x["hidden_states"],), kwargs)


def _act(fn: str) -> Callable[[Catalogue], Call]:
    def build(c: Catalogue) -> Call:
        name = min((n for n in c.defs if n.startswith(fn) and n.endswith("_bf16")), key=len)
        x, axes = c.inputs(name, num_tokens=2)
        return Call(name, (x["x"],), {"out": c.buffer(name, "output", axes), "enable_pdl": True})

    return build


def _merge_state(c: Catalogue) -> Call:
    name = "merge_state_h32_d128"
    x, _ = c.inputs(name, seq_len=3)
    return Call(name, (x["v_a"], x["s_a"], x["v_b"], x["s_b"]))


def _append(c: Catalogue) -> Call:
    name = "append_paged_kv_cache_kv8_d128_ps16"
    x, _ = c.inputs(name, nnz=3, batch_size=2, num_pages=32)
    args = (x["append_key"], x["append_value"], x["batch_indices"], x["positions"])
    args += ((x["k_cache"], x["v_cache"]), x["kv_indices"], x["kv_indptr"], x["kv_last_page_len"])
    return Call(name, args, {"kv_layout": "NHD"})


def _rope(c: Catalogue) -> Call:
    name = "rope_with_cos_sin_cache_neox_style_d128_rd64"
    x, _ = c.inputs(name, num_tokens=3, num_qo_heads=4, num_kv_heads=2, max_seq_len=16)
    query, key = x["q"].flatten(1), x["k"].flatten(1)  # FlashInfer's layout: heads flattened
    return Call(name, (x["positions"], query, key, 128, x["cos_sin_cache"]), {"is_neox": True})


def _sampling(fn: str) -> Callable[[Catalogue], Call]:
    def build(c: Catalogue) -> Call:
        name = f"{fn}_v128256"
        x, _ = c.inputs(name, batch_size=2)
        args: tuple = (x["probs"],)
        if "top_k" in fn:
            args += (5,)
        if "top_p" in fn:
            args += (0.9,)
        kwargs: dict = {"indices": None}
        if fn == "top_k_top_p_sampling_from_probs":
            kwargs["filter_apply_order"] = "top_k_first"
        kwargs |= {"deterministic": False, "generator": None, "check_nan": True, "seed": None}
        kwargs |= {"offset": None, "return_valid": False}
        return Call(name, args, kwargs)

    return build


def _gdn_decode(c: Catalogue) -> Call:
    name = "gdn_decode_qk4_v8_d128_k_last"
    x, axes = c.inputs(name, batch_size=2)
    args = tuple(x[k] for k in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b"))
    kwargs = {"scale": x["scale"], "output": c.buffer(name, "output", axes)}
    kwargs |= {"use_qk_l2norm": False, "backend": "auto"}
    return Call(name, args, kwargs)


def _gdn_mtp(c: Catalogue) -> Call:
    name = "gdn_mtp_qk4_v8_d128_k_last"
    x, axes = c.inputs(name, batch_size=2, seq_len=3, pool_size=4)
    names = ("q", "k", "v", "initial_state", "initial_state_indices", "A_log", "a", "dt_bias")
    args = tuple(x[k] for k in names) + (x["b"],)
    kwargs: dict = {"scale": x["scale"], "output": c.buffer(name, "output", axes)}
    # With a buffer, FlashInfer 0.7.2 writes by batch row, the definition by slot: refused.
    kwargs |= {"intermediate_states_buffer": None}
    kwargs |= {"ssm_state_indices": None, "disable_state_update": True, "use_qk_l2norm": True}
    kwargs |= {"output_state_indices": None, "cache_replayssm": False}
    kwargs |= {f"replayssm_{k}": None for k in ("rawv", "rawk", "g", "beta")}
    return Call(name, args, kwargs)


def _mamba(c: Catalogue) -> Call:
    name = "mamba_ssu_decode_h64_d64_s128_ng4"
    x, axes = c.inputs(name, batch_size=2, state_cache_size=3)
    # One value per head, broadcast over head_dim (and dstate) as FlashInfer takes them.
    x["A"] = x["A"][:, :1, :1].expand_as(x["A"])
    x["dt"] = x["dt"][..., :1].expand_as(x["dt"])
    x["D"] = x["D"][:, :1].expand_as(x["D"])
    x["dt_bias"] = x["dt_bias"][:, :1].expand_as(x["dt_bias"])
    args = tuple(x[k] for k in ("state", "x", "dt", "A", "B", "C", "D"))
    kwargs: dict = {"z": None, "dt_bias": x["dt_bias"], "dt_softplus": True}
    kwargs |= {"state_batch_indices": x["state_batch_indices"], "pad_slot_id": -1}
    kwargs |= {"state_scale": None, "out": c.buffer(name, "output", axes)}
    kwargs |= {"disable_state_update": False, "intermediate_states_buffer": None}
    kwargs |= {"intermediate_state_indices": None, "intermediate_state_scales": None}
    kwargs |= {"rand_seed": None, "philox_rounds": 7, "cache_steps": 0, "algorithm": "auto"}
    kwargs |= {"dst_state_batch_indices": None, "cu_seqlens": None, "num_accepted_tokens": None}
    kwargs |= {"backend": "auto"}
    return Call(name, args, kwargs)


def _moe_block_scale(c: Catalogue) -> Call:
    from flashinfer.tllm_enums import ActivationType, Fp8QuantizationType

    name = "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"
    x, sizes = c.meta_inputs(name, seq_len=4)
    names = ("routing_logits", "routing_bias", "hidden_states", "hidden_states_scale")
    names += ("gemm1_weights", "gemm1_weights_scale", "gemm2_weights", "gemm2_weights_scale")
    args = tuple(x[k] for k in names)
    args += (sizes["num_experts"], 8, 8, 4, sizes["intermediate_size"])
    args += (sizes["num_experts"] - sizes["num_local_experts"], sizes["num_local_experts"], 2.5)
    output = torch.empty(4, sizes["hidden_size"], dtype=torch.bfloat16, device="meta")
    kwargs: dict = {"routing_method_type": 2, "use_shuffled_weight": False, "weight_layout": 0}
    kwargs |= {"do_finalize": True, "enable_pdl": True, "tune_max_num_tokens": 1024}
    kwargs |= {"fp8_quantization_type": Fp8QuantizationType.DeepSeekFp8}
    kwargs |= {"num_fused_shared_experts": None, "activation_type": ActivationType.Swiglu.value}
    kwargs |= {"norm_topk_prob": True, "routing_replay_out": None, "gemm1_alpha": None}
    kwargs |= {"gemm1_beta": None, "gemm1_clamp_limit": None, "output": output}
    kwargs |= {"valid_hidden_size": None, "valid_intermediate_size": None}
    kwargs |= {"gemm1_bias": None, "gemm2_bias": None}
    return Call(name, args, kwargs)


def _moe_per_tensor(c: Catalogue) -> Call:
    from flashinfer.tllm_enums import ActivationType

    name = "trtllm_fp8_per_tensor_scale_moe_topk8_e128_h2048_i768"
    x, sizes = c.meta_inputs(name, seq_len=4)
    e = sizes["num_experts"]
    args = (x["routing_logits"], None, x["hidden_states"], x["gemm1_weights"])
    args += (x["output1_scales_scalar"], x["output1_scales_gate_scalar"], x["gemm2_weights"])
    args += (x["output2_scales_scalar"], e, 8, None, None, sizes["intermediate_size"], 0, e, 1.0)
    args += (False,)  # use_routing_scales_on_input
    output = torch.empty(4, sizes["hidden_size"], dtype=torch.bfloat16, device="meta")
    kwargs: dict = {"routing_method_type": 1, "do_finalize": True, "enable_pdl": True}
    kwargs |= {"tune_max_num_tokens": 1024, "activation_type": ActivationType.Swiglu.value}
    kwargs |= {"norm_topk_prob": True, "routing_replay_out": None, "output": output}
    kwargs |= {"gemm1_clamp_limit": None}
    return Call(name, args, kwargs)


# Plan keywords of the paged decode wrapper (its _plan_impl), at values its rules accept.
DECODE_PLAN_KEYWORDS = {
    "pos_encoding_mode": "NONE",
    "window_left": -1,
    "window_right": 0,
    "logits_soft_cap": 0.0,
    "q_data_type": torch.bfloat16,
    "kv_data_type": torch.bfloat16,
    "o_data_type": torch.bfloat16,
    "data_type": torch.bfloat16,
    "sm_scale": 0.1,
    "rope_scale": 2.0,
    "rope_theta": 5e5,
    "non_blocking": False,
    "block_tables": None,
    "seq_lens": None,
    "fixed_split_size": 4,
    "disable_split_kv": True,
    "q_len_per_req": 1,
    "is_causal": False,
}


def _decode(c: Catalogue) -> Call:
    name = "gqa_paged_decode_h16_kv2_d128_ps64"
    x, axes = c.inputs(name, batch_size=3, num_pages=32)
    plan = (x["kv_indptr"], x["kv_indices"], x["kv_last_page_len"], 16, 2, 128, 64)
    kwargs: dict = {"q_scale": None, "k_scale": None, "v_scale": None}
    kwargs |= {"out": c.buffer(name, "output", axes), "lse": c.buffer(name, "lse", axes)}
    kwargs |= {"return_lse": True, "enable_pdl": True, "window_left": -1, "sinks": None}
    kwargs |= {"q_len_per_req": 1, "skip_softmax_threshold_scale_factor": None}
    kwargs |= {"kv_cache_sf": None}
    return Call(
        name,
        (x["q"], (x["k_cache"], x["v_cache"])),
        kwargs,
        (plan, dict(DECODE_PLAN_KEYWORDS)),
        {"_kv_layout": "NHD"},
    )


def _prefill_plan_keywords(head_dim: int, *, ragged: bool) -> dict:
    kwargs: dict = {"head_dim_vo": head_dim, "custom_mask": None, "packed_custom_mask": None}
    kwargs |= {"causal": True, "pos_encoding_mode": "NONE", "use_fp16_qk_reduction": False}
    kwargs |= {"sm_scale": 0.1, "window_left": -1, "logits_soft_cap": 0.0}
    kwargs |= {"rope_scale": 2.0, "rope_theta": 5e5, "q_data_type": torch.bfloat16}
    kwargs |= {"kv_data_type": torch.bfloat16, "o_data_type": torch.bfloat16}
    kwargs |= {"non_blocking": False, "prefix_len_ptr": None, "token_pos_in_items_ptr": None}
    kwargs |= {"token_pos_in_items_len": 0, "max_item_len_ptr": None, "seq_lens": None}
    kwargs |= {"seq_lens_q": None, "max_token_per_sequence": None, "max_sequence_kv": None}
    kwargs |= {"fixed_split_size": 4, "disable_split_kv": True, "uniform_q_len": None}
    if ragged:
        kwargs |= {"v_indptr": None, "o_indptr": None}
    else:
        kwargs["block_tables"] = None
    return kwargs


def _run_keywords(c: Catalogue, name: str, axes: dict) -> dict:
    kwargs: dict = {"q_scale": None, "k_scale": None, "v_scale": None}
    kwargs |= {"out": c.buffer(name, "output", axes), "lse": c.buffer(name, "lse", axes)}
    kwargs |= {"return_lse": True, "lse_base": "log2", "lse_layout": "NH", "enable_pdl": True}
    return kwargs


def _paged_prefill(c: Catalogue) -> Call:
    name = "gqa_paged_prefill_causal_h16_kv2_d128_ps64"
    x, axes = c.inputs(name, len_indptr=3, total_q=5, num_pages=32)
    plan = (x["qo_indptr"], x["kv_indptr"], x["kv_indices"], x["kv_last_page_len"])
    plan += (16, 2, 128, 64)
    kwargs = _run_keywords(c, name, axes)
    kwargs |= {"window_left": -1, "sinks": None, "kv_cache_sf": None}
    kwargs |= {"skip_softmax_threshold_scale_factor": None, "use_fp16_softmax": False}
    kwargs |= {"uses_spcompress": False}
    return Call(
        name,
        (x["q"], (x["k_cache"], x["v_cache"])),
        kwargs,
        (plan, _prefill_plan_keywords(128, ragged=False)),
        {"_kv_layout": "NHD"},
    )


def _ragged_prefill(c: Catalogue) -> Call:
    name = "gqa_ragged_prefill_causal_h16_kv2_d128"
    x, axes = c.inputs(name, len_indptr=3, total_q=5, total_kv=9)
    plan = (x["qo_indptr"], x["kv_indptr"], 16, 2, 128)
    kwargs = _run_keywords(c, name, axes) | {"o_scale": None, "kv_cache_sf": None}
    return Call(
        name,
        (x["q"], x["k"], x["v"]),
        kwargs,
        (plan, _prefill_plan_keywords(128, ragged=True)),
        {"_kv_layout": "NHD"},
    )


def _mla(c: Catalogue) -> Call:
    name = "mla_paged_decode_h16_ckv512_kpe64_ps64"
    x, axes = c.inputs(name, batch_size=3, num_pages=32)
    batch = axes["batch_size"]
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32)
    pages = x["kv_indptr"][1:] - x["kv_indptr"][:-1]
    kv_len_arr = ((pages - 1) * 64 + x["kv_last_page_len"]).to(torch.int32)
    plan_args = (qo_indptr, x["kv_indptr"], x["kv_indices"], kv_len_arr, 16, 512, 64, 64)
    plan_args += (False, 1 / math.sqrt(192), torch.bfloat16, torch.bfloat16, True)
    plan_kwargs: dict = {"metadata": None, "cum_seq_lens_q": None, "block_tables": None}
    plan_kwargs |= {"seq_lens": None, "max_q_len": None, "query_layout": "split"}
    plan_kwargs |= {"kv_cache_layout": "split", "lse_mode": "base2"}
    plan_kwargs |= {"output_dtype": torch.bfloat16, "output_scale": "none"}
    plan_kwargs |= {"scale_mode": "default", "skip_softmax": False, "enable_pdl": True}
    plan_kwargs |= {"use_sinks": False}
    args = (x["q_nope"], x["q_pe"], x["ckv_cache"], x["kpe_cache"])
    args += (c.buffer(name, "output", axes), c.buffer(name, "lse", axes), True)
    args += (None, None, None, False, None)  # profiler_buffer ... o_scale
    kwargs: dict = {"query": None, "kv_cache": None, "ckv_scale": None, "ckv_scale_arr": None}
    kwargs |= {"kpe_scale": None, "sinks": None, "skip_softmax_threshold_scale_factor": None}
    kwargs |= {"bmm1_scale": None, "bmm2_scale": None}
    return Call(name, args, kwargs, (plan_args, plan_kwargs))


ROUTABLE: dict[str, Callable[[Catalogue], Call]] = {
    "flashinfer.norm.rmsnorm": _norm("rmsnorm", "rmsnorm_h128", True),
    "flashinfer.norm.fused_add_rmsnorm": _norm(
        "fused_add_rmsnorm", "fused_add_rmsnorm_h2048", False
    ),
    "flashinfer.norm.gemma_rmsnorm": _norm("gemma_rmsnorm", "gemma_rmsnorm_h2304", True),
    "flashinfer.norm.layernorm": _layernorm,
    "flashinfer.activation.silu_and_mul": _act("silu_and_mul"),
    "flashinfer.activation.gelu_and_mul": _act("gelu_and_mul"),
    "flashinfer.cascade.merge_state": _merge_state,
    "flashinfer.page.append_paged_kv_cache": _append,
    "flashinfer.rope.apply_rope_with_cos_sin_cache_inplace": _rope,
    "flashinfer.sampling.top_k_sampling_from_probs": _sampling("top_k_sampling_from_probs"),
    "flashinfer.sampling.top_p_sampling_from_probs": _sampling("top_p_sampling_from_probs"),
    "flashinfer.sampling.top_k_top_p_sampling_from_probs": _sampling(
        "top_k_top_p_sampling_from_probs"
    ),
    "flashinfer.gdn_decode.gated_delta_rule_decode": _gdn_decode,
    "flashinfer.gdn_decode.gated_delta_rule_mtp": _gdn_mtp,
    "flashinfer.mamba.selective_state_update.selective_state_update": _mamba,
    "flashinfer.fused_moe.trtllm_fp8_block_scale_moe": _moe_block_scale,
    "flashinfer.fused_moe.trtllm_fp8_per_tensor_scale_moe": _moe_per_tensor,
    "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper.run": _decode,
    "flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper.run": _paged_prefill,
    "flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper.run": _ragged_prefill,
    "flashinfer.mla.BatchMLAPagedAttentionWrapper.run": _mla,
}

# The norm, activation and RoPE APIs of norm_*.fidef, activation_*.fidef and rope_*.fidef.
from _routable_norm_rope import ROUTABLE as _NORM_ROPE  # noqa: E402

ROUTABLE |= _NORM_ROPE

# The sampling, top-k and quantization APIs, kept in a module of their own.
from _routable_samp_quant import ROUTABLE as _SAMP_QUANT  # noqa: E402

ROUTABLE |= _SAMP_QUANT

# The attention APIs of attention_single.fidef, attention_cascade.fidef,
# attention_batch.fidef, attention_page.fidef and attention_block_sparse.fidef.
from _routable_attention import ROUTABLE as _ATTENTION  # noqa: E402

ROUTABLE |= _ATTENTION

# The APIs of attention_trtllm.fidef and its neighbours, kept in a module of their own.
from _attn_b_calls import ROUTABLE as _ATTN_B  # noqa: E402

ROUTABLE |= _ATTN_B

# The state-space APIs of ssm_gdn.fidef and ssm_linear.fidef.
from _routable_ssm import ROUTABLE as _SSM  # noqa: E402

ROUTABLE |= _SSM

# The APIs of gemm_*.fidef and moe_*.fidef, kept in a module of their own.
from _gemm_moe_calls import ROUTABLE as _GEMM_MOE  # noqa: E402

ROUTABLE |= _GEMM_MOE

# The PrimTS attention APIs of attention_prims_ts.fidef, kept in a module of their own.
from _prims_ts_calls import ROUTABLE as _PRIMS_TS  # noqa: E402

ROUTABLE |= _PRIMS_TS

# The MiniMax-H3 APIs of minimax_h3.fidef, kept in a module of their own.
from _routable_minimax import ROUTABLE as _MINIMAX  # noqa: E402

ROUTABLE |= _MINIMAX

# AlphaMoE's fused MoE APIs and TensorRT-LLM's MXINT4 MoE, kept in a module of their own.
from _routable_moe_alpha import ROUTABLE as _MOE_ALPHA  # noqa: E402

ROUTABLE |= _MOE_ALPHA

# The paged MQA logits APIs of attention_dsa.fidef, kept in a module of their own.
from _mqa_logits_calls import ROUTABLE as _MQA_LOGITS  # noqa: E402

ROUTABLE |= _MQA_LOGITS
