"""Routable calls of the PrimTS attention APIs of ``definitions/attention_prims_ts.fidef``
and the CuTe DSL prefill wrapper of ``attention_cute_dsl.fidef`` (see ``_routable_calls`` for the convention): every parameter of the real signature is given,
at a value the family's rules accept, a non-default one where a rule allows it (a causal
window, explicit scales, an ignored scratch buffer or launch option).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

# What ``_routable_calls`` defines; imported lazily by its users to avoid a cycle.
Catalogue = Any

DECODE_NAME = "prims_ts_batch_decode_h32_kv8_d128_ps16"
WRAPPER_NAME = "prims_ts_decode_wrapper_h32_kv8_d128_ps16"


def combined_cache(x: dict) -> torch.Tensor:
    """The definition's HND pages as one tensor [pages, 2, kv_heads, page_size, head_dim]."""
    return torch.stack([x["k_cache"], x["v_cache"]], dim=1)


def decode_case(c: Catalogue, name: str, seed: int = 0) -> tuple[dict, dict]:
    return c.inputs(name, seed=seed, batch_size=3, num_pages=12, max_pages_per_seq=3)


def decode_kwargs(c: Catalogue, x: dict, axes: dict) -> dict:
    """Every keyword of batch_decode_with_paged_kv_cache at a routable value."""
    kwargs: dict = {"kv_scale_factors": None, "seq_len_q": 1, "qo_indptr": None}
    kwargs |= {"max_seq_len_q": 1, "mask_type": "causal", "window_left": 20}
    kwargs |= {"kv_layout": "HND", "bmm1_scale": 0.1, "bmm2_scale": 0.5}
    kwargs |= {"out": c.buffer(DECODE_NAME, "output", axes), "out_dtype": torch.bfloat16}
    kwargs |= {"page_size": 16, "split_kv": False}
    kwargs |= {"workspace_buffer": torch.zeros(64, dtype=torch.int8), "max_kv_len": 48}
    kwargs |= {"validate": False}
    return kwargs


def _decode(c: Catalogue) -> Any:
    from _routable_calls import Call

    x, axes = decode_case(c, DECODE_NAME)
    args = (x["q"], (x["k_cache"], x["v_cache"]), x["block_tables"], x["seq_lens_kv"])
    return Call(DECODE_NAME, args, decode_kwargs(c, x, axes))


def wrapper_plan(batch_size: int = 3, **changes: Any) -> tuple[tuple, dict]:
    """Every parameter of BatchDecodePagedTSWrapper.plan at a routable value."""
    args = ("cpu", batch_size, 32, 8, 128, 16, 48)
    kwargs: dict = {"max_seq_len_q": 1, "packed_query": False, "q_data_type": torch.bfloat16}
    kwargs |= {"k_data_type": torch.bfloat16, "v_data_type": None, "kv_data_type": None}
    kwargs |= {"o_data_type": torch.bfloat16, "mask_type": "causal", "window_left": 20}
    kwargs |= {"seq_lens": None, "workspace_buffer": torch.zeros(64, dtype=torch.int8)}
    kwargs |= {"storage_page_size": 16, "split_kv": False, "validate": False}
    kwargs |= {"initialize_workspace": False}
    return args, kwargs | changes


def wrapper_state(x: dict) -> dict:
    """What the wrapper holds after its constructor and the plan above: the KV layout, and
    of the plan state what FlashInfer's trace template of run() reads."""
    plan_state = SimpleNamespace(
        use_packed_q=False,
        seq_len_q=1,
        page_size=16,
        storage_page_size=16,
        mask_type="causal",
        window_left=20,
        max_kv_len=48,
        kv_prefix_mode="dynamic",
        kv_lengths_mode="dynamic",
        planned_seq_lens_device=None,
        output_dtype=torch.bfloat16,
        policy=(("split_kv_allowed", False),),
    )
    return {"_kv_layout": "HND", "_plan_state": plan_state}


def _wrapper(c: Catalogue) -> Any:
    from _routable_calls import Call

    x, axes = decode_case(c, WRAPPER_NAME)
    args = (x["q"], (x["k_cache"], x["v_cache"]), x["seq_lens"], x["block_tables"])
    kwargs: dict = {"kv_scale_factors": None, "qo_indptr": None, "bmm1_scale": 0.1}
    kwargs |= {"bmm2_scale": 0.5, "out": c.buffer(WRAPPER_NAME, "output", axes)}
    kwargs |= {"validate": False}
    return Call(WRAPPER_NAME, args, kwargs, wrapper_plan(), wrapper_state(x))


MLA_NAME = "prims_ts_batch_mla_decode_h16_ckv512_kpe64_ps32"
MLA_WRAPPER_NAME = "prims_ts_mla_decode_wrapper_h16_ckv512_kpe64_ps32"


def mla_case(c: Catalogue, name: str, seed: int = 0, seq_len_q: int = 2) -> tuple[dict, dict]:
    return c.inputs(
        name, seed=seed, batch_size=2, seq_len_q=seq_len_q, num_pages=6, max_pages_per_seq=3
    )


def _mla(c: Catalogue) -> Any:
    from _routable_calls import Call

    x, axes = mla_case(c, MLA_NAME)
    args = (x["query"], x["kv_cache"], x["block_tables"], x["seq_lens"])
    kwargs: dict = {"qo_indptr": None, "max_seq_len_q": 2, "kv_lora_rank": 512}
    kwargs |= {"qk_rope_head_dim": 64, "mask_type": "dense", "max_kv_len": 96}
    kwargs |= {"bmm1_scale": 1 / 192**0.5, "bmm2_scale": 0.5}
    kwargs |= {"out": c.buffer(MLA_NAME, "output", axes), "out_dtype": torch.bfloat16}
    kwargs |= {"workspace_buffer": torch.zeros(64, dtype=torch.int8), "validate": False}
    return Call(MLA_NAME, args, kwargs)


def mla_wrapper_plan(batch_size: int = 2, seq_len_q: int = 2, **changes: Any) -> tuple:
    """Every parameter of BatchMLADecodePagedTSWrapper.plan at a routable value."""
    args = ("cpu", batch_size, 16, 512, 64, 32, 96)
    kwargs: dict = {"max_seq_len_q": seq_len_q, "packed_query": False}
    kwargs |= {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    kwargs |= {"o_data_type": torch.bfloat16, "mask_type": "causal"}
    kwargs |= {"workspace_buffer": torch.zeros(64, dtype=torch.int8), "validate": False}
    return args, kwargs | changes


def _mla_wrapper(c: Catalogue) -> Any:
    from _routable_calls import Call

    x, axes = mla_case(c, MLA_WRAPPER_NAME)
    args = (x["query"], x["kv_cache"], x["block_tables"], x["seq_lens"])
    kwargs: dict = {"qo_indptr": None, "bmm1_scale": 1 / 192**0.5, "bmm2_scale": 0.5}
    kwargs |= {"out": c.buffer(MLA_WRAPPER_NAME, "output", axes), "validate": False}
    # Of the plan state, what FlashInfer's trace template of run() reads.
    plan_state = SimpleNamespace(
        packed_query=False,
        mask_type="causal",
        max_seq_len_q=2,
        max_kv_len=96,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
    )
    return Call(MLA_WRAPPER_NAME, args, kwargs, mla_wrapper_plan(), {"_plan_state": plan_state})


CUTE_PREFILL_NAME = "cute_dsl_batch_prefill_run_h40_kv40_d128"


def cute_prefill_case(c: Catalogue, name: str = CUTE_PREFILL_NAME, seed: int = 0):
    return c.inputs(name, seed=seed, len_indptr=3, total_q=5, total_kv=9)


def cute_prefill_plan(x: dict, heads: int = 40, kv_heads: int = 40, **changes: Any) -> tuple:
    """Every parameter of BatchPrefillCuteDSLWrapper.plan at a routable value."""
    args = (x["qo_indptr"], x["kv_indptr"], heads, kv_heads, 128)
    kwargs: dict = {"head_dim_vo": 128, "causal": True, "sm_scale": 0.1}
    kwargs |= {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    kwargs |= {"window_left": 3, "variant": None, "window_right": -1, "page_size": None}
    kwargs |= {"paged_kv_indptr": None, "paged_kv_indices": None}
    kwargs |= {"paged_kv_last_page_len": None, "kv_layout": "NHD"}
    return args, kwargs | changes


def _cute_prefill(c: Catalogue) -> Any:
    from _routable_calls import Call

    name = CUTE_PREFILL_NAME
    x, axes = cute_prefill_case(c)
    kwargs: dict = {"out": c.buffer(name, "output", axes), "return_lse": True}
    kwargs |= {"lse": c.buffer(name, "lse", axes)}
    # What the constructor leaves: the workspace it is bound to, unused by the kernel.
    state = {"_float_workspace_buffer": torch.empty(16, dtype=torch.uint8)}
    return Call(name, (x["q"], x["k"], x["v"]), kwargs, cute_prefill_plan(x), state)


CUTE_MLA_NAME = "cute_dsl_batch_mla_run_h16_ckv512_kpe64_ps32"


def cute_mla_case(c: Catalogue, name: str = CUTE_MLA_NAME, seed: int = 0):
    return c.inputs(name, seed=seed, batch_size=2, num_pages=6, max_pages_per_seq=3)


def cute_mla_plan(**changes: Any) -> tuple:
    """Every parameter of BatchMLADecodeCuteDSLWrapper.plan at a routable value."""
    kwargs: dict = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_heads": 16}
    kwargs |= {"page_size": 32, "q_dtype": torch.bfloat16, "out_dtype": torch.bfloat16}
    kwargs |= {"is_var_seq": True, "enable_pdl": True, "variant": None}
    return (), kwargs | changes


def _cute_mla(c: Catalogue) -> Any:
    from _routable_calls import Call

    x, axes = cute_mla_case(c)
    args = (x["q"], x["kv_cache"], x["block_tables"], x["seq_lens"], 96, 1 / 192**0.5)
    kwargs = {"output_scale": 0.5, "out": c.buffer(CUTE_MLA_NAME, "output", axes)}
    # What the constructor leaves: the workspace it is bound to.
    state = {"_workspace_buffer": torch.empty(16, dtype=torch.int8)}
    return Call(CUTE_MLA_NAME, args, kwargs, cute_mla_plan(), state)


SPARSE_NAME = "prims_ts_block_sparse_h32_kv8_d128_qb64_kb64"
SPARSE_WRAPPER_NAME = "prims_ts_block_sparse_wrapper_h32_kv8_d128_qb64_kb64"
PAGED_SPARSE_NAME = "prims_ts_paged_block_sparse_h32_kv8_d128_qb64_kb64_ps64"
PAGED_SPARSE_WRAPPER_NAME = "prims_ts_paged_block_sparse_wrapper_h32_kv8_d128_qb64_kb64_ps64"


def sparse_case(c: Catalogue, name: str, seed: int = 0, **axes: int) -> tuple[dict, dict]:
    """Two requests of 80 queries (two BSR rows) over 160 keys (three KV blocks)."""
    sizes = {"batch_size": 2, "seq_len_q": 80, "seq_len_kv": 160, "num_pattern_heads": 8}
    return c.inputs(name, seed=seed, **(sizes | axes))


def paged_sparse_case(c: Catalogue, name: str, seed: int = 0, **axes: int) -> tuple[dict, dict]:
    """Two requests of 80 queries over three pages of 64 (129..192 keys each)."""
    sizes = {"batch_size": 2, "seq_len_q": 80, "num_pages": 7, "max_pages_per_seq": 3}
    return c.inputs(name, seed=seed, **(sizes | {"num_pattern_heads": 8} | axes))


def _sparse(c: Catalogue) -> Any:
    from _routable_calls import Call

    x, axes = sparse_case(c, SPARSE_NAME)
    args = (x["q"], x["k"], x["v"], x["block_indptr"], x["block_indices"], 64, 64)
    kwargs: dict = {"exact_block_bits": None, "k_summary": None, "v_summary": None}
    kwargs |= {"kv_valid_bits": None, "use_block_sparse": True, "sparse_format": "bsr"}
    kwargs |= {"use_proxy_routes": False, "mask_type": "causal"}
    kwargs |= {"share_pattern_across_kv_heads": False, "sm_scale": 0.1}
    kwargs |= {"out": c.buffer(SPARSE_NAME, "output", axes), "sage": None, "sage_config": None}
    return Call(SPARSE_NAME, args, kwargs)


def sparse_wrapper_plan(**changes: Any) -> tuple[tuple, dict]:
    """Every parameter of BlockSparseTSWrapper.plan at a routable value."""
    args = (2, 80, 160, 32, 8, 128, 64, 64)
    kwargs: dict = {"device": "cpu", "use_block_sparse": True, "max_blocks_per_row": 3}
    kwargs |= {"use_kv_valid_bits": False, "sparse_format": "bsr", "use_proxy_routes": False}
    kwargs |= {"mask_type": "causal", "share_pattern_across_kv_heads": False}
    kwargs |= {"q_data_type": torch.bfloat16, "k_data_type": torch.bfloat16}
    kwargs |= {"v_data_type": None, "kv_data_type": None, "o_data_type": torch.bfloat16}
    kwargs |= {"sage_config": None}
    return args, kwargs | changes


def _sparse_wrapper(c: Catalogue) -> Any:
    from _routable_calls import Call

    name = SPARSE_WRAPPER_NAME
    x, axes = sparse_case(c, name)
    args = (x["q"], x["k"], x["v"], x["block_indptr"], x["block_indices"])
    kwargs: dict = {"exact_block_bits": None, "k_summary": None, "v_summary": None}
    kwargs |= {"kv_valid_bits": None, "sm_scale": 0.1, "out": c.buffer(name, "output", axes)}
    kwargs |= {"validate": False, "sage": None}
    return Call(name, args, kwargs, sparse_wrapper_plan(), {"_plan_state": sparse_plan_state()})


def sparse_plan_state(**changes: Any) -> SimpleNamespace:
    """Of the state a block-sparse plan publishes, what FlashInfer's trace templates read."""
    state = {"use_block_sparse": True, "sparse_format": "bsr", "use_proxy_routes": False}
    return SimpleNamespace(**(state | {"share_pattern_across_kv_heads": False} | changes))


def _paged_sparse(c: Catalogue) -> Any:
    from _routable_calls import Call

    name = PAGED_SPARSE_NAME
    x, axes = paged_sparse_case(c, name)
    args = (x["q"], (x["k_cache"], x["v_cache"]), x["block_tables"], x["seq_lens_kv"])
    args += (x["block_indptr"], x["block_indices"], 64, 64)
    kwargs: dict = {"max_seq_len_kv": 192, "kv_valid_bits": None, "mask_type": "causal"}
    kwargs |= {"share_pattern_across_kv_heads": False, "sm_scale": 0.1}
    kwargs |= {"out": c.buffer(name, "output", axes)}
    return Call(name, args, kwargs)


def paged_sparse_wrapper_plan(**changes: Any) -> tuple[tuple, dict]:
    """Every parameter of BlockSparsePagedTSWrapper.plan at a routable value."""
    args = (2, 80, 192, 32, 8, 128, 64, 64, 64)
    kwargs: dict = {"device": "cpu", "max_blocks_per_row": 3, "use_kv_valid_bits": False}
    kwargs |= {"mask_type": "causal", "share_pattern_across_kv_heads": False}
    kwargs |= {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    kwargs |= {"o_data_type": torch.bfloat16}
    return args, kwargs | changes


def _paged_sparse_wrapper(c: Catalogue) -> Any:
    from _routable_calls import Call

    name = PAGED_SPARSE_WRAPPER_NAME
    x, axes = paged_sparse_case(c, name)
    args = (x["q"], (x["k_cache"], x["v_cache"]), x["block_tables"], x["seq_lens_kv"])
    args += (x["block_indptr"], x["block_indices"])
    kwargs: dict = {"kv_valid_bits": None, "sm_scale": 0.1}
    kwargs |= {"out": c.buffer(name, "output", axes), "validate": False}
    state = {"_plan_state": sparse_plan_state()}
    return Call(name, args, kwargs, paged_sparse_wrapper_plan(), state)


ROUTABLE: dict[str, Callable[[Any], Any]] = {
    "flashinfer.cute_dsl.attention.wrappers.batch_mla.BatchMLADecodeCuteDSLWrapper.run": (
        _cute_mla
    ),
    "flashinfer.cute_dsl.attention.wrappers.batch_prefill.BatchPrefillCuteDSLWrapper.run": (
        _cute_prefill
    ),
    "flashinfer.attention.prims_ts.decode.batch_decode_with_paged_kv_cache": _decode,
    "flashinfer.attention.prims_ts.decode.BatchDecodePagedTSWrapper.run": _wrapper,
    "flashinfer.attention.prims_ts.mla_decode.batch_mla_decode_with_paged_kv_cache": _mla,
    "flashinfer.attention.prims_ts.mla_decode.BatchMLADecodePagedTSWrapper.run": _mla_wrapper,
    "flashinfer.attention.prims_ts.block_sparse.block_sparse_attention": _sparse,
    "flashinfer.attention.prims_ts.block_sparse.BlockSparseTSWrapper.run": _sparse_wrapper,
    "flashinfer.attention.prims_ts.block_sparse.block_sparse_attention_with_paged_kv_cache": (
        _paged_sparse
    ),
    "flashinfer.attention.prims_ts.block_sparse.BlockSparsePagedTSWrapper.run": (
        _paged_sparse_wrapper
    ),
}
