"""The MoE routing families (moe_routing.fidef) against the real FlashInfer.

As in ``test_catalogue_moe.py``: FlashInfer's function is replaced by a recorder with its
signature before apply is enabled; a call with FlashInfer's defaults is routed and the
solution's result is what the API hands back (written into the caller's buffers for
fused_topk_deepseek), a parameter the definition does not model is refused with its rule
counted, and the references agree with those of FlashInfer's own trace templates.
"""

from __future__ import annotations

import pytest
import torch
from _shared import require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _gemm_moe_calls as calls
from flashinfer.trace.templates import moe as moe_templates
from flashinfer.trace.templates import sampling as sampling_templates
from test_catalogue_gemm import (
    _bound,
    _catalogue,
    _hit,
    _off,  # noqa: F401  (the autouse fixture that turns apply off)
    _reference,
    _refused,
    _route,
)
from test_catalogue_moe import _without_defaults

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning"),
]

TOPK_DEEPSEEK = "flashinfer.fused_moe.fused_topk_deepseek"
HASH_TOPK = "flashinfer.fused_moe.hash_topk.hash_topk"


# ---------------------------------------------------------------------------------------
# fused_topk_deepseek
# ---------------------------------------------------------------------------------------


def test_fused_topk_deepseek_writes_the_solutions_routing_into_the_callers_buffers(monkeypatch):
    call = calls.fused_topk_deepseek(_catalogue())
    kwargs = _without_defaults(call, TOPK_DEEPSEEK)
    values, indices = kwargs["topk_values"], kwargs["topk_indices"]
    out = _route(monkeypatch, TOPK_DEEPSEEK, call.name, (), kwargs)
    seen = _hit(out)
    assert out.result is None  # FlashInfer returns nothing: the buffers hold the routing
    want_values, want_indices = _reference(call.name)(**seen)
    assert torch.equal(values, want_values) and torch.equal(indices, want_indices)
    assert values.abs().sum() > 0


def test_fused_topk_deepseek_float32_scores_reach_the_float32_definition(monkeypatch):
    name = calls.TOPK_DEEPSEEK.replace("_bf16", "_fp32")
    c = _catalogue()
    x, axes = c.inputs(name, num_tokens=3)
    values, indices = c.buffer(name, "topk_values", axes), c.buffer(name, "topk_indices", axes)
    args = (x["scores"], x["bias"], 4, 2, 4, 1.0, values, indices)
    out = _route(monkeypatch, TOPK_DEEPSEEK, name, args, {})
    _hit(out)
    assert values.dtype == torch.float32
    torch.testing.assert_close(values.sum(-1), torch.ones(3))  # routed_scaling_factor 1


@pytest.mark.parametrize(
    ("param", "value", "rule"),
    [
        ("routing_replay_out", torch.zeros(5, 4, dtype=torch.int16), "routing_replay_out"),
        ("n_group", 2, "key"),  # a definition of other groups: there is none
        ("topk_group", 1, "key"),
    ],
)
def test_fused_topk_deepseek_calls_the_definition_does_not_model_fall_back(
    monkeypatch, param, value, rule
):
    call = calls.fused_topk_deepseek(_catalogue())
    out = _route(
        monkeypatch, TOPK_DEEPSEEK, call.name, (), _bound(call, TOPK_DEEPSEEK) | {param: value}
    )
    if rule == "key":
        assert out.counts["hit"] == 0 and not out.seen, out.counts
        assert out.result == "flashinfer" and len(out.originals) == 1
    else:
        _refused(out, rule)
    assert out.originals[0][param] is value


@pytest.mark.parametrize(
    "name",
    [
        "fused_topk_deepseek_e16_k4_ng4_kg2_bf16",
        "fused_topk_deepseek_e16_k4_ng4_kg2_fp32",
        "fused_topk_deepseek_e256_k8_ng8_kg4_fp32",
        "fused_topk_deepseek_e256_k8_ng8_kg4_bf16",
    ],
)
def test_fused_topk_deepseek_matches_flashinfers_template_reference(name):
    d = _catalogue().defs[name]
    params = dict(d.param_values)
    consts = dict(d.consts)
    x, axes = _catalogue().inputs(name, seed=3, num_tokens=7)
    values = _catalogue().buffer(name, "topk_values", axes)
    indices = _catalogue().buffer(name, "topk_indices", axes)
    sampling_templates._fused_topk_deepseek_reference(
        x["scores"],
        x["bias"],
        params["n_group"],
        params["topk_group"],
        consts["topk"],
        float(x["routed_scaling_factor"]),
        values,
        indices,
    )
    got_values, got_indices = _reference(name)(**x)
    assert torch.equal(got_indices, indices)
    torch.testing.assert_close(got_values, values, atol=1e-2, rtol=1e-2)


def test_fused_topk_deepseek_picks_only_from_the_best_groups():
    # One token, 16 experts in 4 groups of 4: groups 1 and 3 hold the two best pairs, so
    # expert 0, the best single score in group 0, is never picked with topk_group 2.
    name = calls.TOPK_DEEPSEEK
    scores = torch.full((1, 16), -4.0)
    scores[0, 0] = 5.0  # alone in its group: its group scores 5-ish + a low second
    scores[0, 4:6] = 3.0
    scores[0, 12:14] = 3.0
    bias = torch.zeros(16)
    values, ids = _reference(name)(scores.bfloat16(), bias.bfloat16(), torch.tensor(1.0))
    assert sorted(ids[0].tolist()) == [4, 5, 12, 13]
    torch.testing.assert_close(values.float().sum(), torch.tensor(1.0), atol=1e-2, rtol=0)


def test_fused_topk_deepseek_breaks_ties_toward_the_lower_expert_as_flashinfer_does():
    # FlashInfer's routing kernels rank (score, expert) pairs with the lower id first on equal
    # scores; bfloat16 logits tie often (about 3% of DeepSeek tokens at the 8th expert).
    # With every score equal, the first groups and their first experts win, best first.
    name = calls.TOPK_DEEPSEEK
    scores = torch.zeros(3, 16).bfloat16()
    scores[1, 8:] = 1.0  # groups 2 and 3 tie above the rest: their lower experts win
    scores[2, 5] = 2.0  # its group first, then group 0 on a tie; then experts 0-2 of the tie
    values, ids = _reference(name)(scores, torch.zeros(16).bfloat16(), torch.tensor(1.0))
    assert ids.tolist() == [[0, 1, 2, 3], [8, 9, 10, 11], [5, 0, 1, 2]]


def test_moe_references_rank_experts_with_a_stable_sort():
    # torch.topk leaves the order of ties unspecified (and CPU and CUDA differ): a reference
    # that ranks experts or groups with it may pick another expert than FlashInfer on a tie.
    # Taking only the values of a top-k (a group's two best scores) is order-free.
    ranked = {
        name: d.reference
        for name, d in _catalogue().defs.items()
        if d.reference
        and ("moe" in name or name.startswith("fused_topk"))
        and "topk(" in d.reference
    }
    unstable = {
        name: line.strip()
        for name, ref in ranked.items()
        for line in ref.splitlines()
        if "topk(" in line and ").values" not in line
    }
    assert ranked and not unstable


# ---------------------------------------------------------------------------------------
# hash_topk
# ---------------------------------------------------------------------------------------


def test_hash_topk_with_a_shared_expert_is_routed_and_returns_flashinfers_pair(monkeypatch):
    call = calls.hash_topk(_catalogue())
    out = _route(monkeypatch, HASH_TOPK, call.name, call.args, call.kwargs)
    seen = _hit(out)
    weights, ids = out.result
    want_weights, want_ids = _reference(call.name)(**seen)
    assert torch.equal(weights, want_weights) and torch.equal(ids, want_ids)
    assert ids.shape == (5, 5) and (ids[:, -1] == 16).all()
    torch.testing.assert_close(weights[:, :4].sum(-1), torch.ones(5))


def test_hash_topk_with_flashinfers_defaults_reaches_the_definition_without_shared_expert(
    monkeypatch,
):
    name = "hash_topk_e16_k4_sh0"
    x, _ = _catalogue().inputs(name, num_tokens=4, vocab=9)
    out = _route(
        monkeypatch, HASH_TOPK, name, (x["router_logits"], x["input_ids"], x["tid2eid"]), {}
    )
    seen = _hit(out)
    assert seen["routed_scaling_factor"] == 1.0
    assert out.result[1].shape == (4, 4)


@pytest.mark.parametrize("factor", [0.0, float("inf")])
def test_hash_topk_with_a_shared_expert_and_no_finite_scale_falls_back(monkeypatch, factor):
    call = calls.hash_topk(_catalogue())
    kwargs = _bound(call, HASH_TOPK) | {"routed_scaling_factor": factor}
    out = _route(monkeypatch, HASH_TOPK, call.name, (), kwargs)
    # FlashInfer's own check then says what is wrong.
    assert out.counts["hit"] == 0 and out.counts["fallback_guard"] == 1, out.counts
    assert out.result == "flashinfer"


def test_hash_topk_with_int32_token_ids_falls_back_to_flashinfers_message(monkeypatch):
    call = calls.hash_topk(_catalogue())
    kwargs = _bound(call, HASH_TOPK)
    kwargs["input_ids"] = kwargs["input_ids"].int()
    out = _route(monkeypatch, HASH_TOPK, call.name, (), kwargs)
    assert out.counts["hit"] == 0 and out.result == "flashinfer", out.counts


@pytest.mark.parametrize(
    "name", ["hash_topk_e16_k4_sh0", "hash_topk_e16_k4_sh1", "hash_topk_e256_k8_sh1"]
)
def test_hash_topk_matches_flashinfers_template_reference(name):
    d = _catalogue().defs[name]
    x, _ = _catalogue().inputs(name, seed=2, num_tokens=6, vocab=40)
    shared = dict(d.param_values)["num_fused_shared_experts"]
    want_weights, want_ids = moe_templates._hash_topk_reference(
        x["router_logits"],
        x["input_ids"],
        x["tid2eid"],
        num_fused_shared_experts=shared,
        routed_scaling_factor=float(x["routed_scaling_factor"]),
    )
    weights, ids = _reference(name)(**x)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights)
