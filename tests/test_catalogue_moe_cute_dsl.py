"""The CuTe-DSL MoE families (moe_cute_dsl.fidef) against the real FlashInfer.

As in ``test_catalogue_moe.py``: FlashInfer's kernels need a GPU, so the real function is
replaced by a recorder with its signature before apply is enabled; a call is routed where the
definition models it, each parameter it does not model is refused with its rule counted, and
the reference is held to FlashInfer's own weight preparation and its template's expert math.
"""

from __future__ import annotations

import pytest
import torch
from _shared import require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _gemm_moe_calls as calls
from flashinfer.trace.templates import moe as templates
from test_catalogue_gemm import (
    _bound,
    _catalogue,
    _close,
    _hit,
    _off,  # noqa: F401  (the autouse fixture that turns apply off)
    _reference,
    _refused,
    _route,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning"),
]

# ---------------------------------------------------------------------------------------
# cute_dsl_fused_moe_bf16 (SM90)
# ---------------------------------------------------------------------------------------

BF16 = "flashinfer.fused_moe.cute_dsl_fused_moe_bf16"
FLOAT32_MAX = torch.finfo(torch.float32).max


def _required(call) -> dict:
    names = ["x", "token_selected_experts", "token_final_scales", "w1_weight", "w2_weight"]
    bound = _bound(call, BF16)
    return {k: bound[k] for k in names + ["num_experts", "top_k"]}


def _flashinfer_expected(x, ids, scales, gate_up, w2, offset, alpha, beta, limit, experts):
    """FlashInfer's template math over the [up | gate] stack of the [gate; up] weights."""
    inter = gate_up.shape[1] // 2
    up_gate = torch.cat([gate_up[:, inter:], gate_up[:, :inter]], dim=1)
    per_expert = torch.full((gate_up.shape[0],), 1.0)
    return templates._moe_bf16_run_experts(
        x,
        up_gate,
        w2,
        scales,
        ids.long(),
        local_expert_offset=offset,
        E_global=experts,
        gemm1_alpha=per_expert * alpha,
        gemm1_beta=per_expert * beta,
        gemm1_clamp_limit=per_expert * limit,
    )


def test_cute_dsl_fused_moe_bf16_with_flashinfers_defaults_is_routed(monkeypatch):
    call = calls.cute_dsl_fused_moe_bf16(_catalogue())
    out = _route(monkeypatch, BF16, call.name, (), _required(call))
    seen = _hit(out)
    # FlashInfer's defaults: plain SwiGLU, no clamp, every expert on this rank.
    assert (seen["swiglu_alpha"], seen["swiglu_beta"]) == (1.0, 0.0)
    assert seen["swiglu_limit"] == FLOAT32_MAX and seen["local_expert_offset"] == 0
    assert torch.equal(out.result, _reference(call.name)(**seen))
    assert out.result.abs().sum() > 0


def test_cute_dsl_fused_moe_bf16_reference_undoes_flashinfers_up_gate_interleave():
    from flashinfer.fused_moe.cute_dsl.sm90_contiguous_gather_grouped_gemm_act_fusion import (
        interleave_up_gate_sm90,
    )

    x, _ = _catalogue().inputs(calls.CUTE_DSL_BF16, seed=3, seq_len=6)
    gate_up = x["w1_weight"]  # read as the conventional [gate; up] stack
    x["w1_weight"] = interleave_up_gate_sm90(gate_up)
    got = _reference(calls.CUTE_DSL_BF16)(**x)
    scalars = [float(x[k]) for k in ("swiglu_alpha", "swiglu_beta", "swiglu_limit")]
    assert scalars == pytest.approx([1.702, 1.0, 7.0])  # gpt-oss's SwiGLU, clamp included
    args = (x["x"], x["token_selected_experts"], x["token_final_scales"], gate_up)
    expected = _flashinfer_expected(*args, x["w2_weight"], 0, *scalars, 8)
    _close(got, expected)


def test_cute_dsl_fused_moe_bf16_on_an_expert_parallel_rank_offsets_the_expert_ids(monkeypatch):
    call = calls.cute_dsl_fused_moe_bf16(_catalogue())
    kwargs = _bound(call, BF16)
    # Rank 2 of 4 holds global experts 16..23; ids of other ranks' experts add nothing.
    ids = kwargs["token_selected_experts"]
    kwargs["token_selected_experts"] = torch.where(ids % 2 == 0, ids + 16, ids + 8)
    kwargs |= {"num_experts": 32, "local_expert_offset": 16}
    out = _route(monkeypatch, BF16, call.name, (), kwargs)
    seen = _hit(out)
    assert seen["local_expert_offset"] == 16
    local = torch.where(ids % 2 == 0, ids, torch.full_like(ids, -1))
    expected = _reference(call.name)(
        **seen | {"token_selected_experts": local, "local_expert_offset": 0}
    )
    assert torch.equal(out.result, expected)
    assert out.result is kwargs["moe_output"]  # written into the caller's buffer


@pytest.mark.parametrize(
    ("param", "value", "rule"),
    [
        ("activation_type", 8, "activation_type"),  # GegluTanh
        ("activation_type", 6, "activation_type"),  # Relu2
        ("situ_beta", 4.0, "situ_beta"),
        ("situ_linear_beta", 25.0, "situ_linear_beta"),
    ],
)
def test_cute_dsl_fused_moe_bf16_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, param, value, rule
):
    call = calls.cute_dsl_fused_moe_bf16(_catalogue())
    kwargs = _bound(call, BF16) | {param: value}
    out = _route(monkeypatch, BF16, call.name, (), kwargs)
    _refused(out, rule)
    assert out.originals[0][param] == value


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("use_fused_finalize", True),
        ("enable_pdl", True),
        ("tactic", (128, None, None)),
        ("intermediate_buffer", torch.empty(16, dtype=torch.bfloat16)),
        ("num_local_experts", None),
    ],
)
def test_cute_dsl_fused_moe_bf16_launch_options_stay_routed(monkeypatch, param, value):
    call = calls.cute_dsl_fused_moe_bf16(_catalogue())
    out = _route(monkeypatch, BF16, call.name, (), _bound(call, BF16) | {param: value})
    _hit(out)


def test_cute_dsl_fused_moe_bf16_with_another_ranks_expert_count_is_not_routed(monkeypatch):
    call = calls.cute_dsl_fused_moe_bf16(_catalogue())
    out = _route(monkeypatch, BF16, call.name, (), _bound(call, BF16) | {"num_local_experts": 4})
    assert out.counts["hit"] == 0 and not out.seen, out.counts
    assert out.result == "flashinfer" and len(out.originals) == 1
