"""Routable calls (see ``_routable_calls``) of the state-space and linear-attention APIs of
ssm_gdn.fidef and ssm_linear.fidef: every parameter given, each at a value the rules accept."""

from __future__ import annotations

from collections.abc import Callable

import torch
from _routable_calls import Call, Catalogue


def _chunk_prefill(c: Catalogue) -> Call:
    name = "gdn_prefill_qk4_v8_d128"
    x, axes = c.inputs(name, total_seq_len=5, num_seqs=2, len_cu_seqlens=3)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["scale"], x["state"], True)
    kwargs: dict = {"cu_seqlens": x["cu_seqlens"], "use_qk_l2norm_in_kernel": True}
    kwargs |= {"output": c.buffer(name, "output", axes)}
    kwargs |= {"output_state": c.buffer(name, "new_state", axes)}
    kwargs |= {"state_checkpoints": None, "checkpoint_cu_starts": None}
    kwargs |= {"checkpoint_every_n_tokens": 0, "use_cp": False, "state_indices": None}
    kwargs |= {"_cp_chunk_len": 64, "backend": "auto", "max_seqlen": 8}
    return Call(name, args, kwargs)


def _decode_pool(c: Catalogue) -> Call:
    name = "gdn_decode_pool_qk4_v8_d128"
    x, axes = c.inputs(name, batch_size=2, pool_size=4)
    args = (x["q"], x["k"], x["v"], None, x["A_log"], x["a"], x["dt_bias"], x["b"])
    kwargs: dict = {"scale": x["scale"], "output": c.buffer(name, "output", axes)}
    kwargs |= {"use_qk_l2norm": True, "initial_state": x["pool"]}
    kwargs |= {"initial_state_indices": x["slots"], "output_state_indices": None}
    kwargs |= {"intermediate_states_buffer": None, "disable_state_update": False}
    kwargs |= {"backend": "auto"}
    return Call(name, args, kwargs)


def _replayssm_commit(c: Catalogue) -> Call:
    name = "gdn_replayssm_commit_k4_v8_d128"
    x, _ = c.inputs(name, num_layers=2, pool_size=4, batch_size=2, seq_len=3)
    names = ("checkpoint_state", "rawv_cache", "rawk_cache", "g_cache", "beta_cache")
    args = tuple(x[k] for k in names) + (x["state_indices"], x["accept_lens"])
    kwargs: dict = {"track_state_indices": None, "track_steps": None, "use_qk_l2norm": True}
    kwargs |= {"null_block_id": -1, "backend": "auto"}
    return Call(name, args, kwargs)


def _fused_decode(c: Catalogue) -> Call:
    name = "gdn_fused_decode_h2048_v16_d128"
    x, axes = c.inputs(name, batch_size=2, num_pages=4)
    names = ("hidden_states", "w_ba", "mixed_qkv", "conv_weight", "conv_bias", "conv_state")
    names += ("A_log", "dt_bias", "scale", "ssm_state", "state_indices")
    args = tuple(x[k] for k in names)
    return Call(name, args, {"use_qk_l2norm": True, "out": c.buffer(name, "output", axes)})


def _gdn2_prefill(c: Catalogue) -> Call:
    name = "gdn2_prefill_qk4_v8_d128"
    x, axes = c.inputs(name, total_seq_len=5, num_seqs=2, len_cu_seqlens=3)
    args = tuple(x[k] for k in ("q", "k", "v", "g", "beta", "w", "scale", "initial_state"))
    kwargs: dict = {"output_final_state": True, "cu_seqlens": x["cu_seqlens"]}
    kwargs |= {"use_qk_l2norm_in_kernel": False, "output": c.buffer(name, "output", axes)}
    kwargs |= {"output_state": c.buffer(name, "final_state", axes), "backend": "cudnn"}
    return Call(name, args, kwargs)


def _gdp_prefill(c: Catalogue) -> Call:
    name = "gdp_prefill_n2_qk4_v8_d128"
    x, axes = c.inputs(name, total_seq_len=5, num_seqs=2, len_cu_seqlens=3, expanded_seq_len=10)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], 2, x["scale"], x["initial_state"], True)
    kwargs: dict = {"cu_seqlens": x["cu_seqlens"], "use_qk_l2norm_in_kernel": False}
    kwargs |= {"output": c.buffer(name, "output", axes)}
    kwargs |= {"output_state": c.buffer(name, "final_state", axes), "backend": "cudnn"}
    return Call(name, args, kwargs)


def _kda(module: str) -> Callable[[Catalogue], Call]:
    def build(c: Catalogue) -> Call:
        name = f"{'recurrent_kda_decode' if module == 'kda_decode' else 'recurrent_kda'}_q4_v4_d128"
        x, axes = c.inputs(name, batch_size=2)
        args = tuple(x[k] for k in ("q", "k", "v", "g", "beta"))
        kwargs: dict = {"A_log": None, "dt_bias": None, "scale": x["scale"]}
        kwargs |= {"initial_state": x["state"], "output_final_state": True}
        kwargs |= {"use_qk_l2norm_in_kernel": True, "use_gate_in_kernel": False}
        kwargs |= {"lower_bound": None, "cu_seqlens": None, "ssm_state_indices": None}
        kwargs |= {"num_spec_tokens": None, "num_accepted_tokens": None}
        kwargs |= {"output": c.buffer(name, "output", axes), "initial_state_source": None}
        kwargs |= {"initial_state_indices": None, "beta_is_logit": False}
        if module == "kda":
            kwargs |= {"seq_order": None, "prefill_workspace": None}
            kwargs |= {"state_checkpoints": None, "checkpoint_cu_starts": None}
            kwargs |= {"checkpoint_every_n_tokens": 0, "checkpoint_state_indices": None}
        kwargs |= {"disable_state_update": False, "correction_cache": None, "kg_cache": None}
        kwargs |= {"backend": "cake" if module == "kda" else "cute-dsl"}
        return Call(name, args, kwargs)

    return build


def _mhc_post(c: Catalogue) -> Call:
    name = "mhc_post_hc4_h4096"
    x, _ = c.inputs(name, num_tokens=3)
    return Call(name, tuple(x[k] for k in ("x", "residual", "post_layer_mix", "comb_res_mix")))


def _mhc_pre_big_fuse(c: Catalogue) -> Call:
    name = "mhc_pre_big_fuse_hc4_h4096_mix24"
    x, _ = c.inputs(name, num_tokens=3)
    names = ("dot_mix", "sqrsum", "residual", "mhc_scale", "mhc_base", "k")
    args = tuple(x[k] for k in names)
    kwargs: dict = {"rms_eps": x["rms_eps"], "mhc_pre_eps": x["mhc_pre_eps"]}
    kwargs |= {"mhc_sinkhorn_eps": x["mhc_sinkhorn_eps"]}
    kwargs |= {"mhc_post_mult_value": x["mhc_post_mult_value"]}
    kwargs |= {"sinkhorn_repeat": x["sinkhorn_repeat"], "num_splits": 1, "block_size": 128}
    return Call(name, args, kwargs)


def _mhc_pre_big_fuse_with_prenorm(c: Catalogue) -> Call:
    name = "mhc_pre_big_fuse_with_prenorm_hc4_h4096_mix24"
    x, _ = c.inputs(name, num_tokens=3)
    args = (x["dot_mix"], x["residual"], x["mhc_scale"], x["mhc_base"])
    kwargs: dict = {"rms_eps": x["rms_eps"], "mhc_pre_eps": x["mhc_pre_eps"]}
    kwargs |= {"mhc_sinkhorn_eps": x["mhc_sinkhorn_eps"]}
    kwargs |= {"mhc_post_mult_value": x["mhc_post_mult_value"]}
    kwargs |= {"sinkhorn_repeat": x["sinkhorn_repeat"], "block_size": 256}
    return Call(name, args, kwargs)


def _packed_kda(c: Catalogue) -> Call:
    name = "packed_kda_decode_h12_d128"
    x, axes = c.inputs(name, batch_size=2, pool_size=4)
    names = ("mixed_qkv", "raw_gate", "raw_beta", "A_log", "dt_bias", "state", "state_indices")
    return Call(name, tuple(x[k] for k in names), {"output": c.buffer(name, "output", axes)})


def _sd_layout(conv_state: torch.Tensor) -> torch.Tensor:
    """The same [slots, C, 3] values in FlashInfer's SD layout: [slots, 3, C] in memory."""
    return conv_state.transpose(1, 2).contiguous().transpose(1, 2)


def _fused_kda(c: Catalogue) -> Call:
    name = "fused_kda_decode_h8_d128"
    x, axes = c.inputs(name, num_rows=3, num_slots=5)
    x["conv_state"] = _sd_layout(x["conv_state"])
    names = ("x", "weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias")
    names += ("state_indices", "state", "output_gate", "norm_weight")
    args = tuple(x[k] for k in names) + (None, 1e-6, c.buffer(name, "output", axes))
    return Call(name, args, {"backend": "auto", "state_indices_mode": "unique_or_null"})


def _ssd_combined(c: Catalogue) -> Call:
    name = "mamba_ssd_combined_h64_d64_s128_ng4"
    x, _ = c.inputs(name, batch_size=2, seqlen=5)
    args = tuple(x[k] for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias"))
    kwargs: dict = {"dt_softplus": True, "dt_limit": (0.001, 10.0)}
    kwargs |= {"initial_states": x["initial_states"], "seq_idx": None, "chunk_indices": None}
    kwargs |= {"chunk_offsets": None, "seq_chunk_cumsum": None}
    kwargs |= {"update_seq_chunk_cumsum": False, "checkpoint_token_indices": None}
    kwargs |= {"checkpoint_state_slots": None, "checkpoint_states": None, "out": None}
    kwargs |= {"return_final_states": True, "num_seqs": None}
    return Call(name, args, kwargs)


def _packed_fused_kda(c: Catalogue) -> Call:
    name = "packed_fused_kda_decode_t1_h8_d128"
    x, axes = c.inputs(name, num_rows=3, num_slots=5)
    x["conv_state"] = _sd_layout(x["conv_state"])
    names = ("x", "weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias")
    args = tuple(x[k] for k in names)
    # Three sequences of one token each, in the slots the rows were made with.
    slots = x["state_indices"][:, None].contiguous()
    args += (slots, x["state"], x["output_gate"], x["norm_weight"], None, 1e-6)
    kwargs: dict = {"output": c.buffer(name, "output", axes)}
    kwargs |= {"query_start_loc": torch.arange(4, dtype=torch.int32)}
    kwargs |= {"num_accepted_tokens": torch.ones(3, dtype=torch.int32), "t1_state_indices": None}
    return Call(name, args, kwargs)


ROUTABLE: dict[str, Callable[[Catalogue], Call]] = {
    "flashinfer.gdn_prefill.chunk_gated_delta_rule": _chunk_prefill,
    "flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose": _decode_pool,
    "flashinfer.gdn_decode.gated_delta_rule_replayssm_commit": _replayssm_commit,
    "flashinfer.gdn_kernels.experimental.gdn_fused_decode.gdn_fused_decode_step": _fused_decode,
    "flashinfer.gdn2_prefill.chunk_gated_delta_rule2": _gdn2_prefill,
    "flashinfer.gdp_prefill.chunk_gated_delta_product": _gdp_prefill,
    "flashinfer.kda.recurrent_kda": _kda("kda"),
    "flashinfer.kda_decode.recurrent_kda": _kda("kda_decode"),
    "flashinfer.kda_decode.packed_kda_decode": _packed_kda,
    "flashinfer.kda_decode.fused_kda_decode": _fused_kda,
    "flashinfer.kda_decode.packed_fused_kda_decode": _packed_fused_kda,
    "flashinfer.mhc.mhc_post": _mhc_post,
    "flashinfer.mamba.ssd_combined.ssd_combined_fwd": _ssd_combined,
    "flashinfer.mhc.mhc_pre_big_fuse": _mhc_pre_big_fuse,
    "flashinfer.mhc.mhc_pre_big_fuse_with_prenorm": _mhc_pre_big_fuse_with_prenorm,
}
