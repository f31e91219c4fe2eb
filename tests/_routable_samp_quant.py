"""Routed calls of FlashInfer's sampling, top-k and quantization APIs (see ``_routable_calls``).

Each builder gives every parameter of the real signature, at a value the family's rules
accept: a non-default value for the ignored ones (``deterministic``, ``check_nan``,
``enable_pdl``, ``is_deterministic``, ``tie_break=1``...), the accepted value otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from _routable_calls import Call, Catalogue

_SAMPLER_KEYWORDS = {"deterministic": False, "generator": None, "check_nan": True}
_SAMPLER_KEYWORDS |= {"seed": None, "offset": None}


def _sampler(fn: str, name: str) -> Callable[[Catalogue], Call]:
    def build(c: Catalogue) -> Call:
        x, _ = c.inputs(name, batch_size=2)
        first = x["probs"] if "probs" in x else x["logits"]
        args: tuple = (first,)
        if fn == "min_p_sampling_from_probs":
            args += (0.1,)
        if fn == "top_k_top_p_sampling_from_logits":
            args += (5, 0.9)
        kwargs: dict = {"indices": None}
        if fn == "top_k_top_p_sampling_from_logits":
            kwargs["filter_apply_order"] = "top_k_first"
        kwargs |= _SAMPLER_KEYWORDS
        if fn != "sampling_from_logits" and fn != "top_k_top_p_sampling_from_logits":
            kwargs["return_valid"] = False
        return Call(name, args, kwargs)

    return build


def _softmax(c: Catalogue) -> Call:
    name = "softmax_v128256"
    x, _ = c.inputs(name, batch_size=2)
    return Call(name, (x["logits"],), {"temperature": 0.7, "enable_pdl": True})


def _renorm(fn: str, threshold: float | int) -> Callable[[Catalogue], Call]:
    def build(c: Catalogue) -> Call:
        name = f"{fn}_v128256"
        x, _ = c.inputs(name, batch_size=2)
        return Call(name, (x["probs"], threshold), {"is_deterministic": True})

    return build


def _mask_logits(c: Catalogue) -> Call:
    name = "top_k_mask_logits_v128256"
    x, _ = c.inputs(name, batch_size=2)
    return Call(name, (x["logits"], torch.full((2,), 5, dtype=torch.int32)))


def _chain(c: Catalogue) -> Call:
    name = "chain_speculative_sampling_v128256"
    x, _ = c.inputs(name, batch_size=2, num_speculative=2)
    args = (x["draft_probs"], x["draft_token_ids"], x["target_probs"])
    kwargs = {"maybe_output_accepted_token_num": None, "maybe_output_emitted_draft_token_num": None}
    kwargs |= {"deterministic": False, "generator": None, "seed": None, "offset": None}
    return Call(name, args, kwargs)


_TOPK_KEYWORDS = {"deterministic": True, "tie_break": 1, "dsa_graph_safe": True}


def _ragged(c: Catalogue) -> Call:
    name = "top_k_ragged_transform_k2048"
    x, _ = c.inputs(name, num_rows=3, max_len=16)
    args = (x["input"], x["offsets"], x["lengths"], 2048)
    kwargs = _TOPK_KEYWORDS | {"row_starts": torch.zeros(3, dtype=torch.int32)}
    return Call(name, args, kwargs)


def _page_table(c: Catalogue) -> Call:
    name = "top_k_page_table_transform_k2048_ps64"
    x, axes = c.inputs(name, num_rows=3, max_len=16)
    args = (x["input"], x["src_page_table"], x["lengths"], 2048, x["row_to_batch"])
    kwargs = _TOPK_KEYWORDS | {"row_starts": None, "page_table_row_starts": None}
    kwargs |= {"page_size": 64, "out": c.buffer(name, "indices", axes), "out_raw_indices": None}
    return Call(name, args, kwargs)


def _varlen(c: Catalogue) -> Call:
    name = "top_k_varlen_n8192_k512"
    x, _ = c.inputs(name, batch_size=2)
    pre_idx = torch.zeros(2, 512, dtype=torch.int32)
    kwargs = {"pre_idx": pre_idx, "compress_ratio": 1, "next_n": 1, "return_values": False}
    kwargs |= {"out_indices": None, "out_values": None, "backend": "radix"}
    kwargs |= {"load_balance": False, "workspace": {}}
    return Call(name, (x["logits"], x["seq_lens"], 512), kwargs)


def _mxfp8(c: Catalogue) -> Call:
    name = "mxfp8_quantize_k4096"
    x, _ = c.inputs(name, M=3)
    kwargs = {"is_sf_swizzled_layout": False, "alignment": 32, "enable_pdl": True}
    kwargs |= {"backend": "cute-dsl", "sf_swizzle_layout": None}
    return Call(name, (x["input"],), kwargs)


def _mxfp8_grouped(c: Catalogue) -> Call:
    name = "mxfp8_grouped_quantize_k4096"
    x, _ = c.inputs(name, B=2, M=3)
    return Call(name, (x["a"], x["mask"]), {"backend": "cutile"})


def _mxfp4(c: Catalogue) -> Call:
    name = "mxfp4_quantize_k4096"
    x, _ = c.inputs(name, M=3)
    return Call(name, (x["a"],), {"backend": "cute-dsl", "enable_pdl": True, "sfLayout": 2})


def _nvfp4_kv(c: Catalogue) -> Call:
    name = "nvfp4_kv_quantize_k128"
    x, _ = c.inputs(name, M=3)
    return Call(name, (x["input"], x["global_scale"]))


def _nvfp4(c: Catalogue) -> Call:
    name = "nvfp4_quantize_k4096"
    x, _ = c.inputs(name, M=3)
    kwargs = {"sfLayout": 2, "do_shuffle": False, "sf_vec_size": 16, "enable_pdl": True}
    kwargs |= {"backend": "cute-dsl", "per_token_activation": False}
    kwargs |= {"expanded_idx_to_permuted_idx": None, "out_scale": None, "nvfp4_4over6": None}
    return Call(name, (x["a"], x["a_global_sf"]), kwargs)


def _fp4(c: Catalogue) -> Call:
    name = "fp4_quantize_k4096"
    x, _ = c.inputs(name, M=3)
    kwargs = {"sf_vec_size": 16, "sf_use_ue8m0": False, "is_sf_swizzled_layout": False}
    kwargs |= {"is_sf_8x4_layout": True, "is_global_scale_inversed": False, "enable_pdl": True}
    kwargs |= {"backend": "cute-dsl", "nvfp4_4over6": None}
    return Call(name, (x["input"], x["global_scale"]), kwargs)


def _nvfp4_smooth(c: Catalogue) -> Call:
    name = "nvfp4_quantize_smooth_n3072"
    x, _ = c.inputs(name, M=3)
    args = (x["x"], x["pre_quant_scale"], x["global_scale"])
    return Call(name, args, {"enable_pdl": True, "backend": "cute-dsl"})


def _silu_nvfp4(c: Catalogue) -> Call:
    name = "silu_and_mul_nvfp4_quantize_k28672"
    x, _ = c.inputs(name, M=3)
    kwargs = {"sf_vec_size": 16, "is_sf_swizzled_layout": True, "is_sf_8x4_layout": False}
    kwargs |= {"enable_pdl": True, "nvfp4_4over6": None}
    return Call(name, (x["input"], x["global_scale"]), kwargs)


def _silu_mxfp8(c: Catalogue) -> Call:
    # FlashInfer takes rows in multiples of 128 only.
    name = "silu_and_mul_mxfp8_forward_row_k24576"
    x, _ = c.inputs(name, M=128)
    return Call(name, (x["gated_input"],), {"rowwise": True, "colwise": False})


def _silu_mxfp8_backward(c: Catalogue) -> Call:
    name = "silu_and_mul_mxfp8_backward_row_k24576"
    x, _ = c.inputs(name, M=128)
    return Call(name, (x["gated_input"], x["grad_output"]), {"rowwise": True, "colwise": False})


def _silu_nvfp4_experts(c: Catalogue) -> Call:
    name = "silu_and_mul_scaled_nvfp4_experts_quantize_k4096"
    x, _ = c.inputs(name, B=2, M=3)
    args = (x["a"], x["mask"], x["a_global_sf"])
    return Call(name, args, {"nvfp4_4over6": None})


def _nvfp4_kv_dequant(c: Catalogue) -> Call:
    name = "nvfp4_kv_dequantize_paged_h8_dk128_dv128_ps16"
    x, _ = c.inputs(name, batch_size=2, max_seq_len=5, num_pages=3, block_table_stride=2)
    # A (k, v) tuple of uint8 bytes, as FlashInfer's template reads the cache; the stacked
    # and HND forms are routed in test_catalogue_quantization.py.
    cache = (x["paged_k_cache"].view(torch.uint8), x["paged_v_cache"].view(torch.uint8))
    sf = (x["k_scales"].view(torch.uint8), x["v_scales"].view(torch.uint8))
    args = (cache, sf, x["block_tables"], x["seq_lens"], x["k_scale"], x["v_scale"])
    args += (x["output_k"], x["output_v"])
    return Call(name, args, {"kv_layout": "NHD"})


ROUTABLE: dict[str, Callable[[Catalogue], Call]] = {
    "flashinfer.sampling.softmax": _softmax,
    "flashinfer.sampling.sampling_from_probs": _sampler(
        "sampling_from_probs", "sampling_from_probs_v128256"
    ),
    "flashinfer.sampling.sampling_from_logits": _sampler(
        "sampling_from_logits", "sampling_from_logits_v128256"
    ),
    "flashinfer.sampling.min_p_sampling_from_probs": _sampler(
        "min_p_sampling_from_probs", "min_p_sampling_v128256"
    ),
    "flashinfer.sampling.top_k_top_p_sampling_from_logits": _sampler(
        "top_k_top_p_sampling_from_logits", "top_k_top_p_sampling_from_logits_v128256"
    ),
    "flashinfer.sampling.top_p_renorm_probs": _renorm("top_p_renorm_probs", 0.9),
    "flashinfer.sampling.top_k_renorm_probs": _renorm("top_k_renorm_probs", 5),
    "flashinfer.sampling.top_k_mask_logits": _mask_logits,
    "flashinfer.sampling.chain_speculative_sampling": _chain,
    "flashinfer.topk.top_k_ragged_transform": _ragged,
    "flashinfer.topk.top_k_page_table_transform": _page_table,
    "flashinfer.topk_varlen.topk_varlen.top_k_varlen": _varlen,
    "flashinfer.quantization.fp8_quantization.mxfp8_quantize": _mxfp8,
    "flashinfer.quantization.fp8_quantization.mxfp8_grouped_quantize": _mxfp8_grouped,
    "flashinfer.quantization.fp4_quantization.mxfp4_quantize": _mxfp4,
    "flashinfer.quantization.fp4_quantization.nvfp4_kv_quantize": _nvfp4_kv,
    "flashinfer.quantization.fp4_quantization.nvfp4_quantize": _nvfp4,
    "flashinfer.quantization.fp4_quantization.fp4_quantize": _fp4,
    "flashinfer.quantization.fp4_quantization.silu_and_mul_nvfp4_quantize": _silu_nvfp4,
    "flashinfer.gemm.gemm_svdquant.nvfp4_quantize_smooth": _nvfp4_smooth,
    "flashinfer.quantization.fp4_quantization.nvfp4_kv_dequantize_paged": _nvfp4_kv_dequant,
    "flashinfer.activation.silu_and_mul_scaled_nvfp4_experts_quantize": _silu_nvfp4_experts,
    "flashinfer.gated_act_mxfp8.silu_and_mul_mxfp8_quantize": _silu_mxfp8,
    "flashinfer.gated_act_mxfp8.silu_and_mul_mxfp8_quantize_backward": _silu_mxfp8_backward,
}
