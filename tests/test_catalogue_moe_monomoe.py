"""The single-kernel block-FP8 MoE family (moe_monomoe.fidef) against the real FlashInfer.

As in ``test_catalogue_moe_cute_dsl.py``: the real function is replaced by a recorder with its
signature before apply is enabled; a call is routed where the definition models it, and the
reference is held to FlashInfer's own weight repacking and its template's routing and expert
math.
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

MONO = "flashinfer.fused_moe.mono_moe"
REQUIRED = ["activations_in", "router_logits", "expert_weights_up", "expert_scales_up"]
REQUIRED += ["expert_weights_down", "expert_scales_down", "top_k"]


def test_mono_moe_with_flashinfers_defaults_is_routed(monkeypatch):
    call = calls.mono_moe(_catalogue())
    bound = _bound(call, MONO)
    out = _route(monkeypatch, MONO, call.name, (), {k: bound[k] for k in REQUIRED})
    seen = _hit(out)
    assert (seen["sigmoid_scoring"], seen["renormalize"]) == (0, 1)
    assert seen["expert_weights_up"] is bound["expert_weights_up"]
    assert torch.equal(out.result, _reference(call.name)(**seen))
    assert out.result.abs().sum() > 0


def test_mono_moe_reads_pre_interleaved_weights_back_in_gate_up_order(monkeypatch):
    from flashinfer.fused_moe.monomoe import interleave_for_tma_wgmma_up

    call = calls.mono_moe(_catalogue())
    bound = _bound(call, MONO)
    canonical = bound["expert_weights_up"]
    packed = interleave_for_tma_wgmma_up(canonical.clone())
    assert not torch.equal(packed.view(torch.uint8), canonical.view(torch.uint8))
    kwargs = bound | {"expert_weights_up": packed, "interleave_up": False}
    seen = _hit(_route(monkeypatch, MONO, call.name, (), kwargs))
    assert torch.equal(seen["expert_weights_up"].view(torch.uint8), canonical.view(torch.uint8))


@pytest.mark.parametrize(("scoring", "renormalize"), [("sigmoid", True), ("sigmoid", False)])
def test_mono_moe_scoring_options_reach_the_solution(monkeypatch, scoring, renormalize):
    call = calls.mono_moe(_catalogue())
    kwargs = _bound(call, MONO) | {"scoring_func": scoring, "renormalize": renormalize}
    seen = _hit(_route(monkeypatch, MONO, call.name, (), kwargs))
    assert (seen["sigmoid_scoring"], seen["renormalize"]) == (1, int(renormalize))


def _fp8_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from flashinfer.trace.templates._init_helpers import fp8_block_quant_2d

    return fp8_block_quant_2d(w.to(torch.bfloat16), block=128)


@pytest.mark.parametrize(("scoring", "renormalize"), [("softmax", False), ("sigmoid", True)])
def test_mono_moe_reference_is_flashinfers_template_math(scoring, renormalize):
    # Weights block-quantized by FlashInfer's own helper. The template's expert math weights
    # each expert's output after GEMM2 and keeps GEMM1's output unquantized, where the kernel
    # folds the weight in and quantizes it to E4M3 per 64 columns: a few percent apart. It
    # also takes the SiLU of the second half of the rows, where the kernel's epilogue
    # (moe_up_projection.cuh: rw * up * gate / (1 + exp(-gate))) and the docstring of
    # interleave_for_tma_wgmma_up take the first N rows as the gate: the template is given
    # the halves swapped.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 256, generator=g).to(torch.bfloat16)
    logits = torch.randn(4, 8, generator=g).to(torch.bfloat16)
    w13, s13 = _fp8_blocks(0.1 * torch.randn(8, 256, 256, generator=g))
    w2, s2 = _fp8_blocks(0.1 * torch.randn(8, 256, 128, generator=g))
    got = _reference(calls.MONO_MOE)(
        x, logits, w13, s13, w2, s2, int(scoring == "sigmoid"), int(renormalize)
    ).float()

    def template(w, s):
        out = templates._mono_moe_reference(
            x, logits, w, s, w2, s2, 2, scoring_func=scoring, renormalize=renormalize
        )
        return out.float()

    def error(e):
        return float((got - e).abs().mean() / e.abs().mean())

    swapped = torch.cat([w13[:, 128:], w13[:, :128]], dim=1)
    s_swapped = torch.cat([s13[:, 1:], s13[:, :1]], dim=1)
    assert error(template(swapped, s_swapped)) < 0.05
    assert error(template(w13, s13)) > 0.3


def test_mono_moe_routing_takes_the_lower_expert_on_a_tie():
    x, _ = _catalogue().inputs(calls.MONO_MOE, seed=2, seq_len=1)
    x["router_logits"] = torch.tensor([[0.5, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]]).bfloat16()
    ref = _reference(calls.MONO_MOE)
    got = ref(**x)
    # Experts 1 and 2 (not 3) at weight 1/2 each: the same as logits that pick them alone.
    x["router_logits"] = torch.tensor([[0.5, 1.0, 1.0, -9.0, 0.0, 0.0, 0.0, 0.0]]).bfloat16()
    assert torch.equal(got, ref(**x))
    x["router_logits"] = torch.tensor([[0.5, 1.0, -9.0, 1.0, 0.0, 0.0, 0.0, 0.0]]).bfloat16()
    assert not torch.equal(got, ref(**x))


def test_mono_moe_parameters_the_definition_does_not_model_fall_back(monkeypatch):
    call = calls.mono_moe(_catalogue())
    out = _route(monkeypatch, MONO, call.name, (), _bound(call, MONO) | {"scoring_func": "relu"})
    _refused(out, "scoring_func")
    # The definition's top_k is 2: a call for 3 experts a token is not its call.
    _refused(_route(monkeypatch, MONO, call.name, (), _bound(call, MONO) | {"top_k": 3}), "top_k")
