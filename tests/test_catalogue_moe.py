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
import fibgen.runtime as rt
import flashinfer.fused_moe
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

# Slow as a whole: MoE calls through the real FlashInfer's API.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning"),
]

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
    # FlashInfer returns its kernel's list of results, the output first, then three tensors
    # only its min-latency mode fills: a routed call returns a list of the same shapes.
    assert isinstance(out.result, list)
    experts, tokens = kwargs["fc2_expert_weights"].shape[0], kwargs["input"].shape[0]
    shapes = [(t.shape, t.dtype) for t in out.result[1:]]
    assert shapes == [
        ((1,), torch.int32),
        ((experts, tokens), torch.float32),
        ((experts,), torch.int32),
    ]
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
        # FlashInfer raises on a rank outside the group and on a tactic list not of two.
        ("ep_rank", 1, "ep_rank,ep_size"),
        ("profile_ids", [0], "profile_ids"),
        # A caller's buffer that is not the output's: float32 (Note [output buffers]).
        ("output", torch.zeros(6, 256), "tensor:output"),
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


def test_cutlass_fused_moe_writes_a_callers_output_buffer_and_returns_it_in_the_list(
    monkeypatch,
):
    # FlashInfer writes `output` and returns [output, ...]: so does a routed call, with a
    # value-returning solution (copied in) and a destination-passing one (handed the buffer).
    call = calls.cutlass_fused_moe(_catalogue())
    kwargs = _cutlass_required(call)
    out = torch.full((kwargs["input"].shape[0], 256), 7.0, dtype=torch.bfloat16)
    assert out.shape == kwargs["input"].shape
    routed = _route(monkeypatch, CUTLASS, call.name, (), kwargs | {"output": out})
    seen = _hit(routed)
    assert isinstance(routed.result, list) and routed.result[0] is out
    expected = _reference(call.name)(**seen)
    assert torch.equal(out, expected)

    handed = []

    def dps(output, **inputs):
        handed.append(output)
        output.copy_(_reference(call.name)(**inputs))

    out2 = torch.zeros_like(out)
    with rt.enable_apply({call.name: dps}):
        result = flashinfer.fused_moe.cutlass_fused_moe(**kwargs, output=out2)
        counts = rt.stats()[CUTLASS]
    assert counts["hit"] == 1 and handed == [out2]
    assert result[0] is out2 and torch.equal(out2, expected)


def test_cutlass_fused_moe_under_torch_compile_returns_flashinfers_list(monkeypatch):
    # The compiled path is one op writing the output; FlashInfer's list is made around it.
    call = calls.cutlass_fused_moe(_catalogue())
    kwargs = _cutlass_required(call)
    reference = _reference(call.name)
    seen = []

    def solution(**inputs):
        seen.append(inputs)
        return reference(**inputs)

    def moe(**kwargs):
        return flashinfer.fused_moe.cutlass_fused_moe(**kwargs)

    compiled = torch.compile(moe, backend="aot_eager", fullgraph=True)
    out = torch.zeros_like(kwargs["input"])
    with rt.enable_apply({call.name: solution}):
        plain = compiled(**kwargs)
        given = compiled(**kwargs, output=out)
        counts = rt.stats()[CUTLASS]
    assert counts["hit"] == 2 and len(seen) == 2
    assert isinstance(plain, list) and len(plain) == 4 and isinstance(given, list)
    expected = reference(**seen[0])
    assert torch.equal(plain[0], expected) and torch.equal(out, expected)


def test_cutlass_fused_moe_matches_flashinfers_template_reference():
    x, _ = _catalogue().inputs(calls.CUTLASS_MOE, seed=1, seq_len=6)
    expected = templates._cutlass_fused_moe_reference(**x)
    _close(_reference(calls.CUTLASS_MOE)(**x), expected)


def test_cutlass_fused_moe_reference_rounds_where_the_kernel_writes_bfloat16():
    # Note [CUTLASS MoE rounding]: token by token and slot by slot, in the kernel's order. The
    # inputs are small multiples of powers of two, so that GEMM1's float32 sums are exact in
    # any order; GEMM2's are not, and the rounding of its output to bfloat16 absorbs their
    # order here (a summation order that flipped one would show as a mismatch).
    import torch.nn.functional as F

    x, _ = _catalogue().inputs(calls.CUTLASS_MOE, seed=3, seq_len=6)
    g = torch.Generator().manual_seed(0)

    def dyadic(t: torch.Tensor, denominator: int) -> torch.Tensor:
        return (torch.randint(-8, 9, t.shape, generator=g) / denominator).to(t.dtype)

    for name, denominator in [("input", 8), ("fc1_expert_weights", 64), ("fc2_expert_weights", 64)]:
        x[name] = dyadic(x[name], denominator)
    ids, scales = x["token_selected_experts"].long(), x["token_final_scales"].float()
    w1, w2 = x["fc1_expert_weights"].float(), x["fc2_expert_weights"].float()

    def bf16(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.bfloat16).float()

    def expected(rounded: bool) -> torch.Tensor:
        r = bf16 if rounded else (lambda t: t)
        out = torch.zeros(x["input"].shape, dtype=torch.float32)
        for t in range(ids.shape[0]):
            for k in range(ids.shape[1]):
                e = int(ids[t, k])
                up, gate = r(x["input"][t].float() @ w1[e].T).chunk(2)
                out[t] += scales[t, k] * r(r(F.silu(gate) * up) @ w2[e].T)
        return out.to(torch.bfloat16)

    got = _reference(calls.CUTLASS_MOE)(**x)
    assert torch.equal(got, expected(rounded=True))
    # The roundings change the result: a float32 pipeline differs.
    assert not torch.equal(got, expected(rounded=False))


# ---------------------------------------------------------------------------------------
# trtllm_fp8_block_scale_routed_moe and trtllm_fp8_per_tensor_scale_routed_moe
# ---------------------------------------------------------------------------------------

FP8_BLOCK = "flashinfer.fused_moe.trtllm_fp8_block_scale_routed_moe"
FP8_PER_TENSOR = "flashinfer.fused_moe.trtllm_fp8_per_tensor_scale_routed_moe"


def _without_defaults(call, path: str) -> dict:
    """The call's arguments by name with every defaulted parameter left out."""
    import inspect

    from fibgen.runtime.routing import patching

    owner, attr = patching._locate(path)
    params = inspect.signature(getattr(owner, attr)).parameters
    return {
        k: v for k, v in _bound(call, path).items() if params[k].default is inspect.Parameter.empty
    }


def _packed(ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    bits = weights.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    return (ids.to(torch.int32) << 16) | bits


@pytest.mark.parametrize(
    ("path", "build"),
    [
        (FP8_BLOCK, calls.fp8_block_scale_routed_moe),
        (FP8_PER_TENSOR, calls.fp8_per_tensor_scale_routed_moe),
    ],
)
def test_routed_fp8_moe_with_flashinfers_defaults_is_routed(monkeypatch, path, build):
    call = build(_catalogue())
    kwargs = _without_defaults(call, path)
    out = _route(monkeypatch, path, call.name, (), kwargs)
    seen = _hit(out)
    assert torch.equal(seen["topk_ids"], kwargs["topk_ids"])
    assert torch.equal(out.result, _reference(call.name)(**seen))


@pytest.mark.parametrize(
    ("path", "build", "param", "value", "rule"),
    [
        (FP8_BLOCK, calls.fp8_block_scale_routed_moe, "use_shuffled_weight", True, None),
        (FP8_BLOCK, calls.fp8_block_scale_routed_moe, "weight_layout", 2, None),
        (FP8_BLOCK, calls.fp8_block_scale_routed_moe, "do_finalize", False, None),
        (FP8_BLOCK, calls.fp8_block_scale_routed_moe, "routed_scaling_factor", 2.5, None),
        (FP8_BLOCK, calls.fp8_block_scale_routed_moe, "gemm1_lora_delta", torch.zeros(1), None),
        (FP8_BLOCK, calls.fp8_block_scale_routed_moe, "activation_type", 7, None),
        (FP8_BLOCK, calls.fp8_block_scale_routed_moe, "gemm1_clamp_limit", torch.ones(8), None),
        (FP8_BLOCK, calls.fp8_block_scale_routed_moe, "valid_hidden_size", 200, None),
        (FP8_BLOCK, calls.fp8_block_scale_routed_moe, "local_num_experts", 4, None),
        (FP8_PER_TENSOR, calls.fp8_per_tensor_scale_routed_moe, "routed_scaling_factor", 2.5, None),
        (
            FP8_PER_TENSOR,
            calls.fp8_per_tensor_scale_routed_moe,
            "use_routing_scales_on_input",
            True,
            None,
        ),
        (FP8_PER_TENSOR, calls.fp8_per_tensor_scale_routed_moe, "do_finalize", False, None),
        (FP8_PER_TENSOR, calls.fp8_per_tensor_scale_routed_moe, "activation_type", 7, None),
        (
            FP8_PER_TENSOR,
            calls.fp8_per_tensor_scale_routed_moe,
            "routing_replay_out",
            torch.zeros(5, 2, dtype=torch.int16),
            None,
        ),
    ],
)
def test_routed_fp8_moe_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, path, build, param, value, rule
):
    call = build(_catalogue())
    out = _route(monkeypatch, path, call.name, (), _bound(call, path) | {param: value})
    _refused(out, rule or param)
    assert out.originals[0][param] is value


@pytest.mark.parametrize(
    ("path", "build"),
    [
        (FP8_BLOCK, calls.fp8_block_scale_routed_moe),
        (FP8_PER_TENSOR, calls.fp8_per_tensor_scale_routed_moe),
    ],
)
def test_routed_fp8_moe_with_ids_and_weights_apart_is_refused(monkeypatch, path, build):
    call = build(_catalogue())
    packed = call.args[0]
    pair = ((packed >> 16).contiguous(), torch.rand(packed.shape))
    out = _route(monkeypatch, path, call.name, (), _bound(call, path) | {"topk_ids": pair})
    # A pair has no shape to read the definition's axes from: refused before the rules.
    _refused(out, "key")


def test_fp8_block_scale_routed_matches_flashinfers_expert_computation():
    # The template's routed reference weights every expert 1 / top_k; its expert loop,
    # handed the weights topk_ids carries, is the independent computation.
    x, _ = _catalogue().inputs(calls.FP8_BLOCK_ROUTED, seed=1, seq_len=6)
    ids = (x["topk_ids"] >> 16).long()
    weights = (x["topk_ids"] & 0xFFFF).to(torch.int16).view(torch.bfloat16).float()
    expected = templates._fp8_moe_run_experts(
        x["hidden_states"],
        x["hidden_states_scale"],
        x["gemm1_weights"],
        x["gemm1_weights_scale"],
        x["gemm2_weights"],
        x["gemm2_weights_scale"],
        weights,
        ids,
        x["local_expert_offset"],
        8,
    )
    _close(_reference(calls.FP8_BLOCK_ROUTED)(**x), expected, atol=5e-2, rtol=2e-2)


def test_fp8_per_tensor_routed_undoes_flashinfers_weight_preparation():
    # FlashInfer's own preparation of bfloat16 weights (quantize, interleave, shuffle); the
    # reference on its output must be the MoE of the unprepared weights.
    import torch.nn.functional as F
    from flashinfer.fused_moe.prepare import prepare_trtllm_fp8_per_tensor_weights

    torch.manual_seed(0)
    e, h, i, t = 4, 256, 128, 6
    w1 = (torch.randn(e, 2 * i, h) / h**0.5).bfloat16()
    w2 = (torch.randn(e, h, i) / i**0.5).bfloat16()
    x = torch.randn(t, h).bfloat16()
    in_scale, mid_scale = 448.0 / x.float().abs().max().item(), 64.0
    prepared = prepare_trtllm_fp8_per_tensor_weights(
        w1,
        w2,
        hidden_states_scale_global=in_scale,
        intermediate_scale_global=mid_scale,
        num_local_experts=e,
        hidden_size=h,
        intermediate_size=i,
    )
    ids = torch.stack([torch.randperm(e)[:2] for _ in range(t)])
    weights = torch.rand(t, 2)
    topk_ids = _packed(ids, weights)
    got = _reference(calls.FP8_PER_TENSOR_ROUTED)(
        topk_ids=topk_ids,
        hidden_states=(x.float() * in_scale).to(torch.float8_e4m3fn),
        gemm1_weights=prepared["gemm1_weights"],
        output1_scales_scalar=prepared["output1_scales_scalar"],
        output1_scales_gate_scalar=prepared["output1_scales_gate_scalar"],
        gemm2_weights=prepared["gemm2_weights"],
        output2_scales_scalar=prepared["output2_scales_scalar"],
        local_expert_offset=0,
    )
    expected = torch.zeros(t, h)
    wb = weights.bfloat16().float()
    for tok in range(t):
        for k in range(2):
            up, gate = (x[tok].float() @ w1[ids[tok, k]].float().T).chunk(2)
            expected[tok] += wb[tok, k] * ((F.silu(gate) * up) @ w2[ids[tok, k]].float().T)
    # FP8 operands: compare against the output's scale.
    err = (got.float() - expected).abs().max() / expected.abs().max()
    assert err < 0.1, err


# ---------------------------------------------------------------------------------------
# trtllm_bf16_moe and trtllm_bf16_routed_moe
# ---------------------------------------------------------------------------------------

BF16 = "flashinfer.fused_moe.trtllm_bf16_moe"
BF16_ROUTED = "flashinfer.fused_moe.trtllm_bf16_routed_moe"


def test_trtllm_bf16_routed_moe_with_flashinfers_defaults_is_routed(monkeypatch):
    call = calls.trtllm_bf16_routed_moe(_catalogue())
    out = _route(monkeypatch, BF16_ROUTED, call.name, (), _without_defaults(call, BF16_ROUTED))
    seen = _hit(out)
    assert torch.equal(out.result, _reference(call.name)(**seen))


def test_trtllm_bf16_moe_default_routing_is_not_modelled(monkeypatch):
    # routing_method_type 0 (softmax over all experts, then top_k, not renormalized) has no
    # family: the call falls back, counted.
    call = calls.trtllm_bf16_moe(_catalogue())
    out = _route(monkeypatch, BF16, call.name, (), _without_defaults(call, BF16))
    assert out.counts["hit"] == 0 and not out.seen, out.counts
    assert out.result == "flashinfer" and len(out.originals) == 1


@pytest.mark.parametrize(
    ("method", "name"),
    [
        (2, calls.BF16_MOE_DS),
        (1, "trtllm_bf16_moe_renorm_topk2_e8_h256_i128"),
        (4, "trtllm_bf16_moe_renorm_topk2_e8_h256_i128"),
        (3, "trtllm_bf16_moe_llama4_topk1_e8_h256_i128"),
    ],
)
def test_trtllm_bf16_moe_routing_methods_reach_their_families(monkeypatch, method, name):
    c = _catalogue()
    x, _ = c.inputs(name, seq_len=5)
    d = c.defs[name]
    consts = dict(d.consts) | dict(d.param_values)
    num_experts, top_k = consts["num_experts"], consts["top_k"]
    local = consts.get("num_local_experts", num_experts)
    kwargs = {
        "routing_logits": x["routing_logits"].bfloat16(),
        "routing_bias": x.get("routing_bias"),
        "hidden_states": x["hidden_states"],
        "gemm1_weights": x["gemm1_weights"],
        "gemm2_weights": x["gemm2_weights"],
        "num_experts": num_experts,
        "top_k": top_k,
        "n_group": consts.get("n_group"),
        "topk_group": consts.get("topk_group"),
        "intermediate_size": 128,
        "local_expert_offset": int(x.get("local_expert_offset", 0)),
        "local_num_experts": local,
        "routing_method_type": method,
    }
    out = _route(monkeypatch, BF16, name, (), kwargs)
    seen = _hit(out)
    assert torch.equal(out.result, _reference(name)(**seen))


@pytest.mark.parametrize(
    ("path", "build", "param", "value"),
    [
        (BF16, calls.trtllm_bf16_moe, "use_shuffled_weight", False),
        (BF16, calls.trtllm_bf16_moe, "weight_layout", 0),
        (BF16, calls.trtllm_bf16_moe, "do_finalize", False),
        (BF16, calls.trtllm_bf16_moe, "activation_type", 6),
        (BF16, calls.trtllm_bf16_moe, "norm_topk_prob", False),
        (BF16, calls.trtllm_bf16_moe, "gemm1_alpha", torch.ones(8)),
        (BF16, calls.trtllm_bf16_moe, "local_num_experts", 4),
        (BF16_ROUTED, calls.trtllm_bf16_routed_moe, "use_shuffled_weight", False),
        (BF16_ROUTED, calls.trtllm_bf16_routed_moe, "routed_scaling_factor", 2.5),
        (BF16_ROUTED, calls.trtllm_bf16_routed_moe, "gemm1_lora_delta", torch.zeros(1)),
        (BF16_ROUTED, calls.trtllm_bf16_routed_moe, "gemm1_clamp_limit", torch.ones(8)),
    ],
)
def test_bf16_moe_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, path, build, param, value
):
    call = build(_catalogue())
    out = _route(monkeypatch, path, call.name, (), _bound(call, path) | {param: value})
    _refused(out, param)
    assert out.originals[0][param] is value


def test_trtllm_bf16_routed_moe_undoes_flashinfers_weight_preparation():
    import torch.nn.functional as F
    from flashinfer.fused_moe.prepare import prepare_trtllm_bf16_weights

    torch.manual_seed(0)
    e, h, i, t = 4, 256, 128, 6
    w1 = (torch.randn(e, 2 * i, h) / h**0.5).bfloat16()
    w2 = (torch.randn(e, h, i) / i**0.5).bfloat16()
    x = torch.randn(t, h).bfloat16()
    prepared = prepare_trtllm_bf16_weights(
        w1, w2, num_local_experts=e, hidden_size=h, intermediate_size=i
    )
    ids = torch.stack([torch.randperm(e)[:2] for _ in range(t)])
    weights = torch.rand(t, 2)
    got = _reference(calls.BF16_ROUTED)(
        topk_ids=_packed(ids, weights),
        hidden_states=x,
        gemm1_weights=prepared["gemm1_weights"],
        gemm2_weights=prepared["gemm2_weights"],
        local_expert_offset=0,
    )
    expected = torch.zeros(t, h)
    wb = weights.bfloat16().float()
    for tok in range(t):
        for k in range(2):
            up, gate = (x[tok].float() @ w1[ids[tok, k]].float().T).chunk(2)
            expected[tok] += wb[tok, k] * ((F.silu(gate) * up) @ w2[ids[tok, k]].float().T)
    _close(got, expected.bfloat16())


def test_trtllm_bf16_routed_moe_matches_flashinfers_expert_computation():
    x, _ = _catalogue().inputs(calls.BF16_ROUTED, seed=1, seq_len=6)
    ids = (x["topk_ids"] >> 16).long()
    weights = (x["topk_ids"] & 0xFFFF).to(torch.int16).view(torch.bfloat16).float()
    expected = templates._moe_bf16_run_experts(
        x["hidden_states"],
        _reference_helper("gemm1_weight", x["gemm1_weights"]),
        _reference_helper("gemm2_weight", x["gemm2_weights"]),
        weights,
        ids,
        local_expert_offset=int(x["local_expert_offset"]),
        E_global=8,
    )
    _close(_reference(calls.BF16_ROUTED)(**x), expected)


def _reference_helper(fn: str, w: torch.Tensor) -> torch.Tensor:
    """The reference's own un-layout of each expert's weight, stacked."""
    namespace: dict = {}
    exec(_catalogue().defs[calls.BF16_ROUTED].reference, namespace)
    return torch.stack([namespace[fn](w[e]) for e in range(w.shape[0])])


# ---------------------------------------------------------------------------------------
# trtllm_fp4_block_scale_moe and trtllm_fp4_block_scale_routed_moe (MXFP4 weights, W4A16)
# ---------------------------------------------------------------------------------------

FP4 = "flashinfer.fused_moe.trtllm_fp4_block_scale_moe"
FP4_ROUTED = "flashinfer.fused_moe.trtllm_fp4_block_scale_routed_moe"


@pytest.mark.parametrize(
    ("path", "build"),
    [
        (FP4, calls.trtllm_fp4_block_scale_moe),
        (FP4_ROUTED, calls.trtllm_fp4_block_scale_routed_moe),
    ],
)
def test_fp4_moe_routes_and_returns_flashinfers_list(monkeypatch, path, build):
    call = build(_catalogue())
    out = _route(monkeypatch, path, call.name, (), _bound(call, path))
    seen = _hit(out)
    # FlashInfer passes the packed weights and scale bytes as uint8: the solution sees them
    # as E2M1 pairs and int8 bytes, the same storage.
    assert seen["gemm1_weights"].dtype == torch.float4_e2m1fn_x2
    assert seen["gemm1_weights"].data_ptr() == _bound(call, path)["gemm1_weights"].data_ptr()
    assert isinstance(out.result, list) and len(out.result) == 1
    assert torch.equal(out.result[0], _reference(call.name)(**seen))
    # Given its `output` buffer, FlashInfer writes it and returns [output]: so does the route.
    kwargs = _bound(call, path)
    buffer = torch.zeros(kwargs["hidden_states"].shape[0], 256, dtype=torch.bfloat16)
    out = _route(monkeypatch, path, call.name, (), kwargs | {"output": buffer})
    seen = _hit(out)
    assert len(out.result) == 1 and out.result[0] is buffer
    assert torch.equal(buffer, _reference(call.name)(**seen))


@pytest.mark.parametrize(
    ("path", "build", "param", "value"),
    [
        (FP4, calls.trtllm_fp4_block_scale_moe, "hidden_states_scale", torch.ones(5, 8)),
        (FP4, calls.trtllm_fp4_block_scale_moe, "output1_scale_scalar", torch.ones(8)),
        (FP4, calls.trtllm_fp4_block_scale_moe, "do_finalize", False),
        (FP4, calls.trtllm_fp4_block_scale_moe, "activation_type", 6),
        (FP4, calls.trtllm_fp4_block_scale_moe, "norm_topk_prob", False),
        (FP4, calls.trtllm_fp4_block_scale_moe, "num_fused_shared_experts", 1),
        (FP4_ROUTED, calls.trtllm_fp4_block_scale_routed_moe, "per_token_scale", torch.ones(5)),
        (FP4_ROUTED, calls.trtllm_fp4_block_scale_routed_moe, "gemm1_lora_delta", torch.ones(1)),
        (FP4_ROUTED, calls.trtllm_fp4_block_scale_routed_moe, "valid_hidden_size", 200),
        (FP4_ROUTED, calls.trtllm_fp4_block_scale_routed_moe, "routed_scaling_factor", 2.5),
    ],
)
def test_fp4_moe_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, path, build, param, value
):
    call = build(_catalogue())
    out = _route(monkeypatch, path, call.name, (), _bound(call, path) | {param: value})
    _refused(out, param)
    assert out.originals[0][param] is value


ROUTED = sorted(path for path in calls.ROUTABLE if path.endswith("routed_moe"))
PRIMS_TS_BF16_ROUTED = "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_routed_moe"


@pytest.mark.parametrize(
    ("path", "method"),
    [(path, 3) for path in ROUTED] + [(PRIMS_TS_BF16_ROUTED, 2), (PRIMS_TS_BF16_ROUTED, 8)],
)
def test_a_given_routing_still_falls_back_on_a_method_flashinfer_refuses(monkeypatch, path, method):
    # The routing kernel checks its method before it reads the given ids: Llama 4 routing
    # needs top_k 1; Prims-TS BF16 refuses DeepSeek-V3 (2) and sigmoid (8) routing.
    call = calls.ROUTABLE[path](_catalogue())
    bound = _bound(call, path)
    assert bound["top_k"] > 1
    _hit(_route(monkeypatch, path, call.name, (), dict(bound)))
    out = _route(monkeypatch, path, call.name, (), bound | {"routing_method_type": method})
    rules = out.counts["rules"]
    assert out.counts["hit"] == 0 and "routing_method_type" in next(iter(rules)), rules
    assert out.result == "flashinfer"
