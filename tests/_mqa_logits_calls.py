"""Routable calls of the paged MQA logits APIs of ``attention_dsa.fidef`` (FlashInfer's
``flashinfer.attn_scores``), whose output is as wide as the ``max_seq_len`` argument.

Each builder returns a ``Call`` (``_routable_calls``) that gives every parameter of the real
signature at a value the family's rules accept, so that ``test_flashinfer_apply.py`` can check
the call is routed; ``test_catalogue_mqa_logits.py`` varies them one parameter at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

FP8_NAME = "fp8_paged_mqa_logits_nn2_H64_D128_bs64"


def fp8_case(c: Any, seed: int = 0, max_seq_len: int = 100) -> tuple[tuple, dict, dict]:
    """(positional arguments as FlashInfer takes them, the definition's inputs, axes)."""
    x, axes = c.inputs(FP8_NAME, seed=seed, batch_size=2, max_seq_len=max_seq_len)
    # FlashInfer's KV pool is uint8; the definition reads the same bytes as int8.
    args = (x["q"], x["kv_fused"].view(torch.uint8), x["weights"], x["block_tables"])
    return args + (x["seq_lens"], x["max_seq_len"]), x, axes


def _fp8(c: Any) -> Any:
    from _routable_calls import Call

    args, _, _ = fp8_case(c)
    kwargs: dict = {"output_dtype": torch.float32, "epi_dtype": torch.float32}
    kwargs |= {"acc_dtype": torch.float32, "out": None}
    kwargs |= {"schedule_meta": torch.zeros(133, 2, dtype=torch.int32)}
    return Call(FP8_NAME, args, kwargs)


FP4_NAME = "fp4_paged_mqa_logits_nn2_H64_Dp64_bs64"


def fp4_case(c: Any, seed: int = 0, max_seq_len: int = 100) -> tuple[tuple, dict, dict]:
    """(positional arguments as FlashInfer takes them, the definition's inputs, axes)."""
    x, axes = c.inputs(FP4_NAME, seed=seed, batch_size=2, max_seq_len=max_seq_len)
    # FlashInfer's packed codes and KV pool are uint8.
    args = (x["q"].view(torch.uint8), x["q_sf"], x["kv_fused"].view(torch.uint8), x["weights"])
    return args + (x["block_tables"], x["seq_lens"], x["max_seq_len"]), x, axes


def _fp4(c: Any) -> Any:
    from _routable_calls import Call

    args, _, _ = fp4_case(c)
    kwargs: dict = {"sf_vec_size": 32, "output_dtype": torch.bfloat16}
    kwargs |= {"epi_dtype": torch.float32, "is_kv_sf_interleaved": False, "out": None}
    kwargs |= {"schedule_meta": torch.zeros(133, 2, dtype=torch.int32)}
    return Call(FP4_NAME, args, kwargs)


ROUTABLE: dict[str, Callable[[Any], Any]] = {
    "flashinfer.attn_scores.attn_scores.fp8_paged_mqa_logits": _fp8,
    "flashinfer.attn_scores.attn_scores.fp4_paged_mqa_logits": _fp4,
}
