"""The Prims-TS MoE families (moe_prims_ts.fidef) against the real FlashInfer.

Prims-TS takes the arguments and the prepared weights of the trtllm-gen MoE APIs, so its
families repeat those of moe_trtllm_*.fidef: the first test holds each twin to its original
(everything but the name, the API and the description), so that the two cannot drift apart.
Then, as in ``test_catalogue_moe.py``, calls through the real API with a recorder in place of
FlashInfer's function: routed where the definition models the call, refused with the rule
counted where Prims-TS takes (or refuses) what the definition does not model.
"""

from __future__ import annotations

import pytest
import torch
from _shared import require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _gemm_moe_calls as calls
from test_catalogue_gemm import (
    _bound,
    _catalogue,
    _hit,
    _off,  # noqa: F401  (the autouse fixture that turns apply off)
    _reference,
    _refused,
    _route,
)
from test_catalogue_moe import _packed

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning"),
]

BF16 = "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_moe"
BF16_ROUTED = "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_routed_moe"

TWINS = {
    "prims_ts_bf16_moe_renorm": "trtllm_bf16_moe_renorm",
    "prims_ts_bf16_moe_llama4": "trtllm_bf16_moe_llama4",
    "prims_ts_bf16_routed_moe": "trtllm_bf16_routed_moe",
}


# The one rule a twin states otherwise: Prims-TS BF16 refuses DeepSeek-V3 and sigmoid
# routing even when the routing is given (prims_ts/moe/support.py); trtllm-gen does not.
TWIN_RULES = {
    "prims_ts_bf16_routed_moe": (
        "routing_method_type not in (2, 8) and (routing_method_type != 3 or top_k == 1)",
        "routing_method_type != 3 or top_k == 1",
    )
}


def _contract(value):
    """An IR node as plain data without source positions."""
    if isinstance(value, dict):
        return {k: _contract(v) for k, v in value.items() if not k.endswith(("span", "spans"))}
    if isinstance(value, (list, tuple)):
        return [_contract(v) for v in value]
    return value


@pytest.mark.parametrize(("twin", "original"), sorted(TWINS.items()))
def test_a_prims_ts_family_is_its_trtllm_family_with_another_api(twin, original):
    families = _catalogue().families
    a, b = families[twin].model_dump(), families[original].model_dump()
    for key in ("name", "name_template", "api", "description"):
        a.pop(key), b.pop(key)
    if twin in TWIN_RULES:
        ours, theirs = TWIN_RULES[twin]
        texts = [r.get("expr", {}).get("text") for r in a["rules"]]
        assert texts.count(ours) == 1
        a["rules"][texts.index(ours)]["expr"]["text"] = theirs
    assert _contract(a) == _contract(b)
    # The same parameters, in the same order, but for the defaults Prims-TS changes.
    params = [(p.name, p.kind) for p in families[twin].api.params]
    assert params == [(p.name, p.kind) for p in families[original].api.params]
    # Each instance of the original has its twin, of the same values.
    defs = _catalogue().defs.values()
    twins = sorted(d.consts for d in defs if d.family == twin)
    assert twins == sorted(d.consts for d in defs if d.family == original)


def test_prims_ts_bf16_moe_in_block_major_k_layout_is_routed(monkeypatch):
    call = calls.prims_ts_bf16_moe(_catalogue())
    out = _route(monkeypatch, BF16, call.name, (), _bound(call, BF16))
    seen = _hit(out)
    assert torch.equal(out.result, _reference(call.name)(**seen))
    assert out.result.abs().sum() > 0


@pytest.mark.parametrize(
    ("method", "name"),
    [
        (1, "prims_ts_bf16_moe_renorm_topk2_e8_h256_i128"),
        (4, "prims_ts_bf16_moe_renorm_topk2_e8_h256_i128"),
        (3, "prims_ts_bf16_moe_llama4_topk1_e8_h256_i128"),
    ],
)
def test_prims_ts_bf16_moe_routing_methods_reach_their_families(monkeypatch, method, name):
    c = _catalogue()
    x, _ = c.inputs(name, seq_len=4)
    top_k = dict(c.defs[name].param_values)["top_k"]
    args = (x["routing_logits"].bfloat16(), None, x["hidden_states"])
    args += (x["gemm1_weights"], x["gemm2_weights"], 8, top_k, None, None, 128, 0, 8)
    kwargs = {"routing_method_type": method, "weight_layout": 2}
    out = _route(monkeypatch, BF16, name, args, kwargs)
    seen = _hit(out)
    assert torch.equal(out.result, _reference(name)(**seen))


def test_prims_ts_bf16_moe_in_its_default_major_k_layout_falls_back(monkeypatch):
    # Prims-TS's default weight_layout is MajorK, which these definitions do not model.
    call = calls.prims_ts_bf16_moe(_catalogue())
    kwargs = _bound(call, BF16)
    del kwargs["weight_layout"]
    out = _route(monkeypatch, BF16, call.name, (), kwargs)
    _refused(out, "weight_layout")


def test_prims_ts_bf16_moe_deepseek_routing_is_not_routed(monkeypatch):
    # Prims-TS refuses DeepSeek-V3 routing for BF16; no family stands for it.
    call = calls.prims_ts_bf16_moe(_catalogue())
    out = _route(monkeypatch, BF16, call.name, (), _bound(call, BF16) | {"routing_method_type": 2})
    assert out.counts["hit"] == 0 and not out.seen, out.counts
    assert out.result == "flashinfer" and len(out.originals) == 1


@pytest.mark.parametrize(
    ("path", "build", "param", "value"),
    [
        (BF16, calls.prims_ts_bf16_moe, "use_shuffled_weight", False),
        (BF16, calls.prims_ts_bf16_moe, "do_finalize", False),
        (BF16, calls.prims_ts_bf16_moe, "activation_type", 6),
        (BF16, calls.prims_ts_bf16_moe, "gemm1_alpha", torch.ones(8)),
        (BF16, calls.prims_ts_bf16_moe, "routing_bias", torch.zeros(8)),
        (BF16_ROUTED, calls.prims_ts_bf16_routed_moe, "weight_layout", 0),
        (BF16_ROUTED, calls.prims_ts_bf16_routed_moe, "routed_scaling_factor", 2.5),
        (BF16_ROUTED, calls.prims_ts_bf16_routed_moe, "gemm1_lora_delta", torch.zeros(1)),
    ],
)
def test_prims_ts_bf16_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, path, build, param, value
):
    call = build(_catalogue())
    out = _route(monkeypatch, path, call.name, (), _bound(call, path) | {param: value})
    _refused(out, param)
    assert out.originals[0][param] is value


def test_prims_ts_bf16_routed_moe_is_routed_and_undoes_flashinfers_weight_preparation(
    monkeypatch,
):
    import torch.nn.functional as F
    from flashinfer.fused_moe.prepare import prepare_trtllm_bf16_weights

    torch.manual_seed(0)
    e, h, i, t = 8, 256, 128, 6
    w1 = (torch.randn(e, 2 * i, h) / h**0.5).bfloat16()
    w2 = (torch.randn(e, h, i) / i**0.5).bfloat16()
    x = torch.randn(t, h).bfloat16()
    prepared = prepare_trtllm_bf16_weights(
        w1, w2, num_local_experts=e, hidden_size=h, intermediate_size=i
    )
    ids = torch.stack([torch.randperm(e)[:2] for _ in range(t)])
    weights = torch.rand(t, 2)
    args = (_packed(ids, weights), x, prepared["gemm1_weights"], prepared["gemm2_weights"])
    args += (e, 2, None, None, i, 0, e)
    out = _route(monkeypatch, BF16_ROUTED, calls.PT_BF16_ROUTED, args, {"weight_layout": 2})
    _hit(out)
    expected = torch.zeros(t, h)
    wb = weights.bfloat16().float()
    for tok in range(t):
        for k in range(2):
            up, gate = (x[tok].float() @ w1[ids[tok, k]].float().T).chunk(2)
            expected[tok] += wb[tok, k] * ((F.silu(gate) * up) @ w2[ids[tok, k]].float().T)
    torch.testing.assert_close(out.result.float(), expected, atol=2e-2, rtol=1e-2)


# The MXFP4 x BF16 families: the trtllm-gen contract with Prims-TS's own parameter list.
# The rules that name a parameter only one API has, or that Prims-TS needs otherwise (its
# output scales, required there and None in trtllm-gen), are left out of the comparison.
FP4 = "flashinfer.fused_moe.backends.prims_ts.fp4_op.prims_ts_fp4_block_scale_moe"
FP4_ROUTED = "flashinfer.fused_moe.backends.prims_ts.fp4_op.prims_ts_fp4_block_scale_routed_moe"
FP8_PER_TENSOR = "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_per_tensor_scale_moe"

FP4_TWINS = {
    "prims_ts_fp4_block_scale_moe_renorm": "moe_fp4_block_scale_renormalize_routing",
    "prims_ts_fp4_block_scale_moe_llama4": "moe_fp4_block_scale_llama4_routing",
    "prims_ts_fp4_block_scale_routed_moe": "trtllm_fp4_block_scale_routed_moe_mxfp4",
}
ONLY_TRTLLM = {"valid_hidden_size", "valid_intermediate_size", "hidden_states_scale_layout"}
ONLY_TRTLLM |= {"gemm1_lora_delta", "num_fused_shared_experts"}
ONLY_PRIMS_TS = {"weight_layout", "routing_input_mode", "topk_ids", "topk_weights"}
SCALES = ("output1_scale_scalar", "output1_scale_gate_scalar", "output2_scale_scalar")
# What a rule may name to be left out: those parameters, and Prims-TS's routing inputs other
# than topk_ids (which its routed API takes as trtllm-gen's does).
NOT_SHARED = ONLY_TRTLLM | {"weight_layout", "routing_input_mode", "topk_weights"}
NOT_SHARED |= {"topk_ids is None", *SCALES}


def _shared_rules(family) -> list:
    rules = [_contract(r) for r in family.model_dump()["rules"]]
    return [r for r in rules if not any(n in str(r) for n in NOT_SHARED)]


@pytest.mark.parametrize(("twin", "original"), sorted(FP4_TWINS.items()))
def test_a_prims_ts_fp4_family_is_its_trtllm_family_but_for_the_parameters_it_takes(twin, original):
    families = _catalogue().families
    a, b = families[twin].model_dump(), families[original].model_dump()
    for key in ("name", "name_template", "api", "description", "rules", "instances"):
        a.pop(key), b.pop(key)
    assert _contract(a) == _contract(b)
    assert _shared_rules(families[twin]) == _shared_rules(families[original])
    mine = {p.name for p in families[twin].api.params}
    theirs = {p.name for p in families[original].api.params}
    assert mine - theirs <= ONLY_PRIMS_TS and theirs - mine <= ONLY_TRTLLM
    # Its instances are some of the original's (the costliest CPU shapes are tested there).
    defs = _catalogue().defs.values()
    twins = {d.consts for d in defs if d.family == twin}
    originals = {d.consts for d in defs if d.family == original}
    assert twins <= originals and len(twins) >= 2


@pytest.mark.parametrize(
    ("path", "build"),
    [
        (FP4, calls.prims_ts_fp4_block_scale_moe),
        (FP4_ROUTED, calls.prims_ts_fp4_block_scale_routed_moe),
    ],
)
def test_prims_ts_fp4_calls_with_unit_output_scales_are_routed(monkeypatch, path, build):
    call = build(_catalogue())
    out = _route(monkeypatch, path, call.name, (), _bound(call, path))
    seen = _hit(out)
    # FlashInfer returns its kernel's list of results.
    assert isinstance(out.result, list) and len(out.result) == 1
    assert torch.equal(out.result[0], _reference(call.name)(**seen))
    assert out.result[0].abs().sum() > 0


@pytest.mark.parametrize(
    ("path", "build", "param", "value"),
    [
        # Scales other than ones scale the GEMMs, which the definitions do not model.
        (FP4, calls.prims_ts_fp4_block_scale_moe, "output1_scale_scalar", torch.full((8,), 2.0)),
        (FP4, calls.prims_ts_fp4_block_scale_moe, "output2_scale_scalar", None),
        (FP4, calls.prims_ts_fp4_block_scale_moe, "weight_layout", 2),
        (FP4, calls.prims_ts_fp4_block_scale_moe, "routing_input_mode", 1),
        (FP4_ROUTED, calls.prims_ts_fp4_block_scale_routed_moe, "weight_layout", 2),
        (
            FP4_ROUTED,
            calls.prims_ts_fp4_block_scale_routed_moe,
            "output1_scale_gate_scalar",
            torch.full((8,), 0.5),
        ),
    ],
)
def test_prims_ts_fp4_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, path, build, param, value
):
    call = build(_catalogue())
    out = _route(monkeypatch, path, call.name, (), _bound(call, path) | {param: value})
    rules = out.counts["rules"]
    assert out.counts["hit"] == 0 and len(rules) == 1 and param in next(iter(rules)), rules
    assert out.result == "flashinfer" and out.originals[0][param] is value


def test_prims_ts_fp8_per_tensor_moe_is_routed(monkeypatch):
    call = calls.prims_ts_fp8_per_tensor_scale_moe(_catalogue())
    out = _route(monkeypatch, FP8_PER_TENSOR, call.name, (), _bound(call, FP8_PER_TENSOR))
    seen = _hit(out)
    assert torch.equal(out.result, _reference(call.name)(**seen))
    assert out.result.abs().sum() > 0


def test_prims_ts_fp8_per_tensor_llama4_routing_reaches_its_family(monkeypatch):
    name = "prims_ts_fp8_per_tensor_scale_moe_llama4_topk1_e8_h256_i128"
    x, _ = _catalogue().inputs(name, seq_len=4)
    args = (x["routing_logits"], None, x["hidden_states"], x["gemm1_weights"])
    args += (x["output1_scales_scalar"], x["output1_scales_gate_scalar"])
    args += (x["gemm2_weights"], x["output2_scales_scalar"], 8, 1, None, None, 128, 0, 8)
    args += (None, True)
    out = _route(monkeypatch, FP8_PER_TENSOR, name, args, {"routing_method_type": 3})
    seen = _hit(out)
    assert torch.equal(out.result, _reference(name)(**seen))


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("weight_layout", 2),
        ("fc1_per_channel_weight_scale", torch.ones(8, 256)),
        ("gemm1_clamp_limit", torch.ones(8)),
        ("use_routing_scales_on_input", True),
    ],
)
def test_prims_ts_fp8_per_tensor_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, param, value
):
    call = calls.prims_ts_fp8_per_tensor_scale_moe(_catalogue())
    kwargs = _bound(call, FP8_PER_TENSOR) | {param: value}
    out = _route(monkeypatch, FP8_PER_TENSOR, call.name, (), kwargs)
    _refused(out, param)
    assert out.originals[0][param] is value


def test_prims_ts_fp8_per_tensor_moe_undoes_flashinfers_weight_preparation(monkeypatch):
    import torch.nn.functional as F
    from flashinfer.fused_moe.prepare import prepare_trtllm_fp8_per_tensor_weights

    torch.manual_seed(0)
    e, h, i, t = 8, 256, 128, 6
    w1 = (torch.randn(e, 2 * i, h) / h**0.5).bfloat16()
    w2 = (torch.randn(e, h, i) / i**0.5).bfloat16()
    x = torch.randn(t, h).bfloat16()
    s_in, s_mid = 64.0, 32.0
    p = prepare_trtllm_fp8_per_tensor_weights(
        w1,
        w2,
        hidden_states_scale_global=s_in,
        intermediate_scale_global=s_mid,
        num_local_experts=e,
        hidden_size=h,
        intermediate_size=i,
    )
    logits = torch.randn(t, e).bfloat16()
    xq = (x.float() * s_in).to(torch.float8_e4m3fn)
    args = (logits, None, xq, p["gemm1_weights"], p["output1_scales_scalar"])
    args += (p["output1_scales_gate_scalar"], p["gemm2_weights"], p["output2_scales_scalar"])
    args += (e, 2, None, None, i, 0, e, None, False)
    name = calls.PT_FP8_PER_TENSOR
    out = _route(monkeypatch, FP8_PER_TENSOR, name, args, {"routing_method_type": 1})
    _hit(out)
    top, ids = logits.float().topk(2, dim=-1)
    weights = top.softmax(-1)
    expected = torch.zeros(t, h)
    for tok in range(t):
        for k in range(2):
            up, gate = (x[tok].float() @ w1[ids[tok, k]].float().T).chunk(2)
            y = (F.silu(gate) * up) @ w2[ids[tok, k]].float().T
            expected[tok] += weights[tok, k] * y
    # float8 activations, weights and SwiGLU output: a few percent of the output's scale.
    err = (out.result.float() - expected).abs().max() / expected.abs().max()
    assert err < 0.1, err


PARTITIONED = "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_moe_partitioned"


def _shards(strategy: str, e: int, h: int, i: int):
    """Logical weights, FlashInfer's prepared weights, and the shards it cuts from them."""
    from flashinfer.fused_moe.prepare import prepare_trtllm_bf16_weights
    from flashinfer.prims_ts.moe.partition import (
        prepared_block_major_k_bytes,
        prepared_weight_layouts,
        shard_prepared_moe_weights,
    )

    w1 = (torch.randn(e, 2 * i, h) / h**0.5).bfloat16()
    w2 = (torch.randn(e, h, i) / i**0.5).bfloat16()
    p = prepare_trtllm_bf16_weights(w1, w2, num_local_experts=e, hidden_size=h, intermediate_size=i)
    g1, g2 = p["gemm1_weights"], p["gemm2_weights"]
    l1, l2 = prepared_weight_layouts(
        weight_dtype=torch.bfloat16,
        weight_layout=2,
        use_shuffled_weight=True,
        fc1_block_major_k_bytes=prepared_block_major_k_bytes(g1, 2),
        fc2_block_major_k_bytes=prepared_block_major_k_bytes(g2, 2),
    )
    s = shard_prepared_moe_weights(
        g1, g2, strategy=strategy, hidden_size=h, intermediate_size=i, fc1_layout=l1, fc2_layout=l2
    )
    return (w1, w2), (g1, g2), (tuple(s.fc1), tuple(s.fc2))


def _partitioned_call(logits, x, shards, strategy, **kwargs):
    from flashinfer.prims_ts.moe.partition import MoePartitionResources

    resources = object.__new__(MoePartitionResources)  # its streams need a GPU; never read
    e, i = logits.shape[1], shards[0][0].shape[2]
    args = (logits, None, None, None, x, *shards, e, 2, None, None, i, 0, e, resources, strategy)
    return args, {"routing_method_type": 1, "weight_layout": 2} | kwargs


@pytest.mark.parametrize(
    ("strategy", "name"),
    [
        ("tp_n_tp_n", "prims_ts_bf16_moe_partitioned_renorm_tpnn_topk2_e8_h256_i128"),
        ("tp_n_tp_k", "prims_ts_bf16_moe_partitioned_renorm_tpnk_topk2_e8_h256_i128"),
    ],
)
def test_prims_ts_bf16_moe_partitioned_computes_the_unpartitioned_moe_of_flashinfers_shards(
    monkeypatch, strategy, name
):
    # "Same computation as prims_ts_bf16_moe": the routed result of the shards is the
    # unpartitioned family's reference on the weights they were cut from, and that of the
    # logical weights.
    import torch.nn.functional as F

    torch.manual_seed(0)
    e, h, i, t = 8, 256, 128, 6
    (w1, w2), (g1, g2), shards = _shards(strategy, e, h, i)
    x = torch.randn(t, h).bfloat16()
    logits = torch.randn(t, e).bfloat16()
    args, kwargs = _partitioned_call(logits, x, shards, strategy)
    out = _route(monkeypatch, PARTITIONED, name, args, kwargs)
    seen = _hit(out)
    assert seen["gemm2_weights_0"] is shards[1][0]
    whole = _reference(calls.PT_BF16_RENORM)(logits.float(), x, g1, g2)
    assert torch.equal(out.result, whole)
    top, ids = logits.float().topk(2, dim=-1)
    weights = top.softmax(-1)
    expected = torch.zeros(t, h)
    for tok in range(t):
        for k in range(2):
            up, gate = (x[tok].float() @ w1[ids[tok, k]].float().T).chunk(2)
            y = (F.silu(gate) * up) @ w2[ids[tok, k]].float().T
            expected[tok] += weights[tok, k] * y
    torch.testing.assert_close(out.result.float(), expected, atol=2e-2, rtol=1e-2)


def test_prims_ts_bf16_moe_partitioned_shards_of_the_other_strategy_are_not_routed(monkeypatch):
    # tp_n_tp_k shards named as tp_n_tp_n: GEMM2's shards have the shape of neither family.
    torch.manual_seed(0)
    _, _, shards = _shards("tp_n_tp_k", 8, 256, 128)
    logits, x = torch.randn(4, 8).bfloat16(), torch.randn(4, 256).bfloat16()
    args, kwargs = _partitioned_call(logits, x, shards, "tp_n_tp_n")
    name = calls.PT_BF16_PARTITIONED
    out = _route(monkeypatch, PARTITIONED, name, args, kwargs)
    assert out.counts["hit"] == 0 and not out.seen, out.counts
    assert out.result == "flashinfer" and len(out.originals) == 1


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("weight_layout", 0),
        ("routing_bias", torch.zeros(8)),
        ("do_finalize", False),
        ("gemm1_clamp_limit", torch.ones(8)),
    ],
)
def test_prims_ts_bf16_moe_partitioned_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, param, value
):
    call = calls.prims_ts_bf16_moe_partitioned(_catalogue())
    kwargs = _bound(call, PARTITIONED) | {param: value}
    out = _route(monkeypatch, PARTITIONED, call.name, (), kwargs)
    _refused(out, param)
    assert out.originals[0][param] is value


def test_prims_ts_bf16_moe_partitioned_precomputed_routing_is_not_routed(monkeypatch):
    call = calls.prims_ts_bf16_moe_partitioned(_catalogue())
    kwargs = _bound(call, PARTITIONED)
    ids = torch.zeros(5, 2, dtype=torch.int32)
    kwargs |= {"routing_logits": None, "topk_ids": ids}
    out = _route(monkeypatch, PARTITIONED, call.name, (), kwargs)
    assert out.counts["hit"] == 0 and not out.seen, out.counts
    assert out.result == "flashinfer" and out.originals[0]["topk_ids"] is ids


FP8_PARTITIONED = (
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_per_tensor_scale_moe_partitioned"
)


@pytest.mark.parametrize(
    ("strategy", "name"),
    [
        (
            "tp_n_tp_n",
            "prims_ts_fp8_per_tensor_scale_moe_partitioned_renorm_tpnn_topk2_e8_h256_i128",
        ),
        (
            "tp_n_tp_k",
            "prims_ts_fp8_per_tensor_scale_moe_partitioned_renorm_tpnk_topk2_e8_h256_i128",
        ),
    ],
)
def test_prims_ts_fp8_per_tensor_moe_partitioned_computes_the_unpartitioned_moe(
    monkeypatch, strategy, name
):
    from flashinfer.fused_moe.prepare import prepare_trtllm_fp8_per_tensor_weights
    from flashinfer.prims_ts.moe.partition import (
        MoePartitionResources,
        prepared_weight_layouts,
        shard_prepared_moe_weights,
    )

    torch.manual_seed(0)
    e, h, i, t = 8, 256, 128, 6
    w1 = (torch.randn(e, 2 * i, h) / h**0.5).bfloat16()
    w2 = (torch.randn(e, h, i) / i**0.5).bfloat16()
    p = prepare_trtllm_fp8_per_tensor_weights(
        w1,
        w2,
        hidden_states_scale_global=64.0,
        intermediate_scale_global=32.0,
        num_local_experts=e,
        hidden_size=h,
        intermediate_size=i,
    )
    l1, l2 = prepared_weight_layouts(
        weight_dtype=torch.float8_e4m3fn, weight_layout=0, use_shuffled_weight=True
    )
    s = shard_prepared_moe_weights(
        p["gemm1_weights"],
        p["gemm2_weights"],
        strategy=strategy,
        hidden_size=h,
        intermediate_size=i,
        fc1_layout=l1,
        fc2_layout=l2,
    )
    logits = torch.randn(t, e).bfloat16()
    xq = (torch.randn(t, h) * 64.0).to(torch.float8_e4m3fn)
    scales = (p["output1_scales_scalar"], p["output1_scales_gate_scalar"])
    args = (logits, None, None, None, xq, tuple(s.fc1), *scales, tuple(s.fc2))
    args += (p["output2_scales_scalar"], e, 2, None, None, i, 0, e)
    args += (object.__new__(MoePartitionResources), strategy)
    out = _route(monkeypatch, FP8_PARTITIONED, name, args, {"routing_method_type": 1})
    _hit(out)
    # The unpartitioned family's reference on the whole prepared weights.
    whole = _reference(calls.PT_FP8_PER_TENSOR)(
        logits, xq, p["gemm1_weights"], *scales, p["gemm2_weights"], p["output2_scales_scalar"]
    )
    assert torch.equal(out.result, whole) and whole.abs().sum() > 0


@pytest.mark.parametrize(
    ("param", "value"),
    [("weight_layout", 2), ("use_routing_scales_on_input", True), ("partition_strategy", "x")],
)
def test_prims_ts_fp8_per_tensor_moe_partitioned_unmodelled_parameters_are_refused(
    monkeypatch, param, value
):
    call = calls.prims_ts_fp8_per_tensor_scale_moe_partitioned(_catalogue())
    kwargs = _bound(call, FP8_PARTITIONED) | {param: value}
    out = _route(monkeypatch, FP8_PARTITIONED, call.name, (), kwargs)
    assert out.counts["hit"] == 0 and not out.seen, out.counts
    assert param in str(out.counts["rules"]), out.counts
    assert out.result == "flashinfer" and out.originals[0][param] is value


FP4_PARTITIONED = (
    "flashinfer.fused_moe.backends.prims_ts.fp4_op.prims_ts_fp4_block_scale_moe_partitioned"
)


@pytest.mark.parametrize(
    ("strategy", "name", "i"),
    [
        (
            "tp_n_tp_n",
            "prims_ts_fp4_block_scale_moe_partitioned_renorm_tpnn_topk2_e8_h256_i128",
            128,
        ),
        (
            "tp_n_tp_k",
            "prims_ts_fp4_block_scale_moe_partitioned_renorm_tpnk_topk2_e8_h256_i256",
            256,
        ),
    ],
)
def test_prims_ts_fp4_moe_partitioned_computes_the_unpartitioned_moe_of_flashinfers_shards(
    monkeypatch, strategy, name, i
):
    # Prepared MXFP4 weights and scales (random bytes in their layouts), cut into shards by
    # FlashInfer's own sharding: the routed result of the shards is the unpartitioned family's
    # reference on the whole tensors.
    from flashinfer.prims_ts.moe.partition import (
        MoePartitionResources,
        prepared_weight_layouts,
        shard_prepared_moe_weights,
    )

    torch.manual_seed(0)
    e, h, t = 8, 256, 6
    u8 = torch.uint8
    g1 = torch.randint(0, 256, (e, 2 * i, h // 2), dtype=u8)
    g2 = torch.randint(0, 256, (e, h, i // 2), dtype=u8)
    s1 = torch.randint(118, 128, (e, 2 * i, h // 32), dtype=u8)
    s2 = torch.randint(118, 128, (e, h, i // 32), dtype=u8)
    l1, l2 = prepared_weight_layouts(
        weight_dtype=u8,
        weight_layout=0,
        use_shuffled_weight=True,
        scale_k_group_size=32,
        scale_dtype=u8,
    )
    sh = shard_prepared_moe_weights(
        g1,
        g2,
        strategy=strategy,
        hidden_size=h,
        intermediate_size=i,
        fc1_layout=l1,
        fc2_layout=l2,
        fc1_scale=s1,
        fc2_scale=s2,
    )
    logits, x = torch.randn(t, e).bfloat16(), torch.randn(t, h).bfloat16()
    ones = torch.ones(e)
    args = (logits, None, None, None, x, None, tuple(sh.fc1), tuple(sh.fc1_scale))
    args += (tuple(sh.fc2), tuple(sh.fc2_scale), ones, ones.clone(), ones.clone())
    args += (e, 2, None, None, i, 0, e, object.__new__(MoePartitionResources), strategy)
    out = _route(monkeypatch, FP4_PARTITIONED, name, args, {"routing_method_type": 1})
    _hit(out)
    whole = _reference(calls.PT_FP4_RENORM)(
        logits.float(),
        x,
        g1,
        s1.view(torch.int8),
        None,
        None,
        None,
        None,
        g2,
        s2.view(torch.int8),
        None,
    )
    assert torch.equal(out.result[0], whole) and whole.abs().sum() > 0


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("output1_scale_scalar", torch.full((8,), 2.0)),
        ("weight_layout", 2),
        ("partition_strategy", "x"),
    ],
)
def test_prims_ts_fp4_moe_partitioned_unmodelled_parameters_are_refused(monkeypatch, param, value):
    call = calls.prims_ts_fp4_block_scale_moe_partitioned(_catalogue())
    kwargs = _bound(call, FP4_PARTITIONED) | {param: value}
    out = _route(monkeypatch, FP4_PARTITIONED, call.name, (), kwargs)
    assert out.counts["hit"] == 0 and not out.seen, out.counts
    assert param in str(out.counts["rules"]), out.counts
    assert out.result == "flashinfer" and out.originals[0][param] is value


# The FP8 block-scale (DeepSeek FP8) families: Prims-TS takes only shuffled weights, which
# the references unshuffle (blocks of 16 rows, for the kernels' 64-row epilogue tiles).
FP8_BLOCK = "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_block_scale_moe"
FP8_BLOCK_ROUTED = (
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_block_scale_routed_moe"
)


@pytest.mark.parametrize(
    ("path", "build"),
    [
        (FP8_BLOCK, calls.prims_ts_fp8_block_scale_moe),
        (FP8_BLOCK_ROUTED, calls.prims_ts_fp8_block_scale_routed_moe),
    ],
)
def test_prims_ts_fp8_block_scale_calls_with_shuffled_weights_are_routed(monkeypatch, path, build):
    call = build(_catalogue())
    out = _route(monkeypatch, path, call.name, (), _bound(call, path))
    seen = _hit(out)
    assert torch.equal(out.result, _reference(call.name)(**seen))
    assert out.result.abs().sum() > 0


def test_prims_ts_fp8_block_scale_deepseek_routing_reads_none_as_flashinfer_does(monkeypatch):
    # FlashInfer's routing reads routed_scaling_factor None as 1 and routing_bias None as no
    # bias: the call is routed with those values.
    call = calls.prims_ts_fp8_block_scale_moe(_catalogue())
    kwargs = _bound(call, FP8_BLOCK)
    given = dict(kwargs)
    kwargs |= {"routed_scaling_factor": None, "routing_bias": None}
    out = _route(monkeypatch, FP8_BLOCK, call.name, (), kwargs)
    seen = _hit(out)
    assert float(seen["routed_scaling_factor"]) == 1.0
    assert not seen["routing_bias"].any()
    given |= {"routed_scaling_factor": 1.0, "routing_bias": torch.zeros(16).bfloat16()}
    again = _route(monkeypatch, FP8_BLOCK, call.name, (), given)
    assert torch.equal(out.result, again.result) and out.result.abs().sum() > 0


@pytest.mark.parametrize("method", [1, 4])
def test_prims_ts_fp8_block_scale_renormalize_routing_reaches_its_family(monkeypatch, method):
    name = "prims_ts_fp8_block_scale_moe_renorm_topk2_e8_h256_i128"
    x, _ = _catalogue().inputs(name, seq_len=4)
    args = (x["routing_logits"].bfloat16(), None, x["hidden_states"], x["hidden_states_scale"])
    args += (x["gemm1_weights"], x["gemm1_weights_scale"], x["gemm2_weights"])
    args += (x["gemm2_weights_scale"], 8, 2, None, None, 128, 0, 8, None)
    kwargs = {"routing_method_type": method, "use_shuffled_weight": True}
    out = _route(monkeypatch, FP8_BLOCK, name, args, kwargs)
    seen = _hit(out)
    assert torch.equal(out.result, _reference(name)(**seen))


@pytest.mark.parametrize(
    ("path", "build", "param", "value"),
    [
        # FlashInfer's default, which Prims-TS refuses.
        (FP8_BLOCK, calls.prims_ts_fp8_block_scale_moe, "use_shuffled_weight", False),
        (FP8_BLOCK, calls.prims_ts_fp8_block_scale_moe, "weight_layout", 2),
        (FP8_BLOCK, calls.prims_ts_fp8_block_scale_moe, "num_fused_shared_experts", 1),
        (FP8_BLOCK, calls.prims_ts_fp8_block_scale_moe, "gemm2_bias", torch.zeros(8, 256)),
        (FP8_BLOCK, calls.prims_ts_fp8_block_scale_moe, "do_finalize", False),
        (FP8_BLOCK_ROUTED, calls.prims_ts_fp8_block_scale_routed_moe, "weight_layout", 2),
        (FP8_BLOCK_ROUTED, calls.prims_ts_fp8_block_scale_routed_moe, "gemm1_alpha", None),
        (FP8_BLOCK_ROUTED, calls.prims_ts_fp8_block_scale_routed_moe, "routed_scaling_factor", 2.5),
    ],
)
def test_prims_ts_fp8_block_scale_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, path, build, param, value
):
    call = build(_catalogue())
    if value is None:  # a tensor where the definition models None
        value = torch.ones(8)
    out = _route(monkeypatch, path, call.name, (), _bound(call, path) | {param: value})
    _refused(out, param)
    assert out.originals[0][param] is value


@pytest.mark.parametrize("path", [FP8_BLOCK, FP8_BLOCK_ROUTED])
def test_prims_ts_fp8_block_scale_mxfp8_recipe_is_refused(monkeypatch, path):
    from flashinfer.fused_moe import Fp8QuantizationType

    build = {FP8_BLOCK: calls.prims_ts_fp8_block_scale_moe}.get(
        path, calls.prims_ts_fp8_block_scale_routed_moe
    )
    call = build(_catalogue())
    kwargs = _bound(call, path) | {"fp8_quantization_type": Fp8QuantizationType.MxFp8}
    out = _route(monkeypatch, path, call.name, (), kwargs)
    _refused(out, "fp8_quantization_type")


def test_prims_ts_fp8_block_scale_routed_moe_undoes_flashinfers_shuffle(monkeypatch):
    # FlashInfer's test of this API prepares the DeepSeek FP8 weights as quantized by
    # prepare_trtllm_fp8_block_weights, each expert's rows shuffled with shuffle_matrix_a(w, 64).
    import torch.nn.functional as F
    from flashinfer import shuffle_matrix_a
    from flashinfer.fused_moe.api import QuantConfig, QuantFormat
    from flashinfer.fused_moe.prepare import (
        prepare_trtllm_fp8_block_activations,
        prepare_trtllm_fp8_block_weights,
    )

    torch.manual_seed(0)
    experts, local, h, i, t = 16, 8, 256, 128, 6
    quant = QuantConfig(QuantFormat.DeepSeekFp8, QuantFormat.DeepSeekFp8)
    w1 = (torch.randn(local, 2 * i, h) / h**0.5).bfloat16()
    w2 = (torch.randn(local, h, i) / i**0.5).bfloat16()
    p = prepare_trtllm_fp8_block_weights(
        w1, w2, quant=quant, num_local_experts=local, hidden_size=h, intermediate_size=i
    )

    def shuffled(w):
        rows = [shuffle_matrix_a(w[e].view(torch.uint8), 64) for e in range(local)]
        return torch.stack(rows).view(torch.float8_e4m3fn)

    x = torch.randn(t, h).bfloat16()
    xq, x_scale = prepare_trtllm_fp8_block_activations(x, quant=quant)
    ids = torch.stack([torch.randperm(experts)[:2] for _ in range(t)])
    ids[:, 0] = torch.randint(8, experts, (t,))  # every token reaches this rank's experts
    weights = torch.rand(t, 2)
    args = (_packed(ids, weights), None, xq, x_scale, shuffled(p["gemm1_weights"]))
    args += (p["gemm1_weights_scale"], shuffled(p["gemm2_weights"]), p["gemm2_weights_scale"])
    args += (experts, 2, None, None, i, 8, local, None)
    kwargs = {"use_shuffled_weight": True}
    out = _route(monkeypatch, FP8_BLOCK_ROUTED, calls.PT_FP8_BLOCK_ROUTED, args, kwargs)
    _hit(out)
    expected = torch.zeros(t, h)
    wb = weights.bfloat16().float()
    for tok in range(t):
        for k in range(2):
            e = int(ids[tok, k]) - 8
            if e < 0:
                continue  # another rank's expert
            up, gate = (x[tok].float() @ w1[e].float().T).chunk(2)
            expected[tok] += wb[tok, k] * ((F.silu(gate) * up) @ w2[e].float().T)
    # float8 activations, weights and hand-offs: a few percent of the output's scale.
    err = (out.result.float() - expected).abs().max() / expected.abs().max()
    assert err < 0.1, err


FP8_BLOCK_PARTITIONED = (
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_block_scale_moe_partitioned"
)


@pytest.mark.parametrize(
    ("strategy", "name", "i"),
    [
        (
            "tp_n_tp_n",
            "prims_ts_fp8_block_scale_moe_partitioned_renorm_tpnn_topk2_e8_h256_i128",
            128,
        ),
        (
            "tp_n_tp_k",
            "prims_ts_fp8_block_scale_moe_partitioned_renorm_tpnk_topk2_e8_h256_i256",
            256,
        ),
    ],
)
def test_prims_ts_fp8_block_scale_moe_partitioned_computes_the_moe_of_flashinfers_shards(
    monkeypatch, strategy, name, i
):
    # Prepared MXFP8 weights and scales (random values in their layouts), cut into shards by
    # FlashInfer's own sharding; the expected output reads the whole prepared tensors through
    # FlashInfer's own trace helpers for that layout (128 x 4 unswizzle, row unshuffle and
    # de-interleave), and rounds the SwiGLU output for GEMM2 with Prims-TS's own reference of
    # its MX epilogue (quantize_block_scaled: the power of two at or below amax over 256).
    import torch.nn.functional as F
    from flashinfer.prims_ts.batched_gemm.batched_gemm_quant import quantize_block_scaled
    from flashinfer.prims_ts.batched_gemm.config_types import DType
    from flashinfer.prims_ts.moe.partition import (
        MoePartitionResources,
        prepared_weight_layouts,
        shard_prepared_moe_weights,
    )
    from flashinfer.trace.templates.gemm import _unswizzle_batched_sf_128x4
    from flashinfer.trace.templates.moe import _trtllm_unshuffle_weight

    torch.manual_seed(0)
    e, h, t = 8, 256, 6
    u8, f8 = torch.uint8, torch.float8_e4m3fn
    g1 = torch.randn(e, 2 * i, h).to(f8)
    g2 = torch.randn(e, h, i).to(f8)
    s1 = torch.randint(118, 128, (e, 2 * i, h // 32), dtype=u8)
    s2 = torch.randint(118, 128, (e, h, i // 32), dtype=u8)
    l1, l2 = prepared_weight_layouts(
        weight_dtype=f8,
        weight_layout=0,
        use_shuffled_weight=True,
        scale_k_group_size=32,
        scale_dtype=u8,
    )
    sh = shard_prepared_moe_weights(
        g1,
        g2,
        strategy=strategy,
        hidden_size=h,
        intermediate_size=i,
        fc1_layout=l1,
        fc2_layout=l2,
        fc1_scale=s1,
        fc2_scale=s2,
    )
    logits = torch.randn(t, e).bfloat16()
    x = torch.randn(t, h).to(f8)
    x_scale = torch.randint(124, 130, (t, h // 32), dtype=u8)
    args = (logits, None, None, None, x, x_scale, tuple(sh.fc1), tuple(sh.fc1_scale))
    args += (tuple(sh.fc2), tuple(sh.fc2_scale), e, 2, None, None, i, 0, e)
    args += (object.__new__(MoePartitionResources), strategy)
    out = _route(monkeypatch, FP8_BLOCK_PARTITIONED, name, args, {"routing_method_type": 1})
    _hit(out)

    def dequant(w, s, rows, cols):
        scales = torch.exp2(_unswizzle_batched_sf_128x4(s, e, rows, cols).float() - 127.0)
        return w.float() * scales.repeat_interleave(32, dim=-1)

    w13 = _trtllm_unshuffle_weight(dequant(g1, s1, 2 * i, h // 32), gated=True)
    w2 = _trtllm_unshuffle_weight(dequant(g2, s2, h, i // 32), gated=False)
    xs = x.float() * torch.exp2(x_scale.float() - 127.0).repeat_interleave(32, dim=-1)
    top, ids = logits.float().topk(2, dim=-1)
    weights = top.softmax(-1)

    def mx_epilogue(a):
        q, sf = quantize_block_scaled(
            a[None], dtype_kind=int(DType.MXE4M3), uses_mx=True, sf_vec_size=32
        )
        values = q.view(torch.float8_e4m3fn).float().reshape(-1, 32)
        return (values * sf.float().reshape(-1, 1)).reshape(a.shape)

    expected = torch.zeros(t, h)
    unrounded = torch.zeros(t, h)
    for tok in range(t):
        for k in range(2):
            up, gate = (xs[tok] @ w13[ids[tok, k]].T).chunk(2)
            act = F.silu(gate) * up
            expected[tok] += weights[tok, k] * (mx_epilogue(act) @ w2[ids[tok, k]].T)
            unrounded[tok] += weights[tok, k] * (act @ w2[ids[tok, k]].T)
    scale = expected.abs().max()
    err = (out.result.float() - expected).abs().max() / scale
    assert err < 0.02, err  # bfloat16 output and summation order
    # The hand-off matters: without it the output is several percent away.
    assert (out.result.float() - unrounded).abs().max() / scale > 2 * err


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("partition_strategy", "tp_k"),
        ("weight_layout", 2),
        ("use_shuffled_weight", False),
        ("norm_topk_prob", False),
        ("topk_ids", torch.zeros(5, 2, dtype=torch.int32)),
    ],
)
def test_prims_ts_fp8_block_scale_moe_partitioned_unmodelled_parameters_are_refused(
    monkeypatch, param, value
):
    call = calls.prims_ts_fp8_block_scale_moe_partitioned(_catalogue())
    kwargs = _bound(call, FP8_BLOCK_PARTITIONED) | {param: value}
    out = _route(monkeypatch, FP8_BLOCK_PARTITIONED, call.name, (), kwargs)
    assert out.counts["hit"] == 0 and not out.seen, out.counts
    assert param in str(out.counts["rules"]), out.counts
    assert out.result == "flashinfer" and out.originals[0][param] is value


def test_prims_ts_fp8_block_scale_moe_partitioned_deepseek_recipe_is_refused(monkeypatch):
    # FlashInfer refuses DeepSeek FP8 for partitioned execution; so does the family.
    from flashinfer.fused_moe import Fp8QuantizationType

    call = calls.prims_ts_fp8_block_scale_moe_partitioned(_catalogue())
    kwargs = _bound(call, FP8_BLOCK_PARTITIONED)
    kwargs["fp8_quantization_type"] = Fp8QuantizationType.DeepSeekFp8
    out = _route(monkeypatch, FP8_BLOCK_PARTITIONED, call.name, (), kwargs)
    _refused(out, "fp8_quantization_type")


def test_prims_ts_fp8_block_scale_moe_partitioned_reads_padded_activation_scales_as_flashinfer(
    monkeypatch,
):
    # Prims-TS also takes the activation scales padded to 16 per token and keeps the first
    # H / 32 (runner._pad_mxfp8_linear_scale_for_prims); so does the rule: the same result.
    call = calls.prims_ts_fp8_block_scale_moe_partitioned(_catalogue())
    kwargs = _bound(call, FP8_BLOCK_PARTITIONED)
    plain = _route(monkeypatch, FP8_BLOCK_PARTITIONED, call.name, (), dict(kwargs))
    _hit(plain)
    expected = plain.result.clone()  # the call's output buffer is written again below
    plain.result.zero_()
    scale = kwargs["hidden_states_scale"].reshape(5, 8)
    kwargs["hidden_states_scale"] = torch.cat([scale, torch.full_like(scale, 127)], dim=1)
    padded = _route(monkeypatch, FP8_BLOCK_PARTITIONED, call.name, (), kwargs)
    _hit(padded)
    assert expected.abs().sum() > 0 and torch.equal(padded.result, expected)
