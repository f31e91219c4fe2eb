"""Routable calls of the TRT-LLM, XQA, MLA and KV-append APIs of ``attention_trtllm.fidef``,
``attention_mla_trtllm.fidef`` and ``attention_cache_ops.fidef``.

Each builder returns a ``Call`` (``_routable_calls``) that gives every parameter of the real
signature at a value the family's rules accept, a non-default one where a rule allows it, so
that ``test_flashinfer_apply.py`` can check the call is routed; ``test_catalogue_attn_b.py``
varies them one parameter at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# What ``_routable_calls`` defines; imported lazily by its users to avoid a cycle.
Catalogue = Any


def trtllm_decode_kwargs(c: Any, name: str, x: dict, axes: dict) -> dict:
    """Every keyword of trtllm_batch_decode_with_kv_cache at a routable value."""
    kwargs: dict = {"bmm1_scale": float(x["bmm1_scale"]), "bmm2_scale": 1.0, "window_left": -1}
    kwargs |= {"out": c.buffer(name, "output", axes), "out_dtype": torch.bfloat16}
    kwargs |= {"o_sf_scale": None, "o_sf_vec_size": None, "sinks": x["sinks"]}
    kwargs |= {"kv_layout": "NHD", "enable_pdl": True, "backend": "xqa", "q_len_per_req": 1}
    kwargs |= {"o_scale": 1.0, "mask": None, "max_q_len": None, "cum_seq_lens_q": None}
    kwargs |= {"skip_softmax_threshold_scale_factor": None, "kv_cache_sf": None}
    kwargs |= {"uses_shared_paged_kv_idx": True, "lse": None, "return_lse": False}
    kwargs |= {"bmm1_scale_log2": None, "multi_ctas_kv_counter_buffer": torch.zeros(4)}
    kwargs |= {"enable_block_sparse_attention": False, "cp_world": 1, "cp_rank": 0}
    kwargs |= {"causal_seqlens_kv_global": None, "bf16q_fp8kv_transform_mode": None}
    kwargs |= {"request_order": None, "request_order_plan": None}
    return kwargs


def _trtllm_decode(c: Any) -> Any:
    from _routable_calls import Call

    name = "trtllm_batch_decode_h64_kv8_d64_ps16"
    x, axes = c.inputs(name, num_tokens=3, batch_size=3, num_pages=12, max_pages_per_seq=3)
    args = (x["query"], (x["k_cache"], x["v_cache"]), torch.empty(16, dtype=torch.uint8))
    args += (x["block_tables"], x["seq_lens"], int(x["max_seq_len"]))
    return Call(name, args, trtllm_decode_kwargs(c, name, x, axes))


ROUTABLE: dict[str, Callable[[Any], Any]] = {
    "flashinfer.decode.trtllm_batch_decode_with_kv_cache": _trtllm_decode,
}


def _xqa_batch_decode(c: Any) -> Any:
    from _routable_calls import Call

    name = "xqa_batch_decode_h64_kv8_d64_ps16"
    x, axes = c.inputs(name, num_tokens=3, batch_size=3, num_pages=12, max_pages_per_seq=3)
    args = (x["query"], (x["k_cache"], x["v_cache"]), torch.empty(16, dtype=torch.uint8))
    args += (x["block_tables"], x["seq_lens"], int(x["max_seq_len"]))
    kwargs: dict = {"bmm1_scale": 0.125, "bmm2_scale": 1.0, "window_left": 127}
    kwargs |= {"out": c.buffer(name, "output", axes), "sinks": torch.randn(64)}
    kwargs |= {"kv_layout": "NHD", "enable_pdl": True, "q_len_per_req": 1, "o_scale": 1.0}
    kwargs |= {"mask": None, "kv_cache_sf": None, "q_cu_seq_lens": None}
    return Call(name, args, kwargs)


def _xqa(c: Any) -> Any:
    from _routable_calls import Call

    name = "xqa_h64_kv8_d64_ps16"
    x, axes = c.inputs(name, batch_size=3, num_pages=12, max_pages_per_seq=3)
    seq_lens = x["seq_lens"].to(torch.uint32)  # as FlashInfer takes them
    args = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], seq_lens)
    args += (c.buffer(name, "output_out", axes), torch.empty(16, dtype=torch.uint8))
    args += (torch.zeros(8, dtype=torch.uint32), 8, 16)
    kwargs: dict = {"sinks": torch.randn(8, 8), "q_scale": 0.9, "kv_scale": 1.0}
    kwargs |= {"sliding_win_size": 128, "kv_layout": "NHD", "sm_count": 132}
    kwargs |= {"enable_pdl": True, "rcp_out_scale": 1.0, "q_seq_len": 1, "mask": None}
    kwargs |= {"q_cu_seq_lens": None, "k_sf_cache": None, "v_sf_cache": None}
    return Call(name, args, kwargs)


def _trtllm_context(c: Any) -> Any:
    from _routable_calls import Call

    name = "trtllm_batch_context_h64_kv8_d64_ps16"
    x, axes = c.inputs(
        name,
        num_tokens=5,
        batch_size=2,
        batch_size_plus_1_q=3,
        batch_size_plus_1_kv=3,
        num_pages=8,
        max_pages_per_seq=2,
    )
    args = (x["query"], (x["k_cache"], x["v_cache"]), torch.empty(16, dtype=torch.uint8))
    args += (x["block_tables"], x["seq_lens"], 8, 32, 0.125, 1.0, 2)
    args += (x["cum_seq_lens_q"], x["cum_seq_lens_kv"])
    kwargs: dict = {"window_left": 127, "out": c.buffer(name, "output", axes)}
    kwargs |= {"out_dtype": torch.bfloat16, "o_sf_scale": None, "o_sf_vec_size": None}
    kwargs |= {"kv_layout": "NHD", "enable_pdl": True, "sinks": torch.randn(64)}
    kwargs |= {"kv_cache_sf": None, "skip_softmax_threshold_scale_factor": None}
    kwargs |= {"uses_shared_paged_kv_idx": True, "causal": True, "lse": None}
    kwargs |= {"return_lse": False, "multi_ctas_kv_counter_buffer": torch.zeros(4)}
    kwargs |= {"use_fp16_softmax": False, "uses_spcompress": False, "backend": "trtllm-gen"}
    return Call(name, args, kwargs)


ROUTABLE |= {
    "flashinfer.decode.xqa_batch_decode_with_kv_cache": _xqa_batch_decode,
    "flashinfer.xqa.xqa": _xqa,
    "flashinfer.prefill.trtllm_batch_context_with_kv_cache": _trtllm_context,
}


def _mla(fn: str) -> Callable[[Any], Any]:
    def build(c: Any) -> Any:
        from _routable_calls import Call

        kind = "batch_decode" if fn == "decode" else "prefill"
        name = f"trtllm_{kind}_mla_dense_h16_d_qk576_ckv512_kpe64_nope128_ps32"
        x, axes = c.inputs(
            name, batch_size=2, q_len_per_request=1, num_pages=6, max_pages_per_seq=3
        )
        args = (x["query"], x["kv_cache"][:, 0], torch.empty(16, dtype=torch.uint8), 128)
        args += (512, 64, x["block_tables"], x["seq_lens"], int(x["max_seq_len"]))
        kwargs: dict = {"sparse_mla_top_k": 0, "out": c.buffer(name, "output", axes)}
        kwargs |= {"bmm1_scale": 1 / 192**0.5, "bmm2_scale": 1.0, "sinks": None}
        kwargs |= {"skip_softmax_threshold_scale_factor": None, "enable_pdl": True}
        kwargs |= {"backend": "trtllm-gen", "is_var_seq": False}
        kwargs |= {"uses_shared_paged_kv_idx": True, "lse": None, "return_lse": False}
        kwargs |= {"cute_dsl_impl": "modular", "kv_scale_format": "auto"}
        kwargs |= {"cum_seq_lens_q": None, "max_q_len": None}
        kwargs |= {"multi_ctas_kv_counter_buffer": torch.zeros(4, dtype=torch.int32)}
        kwargs |= {"sparse_mla_top_k_lens": None, "enable_dcp": False, "cp_world": 1}
        kwargs |= {"cp_rank": 0, "causal_seqlens_kv_global": None, "use_fp16_softmax": False}
        kwargs |= {"return_lse_base": "base2"}
        return Call(name, args, kwargs)

    return build


ROUTABLE |= {
    "flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla": _mla("decode"),
    "flashinfer.mla.trtllm_prefill_with_kv_cache_mla": _mla("prefill"),
}


def _xqa_mla_batch_decode(c: Any) -> Any:
    from _routable_calls import Call

    name = "xqa_batch_decode_mla_h16_d_qk576_ckv512_kpe64_nope128_ps32"
    x, _ = c.inputs(name, batch_size=2, num_pages=6, max_pages_per_seq=3)
    args = (x["query"], x["kv_cache"][:, 0], torch.empty(16, dtype=torch.uint8), 128, 512, 64)
    args += (x["block_tables"], x["seq_lens"], int(x["max_seq_len"]))
    kwargs: dict = {"out": None, "bmm1_scale": 1 / 192**0.5, "bmm2_scale": 1.0}
    kwargs |= {"sinks": None, "enable_pdl": True}
    return Call(name, args, kwargs)


ROUTABLE |= {"flashinfer.mla.xqa_batch_decode_with_kv_cache_mla": _xqa_mla_batch_decode}


def _concat_mla_k(c: Any) -> Any:
    from _routable_calls import Call

    name = "concat_mla_k_h16_nope128_rope64_d192"
    x, _ = c.inputs(name, num_tokens=5)
    k = torch.empty(5, 16, 192, dtype=torch.bfloat16)
    return Call(name, (k, x["k_nope"], x["k_rope"]), {"backend": "cake"})


def _concat_mla_kv_quant_fp8(c: Any) -> Any:
    from _routable_calls import Call

    name = "concat_mla_kv_quant_fp8_h16_kv256_rope64"
    x, _ = c.inputs(name, num_tokens=5)
    key = torch.empty(5, 16, 192, dtype=torch.float8_e4m3fn)
    value = torch.empty(5, 16, 128, dtype=torch.float8_e4m3fn)
    kwargs = {"nope_dim": 128, "backend": "specialized"}
    return Call(name, (x["kv_nope"], x["k_pe"][:, None], key, value), kwargs)


ROUTABLE |= {
    "flashinfer.concat_ops.concat_mla_k": _concat_mla_k,
    "flashinfer.mla_kv_pack.concat_mla_kv_quant_fp8": _concat_mla_kv_quant_fp8,
}


def _ragged_deepseek(c: Any) -> Any:
    from _routable_calls import Call

    name = "trtllm_ragged_attention_deepseek_h16_d_qk192_d_v128"
    x, axes = c.inputs(name, batch_size=2, batch_size_plus_1=3, num_q_tokens=5, num_kv_tokens=32)
    args = (x["query"], x["key"], x["value"], torch.empty(16, dtype=torch.uint8))
    args += (x["seq_lens"], 16, 16, float(x["bmm1_scale"]), 1.0, 0.5, 2, -1)
    args += (x["cum_seq_lens_q"], x["cum_seq_lens_kv"], True, False, False)
    kwargs: dict = {"attention_sinks": None, "skip_softmax_threshold_scale_factor": None}
    kwargs |= {"out": c.buffer(name, "output", axes), "lse": None}
    kwargs |= {"sage_attn_sfs": (None, None, None, None)}
    kwargs |= {"num_elts_per_sage_attn_blk": (0, 0, 0, 0), "backend": "cute-dsl"}
    kwargs |= {"q_seq_lens_cpu": None, "kv_seq_lens_cpu": None, "use_fp16_softmax": False}
    kwargs |= {"uses_spcompress": False, "skip_all_rows_active_check": True}
    return Call(name, args, kwargs)


ROUTABLE |= {"flashinfer.prefill.trtllm_ragged_attention_deepseek": _ragged_deepseek}


def _xqa_mla_kernel(c: Any) -> Any:
    from _routable_calls import Call

    name = "xqa_mla_h128_ckv512_d_qk576_ps32"
    x, axes = c.inputs(name, batch_size=2, num_pages=6, max_pages_per_seq=3)
    args = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["seq_lens"].to(torch.uint32))
    args += (c.buffer(name, "output_out", axes), torch.empty(16, dtype=torch.uint8))
    args += (torch.zeros(8, dtype=torch.uint32), 32)
    kwargs = {"q_scale": 0.07, "kv_scale": 1.0, "sm_count": 132, "enable_pdl": True}
    return Call(name, args, kwargs)


ROUTABLE |= {"flashinfer.xqa.xqa_mla": _xqa_mla_kernel}


def _fmha_v2(c: Any) -> Any:
    from _routable_calls import Call

    name = "trtllm_fmha_v2_prefill_h16_kv2_d128"
    x, axes = c.inputs(name, batch_size=2, batch_size_plus_1=3, num_tokens=5, num_kv_tokens=32)
    kv = torch.stack([x["key"], x["value"]], dim=1)
    args = ((x["query"], kv), "CONTIGUOUS_Q_KV", torch.empty(16, dtype=torch.uint8))
    args += (x["seq_lens"], 16, 16, 0.0883, 1.0, 2, x["cum_seq_lens_q"], x["cum_seq_lens_kv"])
    kwargs: dict = {"block_tables": None, "out": c.buffer(name, "output", axes)}
    kwargs |= {"out_dtype": torch.bfloat16, "sinks": None, "pos_encoding_mode": None}
    kwargs |= {"logits_soft_cap_scale": None, "mask_mode": "padding", "window_left": 7}
    kwargs |= {"chunked_attention_size": 0, "save_softmax_stats": False}
    kwargs |= {"skip_softmax_threshold_scale_factor": 0}
    return Call(name, args, kwargs)


ROUTABLE |= {"flashinfer.prefill.trtllm_fmha_v2_prefill": _fmha_v2}


def _sm120(kind: str) -> Callable[[Any], Any]:
    def build(c: Any) -> Any:
        from _routable_calls import Call

        name = "fmha_v2_prefill_sm120_h32_d128" if kind == "sm120" else (
            "fmha_v2_prefill_deepseek_h16_d192"
        )  # fmt: skip
        x, axes = c.inputs(name, batch_size=2, seq_len=6)
        heads, dim = x["query"].shape[2:]
        args = (x["query"], x["key"], x["value"], c.buffer(name, "output", axes), heads, dim)
        kwargs: dict = {"scale_bmm1": 0.05, "scale_bmm2": 2.0, "return_lse": False}
        kwargs |= {"lse": None, "scale_bmm1_d": None, "scale_bmm2_d": None}
        if kind == "sm120":
            kwargs["causal"] = False
        return Call(name, args + (6, 1.0), kwargs)

    return build


ROUTABLE |= {
    "flashinfer.prefill.fmha_v2_prefill_sm120": _sm120("sm120"),
    "flashinfer.prefill.fmha_v2_prefill_deepseek": _sm120("deepseek"),
}


def _msa_topk(c: Any) -> Any:
    from _routable_calls import Call

    name = "msa_topk_select_h4_topk16"
    x, axes = c.inputs(name, max_k_tiles=40, total_q=6)
    kwargs = {"num_valid_pages": 30, "output": c.buffer(name, "block_indices", axes)}
    kwargs |= {"force_begin_blocks": 1, "force_end_blocks": 2}
    return Call(name, (x["max_score"], 16), kwargs)


ROUTABLE |= {"flashinfer.msa_ops.sparse_topk_select.msa_topk_select": _msa_topk}


def _msa_sparse_prefill(c: Any) -> Any:
    from _routable_calls import Call

    name = "msa_sparse_attention_h4_kv2_d128_topk16"
    x, _ = c.inputs(name, len_indptr=3)
    args = tuple(x[k] for k in ("q", "k", "v", "q2k_indices", "cu_seqlens_q", "cu_seqlens_k"))
    kwargs: dict = {"causal": True, "softmax_scale": 0.1, "page_table": None}
    kwargs |= {"seqused_k": None, "return_softmax_lse": False, "k_scale": None}
    kwargs |= {"v_scale": None, "k_global_scale": None, "v_global_scale": None}
    kwargs |= {"q_offset": None, "return_temperature_lse": False}
    kwargs |= {"lse_temperature_scale": 2.0, "workspace": None}
    return Call(name, args, kwargs)


ROUTABLE |= {"flashinfer.msa_ops.sparse_prefill.msa_sparse_attention": _msa_sparse_prefill}


def _msa_sparse_decode(c: Any) -> Any:
    from _routable_calls import Call

    name = "msa_sparse_decode_attention_h4_kv2_d128_topk16_sq1"
    x, _ = c.inputs(name, len_indptr=3)
    args = tuple(x[k] for k in ("q", "k", "v", "q2k_indices"))
    kwargs: dict = {"page_table": None, "seqused_k": None, "cu_seqlens_k": x["cu_seqlens_k"]}
    kwargs |= {"seqlen_q": 1, "causal": True, "softmax_scale": 0.1}
    kwargs |= {"return_softmax_lse": False, "k_scale": None, "v_scale": None}
    kwargs |= {"k_global_scale": None, "v_global_scale": None, "q_offset": None}
    kwargs |= {"partial_dtype": torch.float32, "force_fused": True, "workspace": None}
    kwargs |= {"out": None}
    return Call(name, args, kwargs)


ROUTABLE |= {"flashinfer.msa_ops.sparse_decode.msa_sparse_decode_attention": _msa_sparse_decode}


PROXY_NAME = "msa_proxy_score_h4_kv4_d128"


def _longest(cu_seqlens: torch.Tensor) -> int:
    """The longest sequence of a batch: the max_seqlen_q FlashInfer sizes its grid by."""
    return int(cu_seqlens.diff().max())


def msa_proxy_case(c: Any, seed: int = 0, max_k_tiles: int = 3) -> tuple[tuple, dict, dict]:
    """(positional arguments of msa_proxy_score, the definition's inputs, axes)."""
    x, axes = c.inputs(PROXY_NAME, seed=seed, len_indptr=3, max_k_tiles=max_k_tiles)
    return (x["q"], x["k"], x["cu_seqlens_q"], x["cu_seqlens_k"]), x, axes


def _msa_proxy(c: Any) -> Any:
    from _routable_calls import Call

    args, x, axes = msa_proxy_case(c)
    kwargs: dict = {"page_table": None, "seqused_k": None, "causal": False}
    kwargs |= {"max_seqlen_q": _longest(x["cu_seqlens_q"]), "max_k_tiles": 3}
    kwargs |= {"reduce_heads": False, "q_offset": None}
    kwargs |= {"output": c.buffer(PROXY_NAME, "max_score", axes)}
    return Call(PROXY_NAME, args, kwargs)


ROUTABLE |= {"flashinfer.msa_ops.proxy_score.msa_proxy_score": _msa_proxy}


PROXY_FP4_NAME = "msa_proxy_score_fp4_h4_kv4"


def msa_proxy_fp4_case(
    c: Any, seed: int = 0, max_k_tiles: int = 3, **more: int
) -> tuple[tuple, dict, dict]:
    """(positional arguments of msa_proxy_score_fp4 as FlashInfer takes them: uint8 codes
    and scale bytes; the definition's inputs; axes)."""
    x, axes = c.inputs(PROXY_FP4_NAME, seed=seed, len_indptr=3, max_k_tiles=max_k_tiles, **more)
    args = tuple(x[n].view(torch.uint8) for n in ("q_fp4", "k_fp4", "q_scale", "k_scale"))
    args += (x["q_global_scale"], x["k_global_scale"], x["cu_seqlens_q"], x["cu_seqlens_k"])
    return args, x, axes


def _msa_proxy_fp4(c: Any) -> Any:
    from _routable_calls import Call

    args, x, axes = msa_proxy_fp4_case(c)
    kwargs: dict = {"page_table": None, "seqused_k": None, "causal": False}
    kwargs |= {"max_seqlen_q": _longest(x["cu_seqlens_q"]), "max_k_tiles": 3}
    kwargs |= {"reduce_heads": False, "q_offset": None}
    kwargs |= {"output": c.buffer(PROXY_FP4_NAME, "max_score", axes)}
    return Call(PROXY_FP4_NAME, args, kwargs)


ROUTABLE |= {"flashinfer.msa_ops.proxy_score.msa_proxy_score_fp4": _msa_proxy_fp4}
