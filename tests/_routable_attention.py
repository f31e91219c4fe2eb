"""Calls that give every parameter and are routed, for the attention APIs of
``definitions/attention_single.fidef``, ``attention_cascade.fidef``, ``attention_batch.fidef``,
``attention_page.fidef``, ``attention_block_sparse.fidef`` and ``attention_nvfp4_sm120.fidef`` (see ``_routable_calls`` for the convention): every value is one
the family's rules accept, a non-default one wherever a rule allows it (a window, a soft cap,
an explicit scale, an ignored launch option), the default otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _kv_len_arr(x: dict, page_size: int) -> torch.Tensor:
    pages = x["kv_indptr"][1:] - x["kv_indptr"][:-1]
    return ((pages - 1) * page_size + x["kv_last_page_len"]).to(torch.int32)


def _single_decode(c: Any) -> Any:
    from _routable_calls import Call

    name = "single_decode_h32_kv8_d128"
    x, _ = c.inputs(name, kv_len=5)
    kwargs: dict = {"kv_layout": "NHD", "pos_encoding_mode": "NONE", "use_tensor_cores": True}
    kwargs |= {"q_scale": None, "k_scale": None, "v_scale": None, "window_left": 3}
    kwargs |= {"logits_soft_cap": 30.0, "sm_scale": 0.1, "rope_scale": 2.0, "rope_theta": 5e5}
    kwargs |= {"return_lse": False}
    return Call(name, (x["q"], x["k"], x["v"]), kwargs)


def _single_prefill(c: Any) -> Any:
    from _routable_calls import Call

    name = "single_prefill_h32_kv8_d128"
    x, _ = c.inputs(name, qo_len=3, kv_len=5)
    kwargs: dict = {"scale_q": None, "scale_k": None, "scale_v": None, "o_dtype": torch.bfloat16}
    kwargs |= {"custom_mask": None, "packed_custom_mask": None, "causal": True}
    kwargs |= {"kv_layout": "NHD", "pos_encoding_mode": "NONE", "use_fp16_qk_reduction": False}
    kwargs |= {"sm_scale": 0.1, "window_left": 3, "logits_soft_cap": 30.0, "rope_scale": 2.0}
    kwargs |= {"rope_theta": 5e5, "backend": "fa2", "return_lse": False, "kv_cache_sf": None}
    kwargs |= {"k_scale": None, "v_scale": None}
    return Call(name, (x["q"], x["k"], x["v"]), kwargs)


def _merge_state_in_place(c: Any) -> Any:
    from _routable_calls import Call

    name = "merge_state_in_place_h32_d128"
    x, _ = c.inputs(name, seq_len=3)
    mask = torch.tensor([True, False, True])
    return Call(name, (x["v"], x["s"], x["v_other"], x["s_other"]), {"mask": mask})


def _merge_states(c: Any) -> Any:
    from _routable_calls import Call

    name = "merge_states_h32_d128"
    x, _ = c.inputs(name, seq_len=3, num_states=2)
    return Call(name, (x["v"], x["s"]))


def _cascade(c: Any) -> Any:
    from _routable_calls import Call

    name = "multi_level_cascade_run_h32_kv8_d128_ps16"
    x, _ = c.inputs(name, len_shared_indptr=2, len_unique_indptr=3, total_q=4, num_pages=32)
    plan = (
        [x["shared_qo_indptr"], x["unique_qo_indptr"]],
        [x["shared_kv_indptr"], x["unique_kv_indptr"]],
        [x["shared_kv_indices"], x["unique_kv_indices"]],
        [x["shared_kv_last_page_len"], x["unique_kv_last_page_len"]],
        32,
        8,
        128,
        16,
    )
    plan_kwargs: dict = {"causal": True, "pos_encoding_mode": "NONE"}
    plan_kwargs |= {"use_fp16_qk_reduction": False, "sm_scale": 0.1, "window_left": -1}
    plan_kwargs |= {"logits_soft_cap": 30.0, "rope_scale": 2.0, "rope_theta": 5e5}
    plan_kwargs |= {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    return Call(
        name,
        (x["q"], (x["k_cache"], x["v_cache"])),
        {},
        (plan, plan_kwargs),
        {"_kv_layout": "NHD"},
    )


def _batch_attention(c: Any) -> Any:
    from _routable_calls import Call

    name = "batch_attention_run_h32_kv8_d128_ps16"
    x, axes = c.inputs(name, len_indptr=3, total_q=5, num_pages=32)
    plan = (x["qo_indptr"], x["kv_indptr"], x["kv_indices"], _kv_len_arr(x, 16))
    plan += (32, 8, 128, 128, 16)
    plan_kwargs: dict = {"causal": True, "sm_scale": 0.1, "logits_soft_cap": 30.0}
    plan_kwargs |= {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    plan_kwargs |= {"use_profiler": False}
    kwargs: dict = {"out": c.buffer(name, "output", axes), "lse": c.buffer(name, "lse", axes)}
    kwargs |= {"k_scale": None, "v_scale": None, "logits_soft_cap": 30.0}
    kwargs |= {"profiler_buffer": torch.zeros(4), "kv_cache_sf": None}
    return Call(
        name,
        (x["q"], (x["k_cache"], x["v_cache"])),
        kwargs,
        (plan, plan_kwargs),
        {"_kv_layout": "NHD"},
    )


def _pod(c: Any) -> Any:
    from _routable_calls import Call

    name = "pod_run_h32_kv8_d128_ps16"
    x, _ = c.inputs(name, batch_size=3, qo_len=2, kv_len=5, num_pages=32)
    plan = (x["kv_indptr"], x["kv_indices"], x["kv_last_page_len"], 32, 8, 128, 16)
    plan_kwargs: dict = {"pos_encoding_mode": "NONE", "window_left": 7}
    plan_kwargs |= {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    plan_kwargs |= {"data_type": torch.bfloat16, "sm_scale": 0.1, "rope_scale": 2.0}
    plan_kwargs |= {"rope_theta": 5e5, "non_blocking": False}
    kwargs: dict = {"custom_mask_p": None, "packed_custom_mask_p": None, "causal_p": True}
    kwargs |= {"kv_layout_p": "NHD", "pos_encoding_mode_p": "NONE", "sm_scale_p": 0.2}
    kwargs |= {"window_left_p": 3, "rope_scale_p": 2.0, "rope_theta_p": 5e5, "return_lse_p": True}
    kwargs |= {"custom_mask_d": None, "packed_custom_mask_d": None, "causal_d": True}
    kwargs |= {"kv_layout_d": "HND", "pos_encoding_mode_d": "ROPE_LLAMA", "sm_scale_d": 0.3}
    kwargs |= {"window_left_d": 1, "rope_scale_d": 2.0, "rope_theta_d": 5e5}
    kwargs |= {"q_scale": None, "k_scale": None, "v_scale": None, "return_lse_d": True}
    kwargs |= {"use_fp16_qk_reduction": False, "enable_pdl": True}
    run = (x["q_p"], x["k_p"], x["v_p"], x["q_d"], (x["k_cache"], x["v_cache"]))
    return Call(name, run, kwargs, (plan, plan_kwargs), {"_kv_layout": "NHD"})


def _batch_pod(c: Any) -> Any:
    from _routable_calls import Call

    name = "batch_pod_run_h32_kv8_d128_ps16"
    axes = {"len_indptr_p": 3, "total_q_p": 5, "num_pages_p": 32}
    axes |= {"len_indptr_d": 4, "total_q_d": 3, "num_pages_d": 32}
    x, _ = c.inputs(name, **axes)
    plan = (x["qo_indptr_p"], x["kv_indptr_p"], x["kv_indices_p"], x["kv_last_page_len_p"])
    plan += (x["qo_indptr_d"], x["kv_indptr_d"], x["kv_indices_d"], x["kv_last_page_len_d"])
    plan += (32, 8, 128, 16)
    plan_kwargs: dict = {"pos_encoding_mode": "NONE", "window_left": 7}
    plan_kwargs |= {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    plan_kwargs |= {"data_type": torch.bfloat16, "sm_scale": 0.1, "rope_scale": 2.0}
    plan_kwargs |= {"rope_theta": 5e5, "non_blocking": False}
    kwargs: dict = {"custom_mask_p": None, "packed_custom_mask_p": None, "causal_p": True}
    kwargs |= {"q_scale": None, "k_scale": None, "v_scale": None, "return_lse": False}
    kwargs |= {"use_fp16_qk_reduction": False, "enable_pdl": True}
    run = (x["q_p"], (x["k_cache_p"], x["v_cache_p"]), x["q_d"], (x["k_cache_d"], x["v_cache_d"]))
    return Call(name, run, kwargs, (plan, plan_kwargs), {"_kv_layout": "NHD"})


def _cudnn_decode(c: Any) -> Any:
    from _routable_calls import Call

    name = "cudnn_batch_decode_h64_kv8_d64_ps16"
    x, axes = c.inputs(name, batch_size=2, num_pages_per_seq=3, total_num_pages=8)
    args = (x["q"], x["k_cache"], x["v_cache"], 0.125, torch.empty(16, dtype=torch.uint8))
    kwargs: dict = {"max_sequence_kv": 48, "actual_seq_lens_kv": x["actual_seq_lens_kv"]}
    kwargs |= {"block_tables": x["block_tables"], "is_cuda_graph_compatible": True}
    kwargs |= {f"batch_offsets_{k}": None for k in "qokv"}
    kwargs |= {"out": c.buffer(name, "output", axes), "return_lse": True}
    kwargs |= {"lse": c.buffer(name, "lse", axes), "q_len_per_req": 1, "window_left": 127}
    kwargs |= {"sinks": x["sinks"]}
    return Call(name, args, kwargs)


def _append_mla(c: Any) -> Any:
    from _routable_calls import Call

    name = "append_paged_mla_kv_cache_ckv512_kpe64"
    x, _ = c.inputs(name, nnz_kv=3, batch_size=2, num_pages=8, page_size=4, num_kv_indices=4)
    args = (x["append_ckv"], x["append_kpe"], x["batch_indices"], x["positions"])
    args += (x["ckv_cache"], x["kpe_cache"], x["kv_indices"], x["kv_indptr"])
    return Call(name, (*args, x["kv_last_page_len"]), {})


def _bytes(t: Any) -> Any:
    return t.view(torch.uint8)


def _nvfp4_append(c: Any) -> Any:
    from _routable_calls import Call

    name = "nvfp4_quantize_append_paged_kv_cache_kv8_d128_ps16"
    x, _ = c.inputs(name, nnz=3, batch_size=2, num_pages=6, num_kv_indices=4)
    args = (x["append_key"], x["append_value"], x["batch_indices"], x["positions"])
    args += ((_bytes(x["k_cache"]), _bytes(x["v_cache"])), (x["k_scale_cache"], x["v_scale_cache"]))
    args += (x["kv_indices"], x["kv_indptr"], x["kv_last_page_len"], 0.5, 2.0)
    return Call(name, args, {"kv_layout": "NHD"})


def _nvfp4_append_slots(c: Any) -> Any:
    from _routable_calls import Call

    name = "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping_kv8_d128_ps16"
    x, _ = c.inputs(name, nnz=3, num_pages=2)
    args = (x["append_key"], x["append_value"], x["slot_mapping"])
    args += ((_bytes(x["k_cache"]), _bytes(x["v_cache"])), (x["k_scale_cache"], x["v_scale_cache"]))
    return Call(name, (*args, x["k_scale"], 1.5), {"kv_layout": "NHD"})


def _nvfp4_append_mla(c: Any) -> Any:
    from _routable_calls import Call

    name = "nvfp4_quantize_append_paged_mla_kv_cache_ckv512_kpe64"
    x, _ = c.inputs(name, nnz_kv=3, batch_size=2, num_pages=8, page_size=4, num_kv_indices=4)
    args = (x["append_ckv"], x["append_kpe"], x["batch_indices"], x["positions"])
    args += (_bytes(x["ckv_cache"]), x["ckv_sf_cache"], x["kpe_cache"], x["kv_indices"])
    return Call(name, (*args, x["kv_indptr"], x["kv_last_page_len"], 0.5, 0.25), {})


def _dsv41_fp4_pack(c: Any) -> Any:
    from _routable_calls import Call

    name = "dsv41_fp4_quantize_pack_sparse_mla_cache_ps64"
    x, _ = c.inputs(name, num_pages=2)
    # HND, as the definition's output: FlashInfer's template describes an NHD call's
    # [pages, page_size, 1, bytes] (the same bytes) in the other order.
    return Call(name, (x["latent_kv"],), {"kv_layout": "HND"})


def _dsv41_fp4_append(c: Any) -> Any:
    from _routable_calls import Call

    name = "dsv41_fp4_quantize_append_sparse_mla_cache_ps64"
    x, _ = c.inputs(name, num_tokens=3, num_pages=2)
    return Call(name, (x["latent_kv"], x["slot_mapping"], x["cache"].view(torch.uint8)), {})


def _dsv41_fp8_pack(c: Any) -> Any:
    from _routable_calls import Call

    name = "dsv41_fp8_quantize_pack_sparse_mla_cache_ps64"
    x, _ = c.inputs(name, num_pages=2)
    # HND, as the definition's output: FlashInfer's template describes an NHD call's
    # [pages, page_size, 1, bytes] (the same bytes) in the other order.
    return Call(name, (x["latent_kv"],), {"kv_layout": "HND"})


def _dsv41_fp8_append(c: Any) -> Any:
    from _routable_calls import Call

    name = "dsv41_fp8_quantize_append_sparse_mla_cache_ps64"
    x, _ = c.inputs(name, num_tokens=3, num_pages=2)
    return Call(name, (x["latent_kv"], x["slot_mapping"], x["cache"].view(torch.uint8)), {})


def _block_sparse(c: Any) -> Any:
    from _routable_calls import Call

    name = "block_sparse_run_h32_kv8_d128"
    x, _ = c.inputs(name, qo_len=32, kv_len=16, len_indptr=3, nnz=3)
    # 2 x 2 blocks of 16 x 8: block row 0 sees column block 1, block row 1 both.
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32)
    indices = torch.tensor([1, 0, 1], dtype=torch.int32)
    plan = (indptr, indices, 32, 16, 16, 8, 32, 8, 128)
    plan_kwargs: dict = {"mask": None, "packed_mask": None, "causal": False}
    plan_kwargs |= {"pos_encoding_mode": "NONE", "use_fp16_qk_reduction": False}
    plan_kwargs |= {"logits_soft_cap": 30.0, "sm_scale": 0.1, "rope_scale": 2.0}
    plan_kwargs |= {"rope_theta": 5e5, "q_data_type": torch.bfloat16}
    plan_kwargs |= {"kv_data_type": torch.bfloat16, "o_data_type": torch.bfloat16}
    plan_kwargs |= {"non_blocking": False, "block_mask": None, "kv_block_lens": None}
    plan_kwargs |= {"q2k_indices": None, "q2k_num": None, "kv_splits": None, "use_clc": None}
    plan_kwargs |= {"q_scale": None, "k_scale": None, "v_scale": None}
    kwargs: dict = {"scale_q": None, "scale_k": None, "scale_v": None, "out": None}
    kwargs |= {"lse": None, "return_lse": True, "enable_pdl": True}
    return Call(name, (x["q"], x["k"], x["v"]), kwargs, (plan, plan_kwargs))


def _var_block_sparse(c: Any) -> Any:
    from _routable_calls import Call

    name = "var_block_sparse_run_h32_kv8_d128"
    x, _ = c.inputs(name, qo_len=6, kv_len=6)
    # The docstring's example: rows in blocks of 1, 2, 3; keys in blocks of 3, 1, 2.
    mask = torch.tensor([[0, 0, 1], [1, 0, 1], [0, 1, 1]], dtype=torch.bool).expand(8, 3, 3)
    rows = torch.tensor([1, 2, 3], dtype=torch.int32).expand(8, 3)
    cols = torch.tensor([3, 1, 2], dtype=torch.int32).expand(8, 3)
    plan_kwargs: dict = {"causal": False, "pos_encoding_mode": "NONE"}
    plan_kwargs |= {"use_fp16_qk_reduction": False, "logits_soft_cap": 30.0, "sm_scale": 0.1}
    plan_kwargs |= {"rope_scale": 2.0, "rope_theta": 5e5, "non_blocking": False}
    plan_kwargs |= {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    kwargs = {"out": None, "lse": None, "return_lse": False, "enable_pdl": True}
    plan = ((mask, rows, cols, 32, 8, 128), plan_kwargs)
    return Call(name, (x["q"], x["k"], x["v"]), kwargs, plan)


def _cudnn_prefill(c: Any) -> Any:
    from _routable_calls import Call

    name = "cudnn_batch_prefill_h32_kv8_d128_ps16"
    x, _ = c.inputs(name, batch_size=2, num_tokens=5, num_pages_per_seq=2, total_num_pages=6)
    lens_q = (x["qo_indptr"][1:] - x["qo_indptr"][:-1]).reshape(2, 1, 1, 1)
    args = (x["q"], x["k_cache"], x["v_cache"], 0.1, torch.empty(16, dtype=torch.uint8))
    kwargs: dict = {"max_token_per_sequence": 5, "max_sequence_kv": 32}
    kwargs |= {"actual_seq_lens_q": lens_q}
    kwargs |= {"actual_seq_lens_kv": x["actual_seq_lens_kv"].reshape(2, 1, 1, 1)}
    kwargs |= {"block_tables": x["block_tables"], "causal": True, "return_lse": False}
    kwargs |= {"q_scale": None, "k_scale": None, "v_scale": None}
    kwargs |= {"batch_offsets_q": x["qo_indptr"], "batch_offsets_o": x["qo_indptr"]}
    kwargs |= {"batch_offsets_k": None, "batch_offsets_v": None, "batch_offsets_stats": None}
    kwargs |= {"batch_offsets_units": "tokens", "out": None, "lse": None}
    kwargs |= {"is_cuda_graph_compatible": True, "backend": "cubin"}
    kwargs |= {"o_data_type": torch.bfloat16, "lse_base": "ln"}
    return Call(name, args, kwargs)


CAKE_NAME = "cake_vsa_run_h24_kv24_d128_blk64"


def cake_plan(x: dict, **changes: Any) -> dict:
    """What plan_cake_vsa returns for a block mask over blocks of 64, of the keys
    run_cake_vsa's route reads (its workspaces and route metadata left out)."""
    mask = x["block_mask"]
    plan: dict = {"M": x["q"].shape[0], "N": x["k"].shape[0], "R": 64, "C": 64}
    plan |= {"mb": mask.shape[1], "nb": mask.shape[2], "num_qo_heads": 24}
    plan |= {"num_kv_heads": 24, "head_dim": 128, "dtype": torch.bfloat16}
    plan |= {"sm_scale": 0.1, "block_mask": mask, "kv_block_lens": None}
    plan |= {"indptr": None, "indices": None, "q2k_indices": None, "workspace": {}}
    return plan | changes


def _cake_vsa(c: Any) -> Any:
    from _routable_calls import Call

    x, axes = c.inputs(CAKE_NAME, num_blocks_row=2, num_blocks_col=3)
    x["block_mask"][:, 0, 1] = False  # the first block row skips the middle block
    args = (cake_plan(x), x["q"], x["k"], x["v"])
    kwargs = {"out": c.buffer(CAKE_NAME, "output", axes), "lse": None, "return_lse": False}
    return Call(CAKE_NAME, args, kwargs | {"backend": "cake"})


def _nvfp4_sm120_quantize(c: Any) -> Any:
    from _routable_calls import Call

    # One mean for all of q. Lengths in whole 128-token blocks, which FlashInfer's template
    # can pair with the definition's padded ones (test_catalogue_nvfp4_attention.py pads).
    name = "nvfp4_attention_sm120_quantize_qkv_h32_kv8_d128"
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 32, 128, 128, generator=g).bfloat16()
    k, v = torch.randn(2, 1, 8, 256, 128, generator=g).bfloat16()
    return Call(name, (q, k, v), {"per_block_mean": False})


def _nvfp4_sm120_fwd(c: Any) -> Any:
    from _routable_calls import Call

    name = "nvfp4_attention_sm120_fwd_h32_kv8_d128"
    x, axes = c.inputs(name, batch_size=1, q_blocks=1, padded_kv_len=256)
    packed = [x[n].view(torch.uint8) for n in ("q_fp4", "k_fp4", "v_fp4_t")]
    scales = [x["q_scale"], x["k_scale"], x["v_scale_t"], x["qk_correction"][:, :, :1]]
    kwargs: dict = {"sm_scale": None, "causal": False, "per_block_mean": False}
    kwargs |= {"out": c.buffer(name, "output", axes), "lse": c.buffer(name, "lse", axes)}
    kwargs |= {"out_dtype": torch.bfloat16, "softmax_scale": 0.1, "return_lse": True}
    kwargs |= {"unpadded_k_len": 200}
    return Call(name, (*packed, *scales), kwargs)


ROUTABLE: dict[str, Callable[[Any], Any]] = {
    "flashinfer.decode.single_decode_with_kv_cache": _single_decode,
    "flashinfer.prefill.single_prefill_with_kv_cache": _single_prefill,
    "flashinfer.cascade.merge_state_in_place": _merge_state_in_place,
    "flashinfer.cascade.merge_states": _merge_states,
    "flashinfer.cascade.MultiLevelCascadeAttentionWrapper.run": _cascade,
    "flashinfer.attention.BatchAttention.run": _batch_attention,
    "flashinfer.pod.PODWithPagedKVCacheWrapper.run": _pod,
    "flashinfer.pod.BatchPODWithPagedKVCacheWrapper.run": _batch_pod,
    "flashinfer.cudnn.decode.cudnn_batch_decode_with_kv_cache": _cudnn_decode,
    "flashinfer.page.append_paged_mla_kv_cache": _append_mla,
    "flashinfer.page.nvfp4_quantize_append_paged_kv_cache": _nvfp4_append,
    "flashinfer.page.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping": _nvfp4_append_slots,
    "flashinfer.page.nvfp4_quantize_append_paged_mla_kv_cache": _nvfp4_append_mla,
    "flashinfer.mla._sparse_mla_sm120._api.dsv41_fp4_quantize_pack_sparse_mla_cache": (
        _dsv41_fp4_pack
    ),
    "flashinfer.mla._sparse_mla_sm120._api.dsv41_fp4_quantize_append_sparse_mla_cache": (
        _dsv41_fp4_append
    ),
    "flashinfer.mla._sparse_mla_sm120._api.dsv41_fp8_quantize_pack_sparse_mla_cache": (
        _dsv41_fp8_pack
    ),
    "flashinfer.mla._sparse_mla_sm120._api.dsv41_fp8_quantize_append_sparse_mla_cache": (
        _dsv41_fp8_append
    ),
    "flashinfer.sparse.BlockSparseAttentionWrapper.run": _block_sparse,
    "flashinfer.sparse.VariableBlockSparseAttentionWrapper.run": _var_block_sparse,
    "flashinfer.cake_vsa.run_cake_vsa": _cake_vsa,
    "flashinfer.cudnn.prefill.cudnn_batch_prefill_with_kv_cache": _cudnn_prefill,
    "flashinfer.nvfp4_attention_sm120.nvfp4_attention_sm120_quantize_qkv": _nvfp4_sm120_quantize,
    "flashinfer.nvfp4_attention_sm120.nvfp4_attention_sm120_fwd": _nvfp4_sm120_fwd,
}
