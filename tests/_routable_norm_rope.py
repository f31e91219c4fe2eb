"""Calls that give every parameter and are routed, for the norm, activation and RoPE APIs
of ``definitions/norm_*.fidef``, ``activation_*.fidef``, ``rope_apply.fidef`` and
``rope_cache.fidef`` (see ``_routable_calls`` for the convention): every value is one the
family's rules accept, a non-default one wherever a rule allows it (a partial rotary_dim,
interleaved pairs, scales, an ignored launch option, an FP8 output buffer), the default
otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _ragged(fn: str, name: str, llama31: bool) -> Callable[[Any], Any]:
    def build(c: Any) -> Any:
        from _routable_calls import Call

        pos_ids = "pos_ids" in fn
        x, _ = c.inputs(name, nnz=7) if pos_ids else c.inputs(name, batch_size=3)
        kwargs: dict = {"rotary_dim": 64, "interleave": True, "rope_scale": 2.0}
        kwargs["rope_theta"] = 5e5
        if llama31:
            kwargs |= {"low_freq_factor": 2.0, "high_freq_factor": 8.0, "old_context_len": 4096}
        if pos_ids:
            return Call(name, (x["q"], x["k"], x["pos_ids"].long()), kwargs)
        return Call(name, (x["q"], x["k"], x["indptr"], x["offsets"]), kwargs)

    return build


def _cos_sin_cache(c: Any) -> Any:
    from _routable_calls import Call

    name = "rope_cos_sin_cache_d128"
    x, _ = c.inputs(name, num_tokens=5, max_seq_len=9, rotary_dim=64)
    # Engines pass query and key flattened, [tokens, heads * head_size].
    query, key = x["q"].flatten(1), x["k"].flatten(1)
    return Call(name, (x["positions"], query, key, 128, x["cos_sin_cache"], False))


def _fp8_outputs(c: Any, name: str, axes: dict, names: tuple[str, ...]) -> dict:
    return {n: c.buffer(name, n, axes) for n in names}


def _quantize(c: Any) -> Any:
    from _routable_calls import Call

    name = "rope_quantize_fp8_h8_kv2_rope64"
    x, axes = c.inputs(name, nnz=5, max_seq_len=9, no_rope_dim=64)
    outs = ("q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out")
    kwargs: dict = {"is_neox": False, "quantize_dtype": torch.float8_e4m3fn}
    kwargs |= {"quant_scale_q": 0.5, "quant_scale_kv": 2.0, "enable_pdl": True}
    kwargs |= {"backend": "triton"} | _fp8_outputs(c, name, axes, outs)
    args = (x["q_rope"], x["k_rope"], x["q_nope"], x["k_nope"], x["cos_sin_cache"])
    return Call(name, (*args, x["pos_ids"].int()), kwargs)


def _mla_quantize(c: Any) -> Any:
    from _routable_calls import Call

    name = "mla_rope_quantize_fp8_h16_rope64"
    x, axes = c.inputs(name, nnz=5, max_seq_len=9, no_rope_dim=512)
    outs = ("q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out")
    kwargs: dict = {"is_neox": False, "quantize_dtype": torch.float8_e4m3fn}
    kwargs |= {"quant_scale_q": 0.5, "quant_scale_kv": 2.0, "enable_pdl": True}
    kwargs |= _fp8_outputs(c, name, axes, outs)
    args = (x["q_rope"], x["k_rope"], x["q_nope"], x["k_nope"], x["cos_sin_cache"])
    return Call(name, (*args, x["pos_ids"]), kwargs)


def _quantize_append(c: Any) -> Any:
    from _routable_calls import Call

    name = "rope_quantize_fp8_append_paged_kv_cache_h8_kv2_rope64_ps16"
    x, axes = c.inputs(name, nnz=5, max_seq_len=9, no_rope_dim=64, batch_size_plus_1=3)
    # HND pages: the rule gives the solution NHD views of them.
    cache = (x["k_cache"].transpose(1, 2).contiguous(), x["v_cache"].transpose(1, 2).contiguous())
    args = (x["q_rope"], x["k_rope"], x["q_nope"], x["k_nope"], x["v"], x["cos_sin_cache"])
    args += (x["pos_ids"], cache, x["kv_indices"].long(), x["kv_indptr"])
    args += (x["batch_indices"], x["positions"])
    kwargs: dict = {"is_neox": False, "quantize_dtype": torch.float8_e4m3fn}
    kwargs |= {"quant_scale_q": 0.5, "quant_scale_kv": 2.0, "page_size": 16, "kv_layout": "HND"}
    kwargs |= {"enable_pdl": True} | _fp8_outputs(c, name, axes, ("q_rope_out", "q_nope_out"))
    return Call(name, args, kwargs)


def _act(fn: str) -> Callable[[Any], Any]:
    def build(c: Any) -> Any:
        from _routable_calls import Call

        name = min((n for n in c.defs if n.startswith(fn + "_h") and n.endswith("_bf16")), key=len)
        x, axes = c.inputs(name, num_tokens=2)
        return Call(name, (x["x"],), {"out": c.buffer(name, "output", axes), "enable_pdl": True})

    return build


def _gemma_fused_add(c: Any) -> Any:
    from _routable_calls import Call

    name = "gemma_fused_add_rmsnorm_h1152"
    x, _ = c.inputs(name, batch_size=3)
    args = (x["hidden_states"], x["residual"], x["weight"])
    return Call(name, args, {"eps": 1e-5, "enable_pdl": True})


def _norm_quant(fn: str, name: str) -> Callable[[Any], Any]:
    def build(c: Any) -> Any:
        from _routable_calls import Call

        x, axes = c.inputs(name, batch_size=3)
        args: tuple = (c.buffer(name, "out", axes), x["hidden_states"])
        if "residual" in x:
            args += (x["residual"],)
        args += (x["weight"], x["scale"])
        return Call(name, args, {"eps": 1e-5, "enable_pdl": True})

    return build


def _layernorm_quant(c: Any) -> Any:
    from _routable_calls import Call

    name = "layernorm_quant_h768"
    x, axes = c.inputs(name, batch_size=3)
    args = (c.buffer(name, "out", axes), x["hidden_states"], x["weight"], x["bias"], x["scale"])
    return Call(name, args, {"eps": 1e-5})


def _sigmoid_gate(c: Any) -> Any:
    from _routable_calls import Call

    name = "rmsnorm_sigmoid_gate_nh32_h64"
    x, _ = c.inputs(name, num_tokens=3)
    return Call(name, (x["x"], x["gate"]), {"eps": 1e-6, "enable_pdl": False})


def _gated_residual(c: Any) -> Any:
    from _routable_calls import Call

    name = "gated_residual_rmsnorm_h8192"
    x, axes = c.inputs(name, num_rows=2)
    args = (x["branch"], x["residual"], x["weight"], x["alpha"], x["beta"])
    kwargs = {"eps": 1e-5, "gain_center": 1.0, "out": c.buffer(name, "output", axes)}
    return Call(name, args, kwargs | {"enable_pdl": False})


def _gated_residual_next(c: Any) -> Any:
    from _routable_calls import Call

    name = "gated_residual_next_rmsnorm_h8192"
    x, axes = c.inputs(name, num_rows=2)
    args = (x["branch"], x["residual"], x["next_weight"], 1.0, x["beta"], 1e-5, 1e-5, 1.0)
    args += (c.buffer(name, "residual_out", axes), c.buffer(name, "ffn_input", axes))
    kwargs = {"post_weight": x["post_weight"], "post_gain_center": 1.0, "enable_pdl": False}
    return Call(name, args, kwargs)


def _rmsnorm_silu(c: Any) -> Any:
    from _routable_calls import Call

    name = "fused_rmsnorm_silu_h128"
    x, axes = c.inputs(name, num_tokens=3)
    kwargs = {"eps": 1e-5, "out": c.buffer(name, "output", axes), "block_scale": None}
    return Call(name, (x["hidden_states"], x["weight"]), kwargs)


def _rmsnorm_fp4quant(c: Any) -> Any:
    from _routable_calls import Call

    name = "rmsnorm_fp4quant_h4096"
    x, axes = c.inputs(name, num_tokens=3)
    kwargs = {"y_fp4": c.buffer(name, "y_fp4", axes), "block_scale": None}
    kwargs |= {"global_scale": x["global_scale"], "eps": 1e-6, "block_size": 16}
    kwargs |= {"scale_format": "e4m3", "is_sf_swizzled_layout": True, "enable_pdl": True}
    return Call(name, (x["input"], x["weight"]), kwargs)


def _add_rmsnorm_fp4quant(c: Any) -> Any:
    from _routable_calls import Call

    name = "add_rmsnorm_fp4quant_h4096"
    x, axes = c.inputs(name, num_tokens=3)
    kwargs = {"y_fp4": c.buffer(name, "y_fp4", axes), "block_scale": None}
    kwargs |= {"global_scale": x["global_scale"], "eps": 1e-6, "block_size": 16}
    kwargs |= {"scale_format": "e4m3", "is_sf_swizzled_layout": True}
    kwargs |= {"output_both_sf_layouts": False, "block_scale_unswizzled": None}
    kwargs |= {"enable_pdl": True, "y_out": None}
    return Call(name, (x["input"], x["residual"], x["weight"]), kwargs)


ROUTABLE: dict[str, Callable[[Any], Any]] = {
    "flashinfer.cute_dsl.rmsnorm_fp4quant.rmsnorm_fp4quant": _rmsnorm_fp4quant,
    "flashinfer.cute_dsl.add_rmsnorm_fp4quant.add_rmsnorm_fp4quant": _add_rmsnorm_fp4quant,
    "flashinfer.norm.fused_rmsnorm_silu": _rmsnorm_silu,
    "flashinfer.norm.rmsnorm_sigmoid_gate": _sigmoid_gate,
    "flashinfer.norm.gated_residual_rmsnorm": _gated_residual,
    "flashinfer.norm.gated_residual_next_rmsnorm": _gated_residual_next,
    "flashinfer.norm.layernorm_quant": _layernorm_quant,
    "flashinfer.norm.rmsnorm_quant": _norm_quant("rmsnorm_quant", "rmsnorm_quant_h2048"),
    "flashinfer.norm.fused_add_rmsnorm_quant": _norm_quant(
        "fused_add_rmsnorm_quant", "fused_add_rmsnorm_quant_h2048"
    ),
    "flashinfer.norm.gemma_fused_add_rmsnorm": _gemma_fused_add,
    "flashinfer.activation.gelu_tanh_and_mul": _act("gelu_tanh_and_mul"),
    "flashinfer.rope.apply_rope": _ragged("apply_rope", "rope_h32_kv8_d128", False),
    "flashinfer.rope.apply_rope_inplace": _ragged(
        "apply_rope_inplace", "rope_inplace_h32_kv8_d128", False
    ),
    "flashinfer.rope.apply_rope_pos_ids": _ragged(
        "apply_rope_pos_ids", "rope_pos_ids_h32_kv8_d128", False
    ),
    "flashinfer.rope.apply_rope_pos_ids_inplace": _ragged(
        "apply_rope_pos_ids_inplace", "rope_pos_ids_inplace_h32_kv8_d128", False
    ),
    "flashinfer.rope.apply_llama31_rope": _ragged(
        "apply_llama31_rope", "llama31_rope_h32_kv8_d128", True
    ),
    "flashinfer.rope.apply_llama31_rope_inplace": _ragged(
        "apply_llama31_rope_inplace", "llama31_rope_inplace_h32_kv8_d128", True
    ),
    "flashinfer.rope.apply_llama31_rope_pos_ids": _ragged(
        "apply_llama31_rope_pos_ids", "llama31_rope_pos_ids_h32_kv8_d128", True
    ),
    "flashinfer.rope.apply_llama31_rope_pos_ids_inplace": _ragged(
        "apply_llama31_rope_pos_ids_inplace", "llama31_rope_pos_ids_inplace_h32_kv8_d128", True
    ),
    "flashinfer.rope.apply_rope_with_cos_sin_cache": _cos_sin_cache,
    "flashinfer.rope.rope_quantize_fp8": _quantize,
    "flashinfer.rope.mla_rope_quantize_fp8": _mla_quantize,
    "flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache": _quantize_append,
}
