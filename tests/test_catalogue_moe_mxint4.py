"""TensorRT-LLM's MXINT4 MoE family (moe_trtllm_mxint4.fidef) against the real FlashInfer.

Its kernel needs an SM100 GPU, so FlashInfer's function is never run here: the real function
is replaced by a recorder with its signature (``test_catalogue_moe.py``), and the reference is
held, through a routed call, to the MoE of the weights FlashInfer's own
``prepare_trtllm_mxint4_weights`` quantizes and lays out (its 128 x 4 scale swizzle, a CUDA
kernel, done here as a reshape held to ``test_catalogue_gemm._swizzled_128x4``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _shared import require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _routable_moe_alpha as calls
from test_catalogue_gemm import (
    _catalogue,
    _hit,
    _off,  # noqa: F401  (the autouse fixture that turns apply off)
    _reference,
    _refused,
    _route,
    _swizzled_128x4,
)

pytestmark = pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning")

MXINT4 = "flashinfer.fused_moe.trtllm_mxint4_block_scale_moe"


def test_mxint4_is_routed_and_returns_flashinfers_list(monkeypatch):
    call = calls.trtllm_mxint4_block_scale_moe(_catalogue())
    outcome = _route(monkeypatch, MXINT4, call.name, call.args, call.kwargs)
    seen = _hit(outcome)
    assert isinstance(outcome.result, list) and len(outcome.result) == 1
    assert seen["gemm1_weights"].dtype == torch.int8
    assert torch.equal(outcome.result[0], _reference(call.name)(**seen))


@pytest.mark.parametrize(
    "key, value, rule",
    [
        ("routing_method_type", 1, None),  # renormalize: no family of this API
        ("valid_hidden_size", 192, "valid_hidden_size"),
        ("do_finalize", False, "do_finalize"),
    ],
)
def test_mxint4_unmodelled_values_fall_back(monkeypatch, key, value, rule):
    call = calls.trtllm_mxint4_block_scale_moe(_catalogue())
    outcome = _route(monkeypatch, MXINT4, call.name, call.args, call.kwargs | {key: value})
    if rule is None:
        assert outcome.counts["hit"] == 0 and not outcome.seen, outcome.counts
        assert outcome.result == "flashinfer"
    else:
        _refused(outcome, rule)


def _deepseek(logits, bias, top_k, n_group, topk_group, scale):
    scores = logits.float().sigmoid()
    biased = scores + bias.float()
    T, E = scores.shape
    groups = biased.view(T, n_group, -1).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(groups).scatter_(1, groups.topk(topk_group, -1).indices, 1.0)
    biased = biased.masked_fill(keep.repeat_interleave(E // n_group, 1) == 0, -float("inf"))
    ids = biased.topk(top_k, -1).indices
    w = scores.gather(1, ids)
    return ids, w / w.sum(-1, keepdim=True) * scale


def test_mxint4_reference_is_the_moe_of_flashinfers_prepared_weights(monkeypatch):
    from flashinfer.fused_moe import prepare
    from flashinfer.quantization import fp4_quantization

    def interleave(sf):  # block_scale_interleave: the flat 128 x 4 swizzled buffer
        rows, cols = sf.shape
        return sf.reshape(rows // 128, 4, 32, cols // 4, 4).permute(0, 3, 2, 1, 4).flatten()

    probe = torch.arange(256 * 8, dtype=torch.float32).reshape(256, 8)
    assert torch.equal(interleave(probe), _swizzled_128x4(probe).flatten())

    monkeypatch.setattr(fp4_quantization, "block_scale_interleave", interleave)
    E, local, H, I, T = 16, 8, 256, 256, 5
    g = torch.Generator().manual_seed(0)
    w1 = (torch.randn(local, 2 * I, H, generator=g) * 0.05).bfloat16()
    w2 = (torch.randn(local, H, I, generator=g) * 0.05).bfloat16()
    view = prepare.prepare_trtllm_mxint4_weights(
        w1, w2, num_local_experts=local, hidden_size=H, intermediate_size=I
    )
    logits = torch.randn(T, E, generator=g).bfloat16()
    bias = (torch.randn(E, generator=g) * 0.1).bfloat16()
    x = torch.randn(T, H, generator=g).bfloat16()
    args = (logits, bias, x, view["gemm1_weights"], view["gemm1_weights_scale"], None, None)
    args += (None, view["gemm2_weights"], view["gemm2_weights_scale"], E, 4, 4, 2, I, 8, local)
    args += (2.5,)
    # prepare's layout as it stacks it: blocks of 128 bytes along K, flat swizzled scales.
    assert view["gemm1_weights"].shape == (local, H // 256, 2 * I, 128)
    assert view["gemm1_weights_scale"].shape == (local, 2 * I * H // 32)
    outcome = _route(monkeypatch, MXINT4, calls.MXINT4_DS, args, {"routing_method_type": 2})
    _hit(outcome)
    (got,) = outcome.result

    # The dense MoE of the weights as _mxint4_quantize rounds them, [up | gate] rows.
    def dequant(w):
        q, s = prepare._mxint4_quantize(w)
        b = q.long()
        v = torch.stack([b & 15, b >> 4], -1).flatten(-2)
        v = torch.where(v >= 8, v - 16, v).float()
        return v * s.float().reshape(*w.shape[:-1], -1).repeat_interleave(32, -1)

    W1, W2 = dequant(w1), dequant(w2)
    ids, weights = _deepseek(logits, bias, 4, 4, 2, 2.5)
    expected = torch.zeros(T, H)
    for t in range(T):
        for k in range(4):
            e = int(ids[t, k]) - 8
            if 0 <= e < local:
                up, gate = (W1[e] @ x[t].float()).chunk(2)
                act = (F.silu(gate) * up).bfloat16().float()
                expected[t] += weights[t, k] * (W2[e] @ act)
    assert expected.abs().max() > 0.05  # this rank's experts are hit
    torch.testing.assert_close(got.float(), expected, atol=2e-3, rtol=2e-2)


def test_mxint4_without_routing_bias_is_routed_as_a_zero_bias(monkeypatch):
    # FlashInfer reads routing_bias None as no bias (as for the FP8 block-scale MoE): the
    # definition is handed zeros, and the result is the call's with a zero bias.
    call = calls.trtllm_mxint4_block_scale_moe(_catalogue())
    args = list(call.args)
    num_experts = args[10]
    args[1] = None
    outcome = _route(monkeypatch, MXINT4, call.name, tuple(args), call.kwargs)
    seen = _hit(outcome)
    bias = seen["routing_bias"]
    assert bias.shape == (num_experts,) and bias.dtype == torch.bfloat16
    assert not bias.any()
    args[1] = torch.zeros(num_experts, dtype=torch.bfloat16)
    with_zeros = _route(monkeypatch, MXINT4, call.name, tuple(args), call.kwargs)
    _hit(with_zeros)
    assert torch.equal(outcome.result[0], with_zeros.result[0])


def test_mxint4_without_groups_needs_a_routing_bias(monkeypatch):
    # With n_group 1 (Kimi K2) FlashInfer routes through its generic kernel, which reads
    # routing_bias whether given or not (Note [DeepSeek routing without groups] in
    # moe.fidef): a call without one falls back by the rule on routing_bias and n_group.
    # The weights are zero-stride views of Kimi K2's shapes: the rules read shapes and
    # dtypes, not values.
    E, H, I, T = 384, 7168, 2048, 2
    name = "trtllm_mxint4_block_scale_moe_ds_routing_topk8_ng1_kg1_e384_h7168_i2048"
    assert name in _catalogue().defs

    def zeros(dtype, *shape):
        return torch.zeros(1, dtype=dtype).expand(*shape)

    args = (torch.randn(T, E), None, torch.randn(T, H).bfloat16())
    args += (zeros(torch.uint8, E, 2 * I, H // 2), zeros(torch.bfloat16, E, 2 * I, H // 32))
    args += (None, None, None)
    args += (zeros(torch.uint8, E, H, I // 2), zeros(torch.bfloat16, E, H, I // 32))
    args += (E, 8, 1, 1, I, 0, E, 2.5)
    kwargs = {"routing_method_type": 2, "do_finalize": True, "enable_pdl": False}
    _refused(_route(monkeypatch, MXINT4, name, args, kwargs), "routing_bias,n_group")
