"""The MoE families (moe_cutlass.fidef, moe_trtllm_*.fidef) against the real FlashInfer.

FlashInfer 0.7.2.post1 is installed; its MoE kernels need a GPU, so its functions are never
run here. As in ``test_catalogue_gemm.py``, the real function is replaced by a recorder with
its signature before apply is enabled: a call with FlashInfer's defaults is routed, each
ruled parameter at a non-default value is routed or refused with its rule counted, and the
reference of the small instance agrees with the reference of FlashInfer's own trace template.
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

pytestmark = pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning")

# ---------------------------------------------------------------------------------------
# cutlass_fused_moe
# ---------------------------------------------------------------------------------------

CUTLASS = "flashinfer.fused_moe.cutlass_fused_moe"


def _cutlass_required(call) -> dict:
    bound = _bound(call, CUTLASS)
    names = ["input", "token_selected_experts", "token_final_scales"]
    names += ["fc1_expert_weights", "fc2_expert_weights", "output_dtype", "quant_scales"]
    return {k: bound[k] for k in names}


def test_cutlass_fused_moe_with_flashinfers_defaults_is_routed(monkeypatch):
    call = calls.cutlass_fused_moe(_catalogue())
    kwargs = _cutlass_required(call)
    out = _route(monkeypatch, CUTLASS, call.name, (), kwargs)
    seen = _hit(out)
    assert seen["local_expert_offset"] == 0
    # FlashInfer returns its kernel's list of results, the output first.
    assert isinstance(out.result, list) and len(out.result) == 1
    assert torch.equal(out.result[0], _reference(call.name)(**seen))


def test_cutlass_fused_moe_on_an_expert_parallel_rank_offsets_the_expert_ids(monkeypatch):
    call = calls.cutlass_fused_moe(_catalogue())
    kwargs = _cutlass_required(call)
    # Rank 2 of 4 holds global experts 16..23; ids of other ranks' experts add nothing.
    ids = kwargs["token_selected_experts"]
    kwargs["token_selected_experts"] = torch.where(ids % 2 == 0, ids + 16, ids + 8)
    out = _route(monkeypatch, CUTLASS, call.name, (), kwargs | {"ep_size": 4, "ep_rank": 2})
    seen = _hit(out)
    assert seen["local_expert_offset"] == 16
    local = torch.where(ids % 2 == 0, ids, torch.full_like(ids, -1))
    expected = templates._moe_bf16_run_experts(
        kwargs["input"],
        kwargs["fc1_expert_weights"],
        kwargs["fc2_expert_weights"],
        kwargs["token_final_scales"],
        local.long(),
        local_expert_offset=0,
        E_global=8,
    )
    _close(out.result[0], expected)


@pytest.mark.parametrize(
    ("param", "value", "rule"),
    [
        ("output_dtype", torch.float16, "output_dtype"),
        ("quant_scales", [torch.ones(1)], "quant_scales"),
        ("fc1_expert_biases", torch.zeros(8, 256), "fc1_expert_biases"),
        ("swiglu_alpha", torch.ones(8), "swiglu_alpha"),
        ("swiglu_limit", torch.ones(8), "swiglu_limit"),
        ("tp_size", 2, "tp_size"),
        ("enable_alltoall", True, "enable_alltoall"),
        ("use_deepseek_fp8_block_scale", True, "use_deepseek_fp8_block_scale"),
        ("min_latency_mode", True, "min_latency_mode"),
        ("activation_type", 6, "activation_type"),
        ("situ_beta", 1.0, "situ_beta"),
        ("backend", "cute_dsl", "backend"),
        # Note [cutlass_fused_moe output buffer] in moe_cutlass.fidef.
        ("output", torch.zeros(5, 256, dtype=torch.bfloat16), "output"),
    ],
)
def test_cutlass_fused_moe_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, param, value, rule
):
    call = calls.cutlass_fused_moe(_catalogue())
    kwargs = _bound(call, CUTLASS) | {param: value}
    out = _route(monkeypatch, CUTLASS, call.name, (), kwargs)
    _refused(out, rule)
    assert out.originals[0][param] is value


def test_cutlass_fused_moe_matches_flashinfers_template_reference():
    x, _ = _catalogue().inputs(calls.CUTLASS_MOE, seed=1, seq_len=6)
    expected = templates._cutlass_fused_moe_reference(**x)
    _close(_reference(calls.CUTLASS_MOE)(**x), expected)
