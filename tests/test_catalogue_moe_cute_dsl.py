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


# ---------------------------------------------------------------------------------------
# cute_dsl_fused_moe, W4A4 (SM100)
# ---------------------------------------------------------------------------------------

NVFP4 = "flashinfer.fused_moe.cute_dsl_fused_moe"


def test_cute_dsl_fused_moe_w4a4_with_flashinfers_defaults_is_routed(monkeypatch):
    call = calls.cute_dsl_fused_moe(_catalogue())
    bound = _bound(call, NVFP4)
    required = list(bound)[:13]  # x .. top_k
    out = _route(monkeypatch, NVFP4, call.name, (), {k: bound[k] for k in required})
    seen = _hit(out)
    # The solution sees FlashInfer's uint8 bytes as E2M1 pairs and E4M3 scales, the same
    # storage; the activation's scales [T, H / 16] whatever rank they came in.
    assert seen["w1_weight"].dtype == torch.float4_e2m1fn_x2
    assert seen["w1_weight"].data_ptr() == bound["w1_weight"].data_ptr()
    assert seen["x_sf"].shape == (5, 16) and seen["x_sf"].dtype == torch.float8_e4m3fn
    assert (seen["swiglu_alpha"], seen["swiglu_beta"]) == (1.0, 0.0)
    assert seen["swiglu_limit"] == FLOAT32_MAX
    assert torch.equal(out.result, _reference(call.name)(**seen))
    assert out.result.abs().sum() > 0


def _mma_view(logical: torch.Tensor) -> torch.Tensor:
    """[E, rows, K / 16] scales as convert_sf_to_mma_layout makes them (a strided 6-D view)."""
    from flashinfer.cute_dsl.utils import convert_sf_to_mma_layout

    e, rows, cols = logical.shape
    # The 128 x 4 swizzled storage: per 128-row, 4-column tile, rows in 4 strips of 32.
    tiles = logical.reshape(e, rows // 128, 4, 32, cols // 4, 4).permute(0, 1, 4, 3, 2, 5)
    swizzled = tiles.contiguous().reshape(e * rows, cols)
    view = convert_sf_to_mma_layout(swizzled, m=rows, k=cols * 16, num_groups=e)
    # FlashInfer's inverse and its template's unswizzle read back the logical scales.
    from flashinfer.cute_dsl.utils import convert_sf_from_mma_layout
    from flashinfer.trace.templates.gemm import _unswizzle_sf_128x4

    back = convert_sf_from_mma_layout(view, m=rows, k=cols * 16, num_groups=e)
    assert torch.equal(_unswizzle_sf_128x4(back, e * rows, cols).reshape(e, rows, cols), logical)
    return view


def test_cute_dsl_fused_moe_w4a4_reference_undoes_flashinfers_weight_preparation():
    from flashinfer.fused_moe.prepare import _interleave_linear_and_gate

    x, _ = _catalogue().inputs(calls.CUTE_DSL_W4A4, seed=5, seq_len=6)
    unpack = templates._dequantize_fp4_tensor
    # Canonical [up | gate] weights and their logical scales, taken from the generated ones.
    e4m3 = torch.float8_e4m3fn
    s1 = torch.rand(8, 256, 16, generator=torch.Generator().manual_seed(1)) * 0.015 + 0.005
    s2 = torch.rand(8, 256, 8, generator=torch.Generator().manual_seed(2)) * 0.015 + 0.005
    s1, s2 = s1.to(e4m3), s2.to(e4m3)
    w1 = x["w1_weight"].view(torch.uint8)
    w2 = x["w2_weight"].view(torch.uint8)
    # prepare_cute_dsl_weights: GEMM1 rows (and their scales) interleaved in blocks of 64.
    x["w1_weight"] = _interleave_linear_and_gate(w1, group_size=64, dim=1)
    x["w1_weight_sf"] = _mma_view(_interleave_linear_and_gate(s1.view(torch.uint8), 64, 1))
    x["w2_weight_sf"] = _mma_view(s2.view(torch.uint8))
    for k in ("w1_weight_sf", "w2_weight_sf"):
        x[k] = x[k].view(e4m3)
    x["swiglu_alpha"], x["swiglu_beta"], x["swiglu_limit"] = 1.0, 0.0, FLOAT32_MAX
    got = _reference(calls.CUTE_DSL_W4A4)(**x)
    # FlashInfer's template math (b12x's, whose GEMM2 input is quantized the same way) over
    # the canonical weights, the alphas folded into them.
    gs = x["fc2_input_scale"].reshape(1)
    hidden = unpack(x["x"].view(torch.uint8), x["x_sf"], is_ue8m0_scales=False)
    w1f = unpack(w1, s1, is_ue8m0_scales=False) * x["w1_alpha"].view(8, 1, 1)
    w2f = unpack(w2, s2, is_ue8m0_scales=False) * x["w2_alpha"].view(8, 1, 1)
    ids = x["token_selected_experts"].long()
    scales = x["token_final_scales"]
    expected = templates._b12x_moe_run_experts(hidden, w1f, w2f, scales, ids, 0, 8, "fp4", gs)
    _close(got, expected, atol=1e-3, rtol=1e-2)


@pytest.mark.parametrize(
    ("param", "value", "rule"),
    [
        ("quant_mode", "w4a16", "quant_mode"),
        ("output_dtype", torch.float16, "output_dtype"),
        ("activation_type", 6, "activation_type"),  # Relu2
        ("situ_beta", 4.0, "situ_beta"),
        ("per_token_scale", torch.ones(5), "per_token_scale"),
        ("localized_weights", [{}, {}], "localized_weights"),
    ],
)
def test_cute_dsl_fused_moe_w4a4_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, param, value, rule
):
    call = calls.cute_dsl_fused_moe(_catalogue())
    out = _route(monkeypatch, NVFP4, call.name, (), _bound(call, NVFP4) | {param: value})
    _refused(out, rule)
    assert out.originals[0][param] is value


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("quant_mode", "nvfp4"),  # the deprecated alias of w4a4
        ("use_fused_finalize", True),
        ("tactic", (128, None, None)),
        ("autotune_use_cuda_graph", True),
        ("localized_allow_nonlocalized", True),
    ],
)
def test_cute_dsl_fused_moe_w4a4_launch_options_stay_routed(monkeypatch, param, value):
    call = calls.cute_dsl_fused_moe(_catalogue())
    _hit(_route(monkeypatch, NVFP4, call.name, (), _bound(call, NVFP4) | {param: value}))


# ---------------------------------------------------------------------------------------
# cute_dsl_fused_moe_nvfp4 and CuteDslMoEWrapper.run: the W4A4 contract by other entries
# ---------------------------------------------------------------------------------------

ALIAS = "flashinfer.fused_moe.cute_dsl_fused_moe_nvfp4"
WRAPPER = "flashinfer.fused_moe.CuteDslMoEWrapper.run"


def _contract(value):
    """An IR node as plain data without source positions."""
    if isinstance(value, dict):
        return {k: _contract(v) for k, v in value.items() if not k.endswith(("span", "spans"))}
    if isinstance(value, (list, tuple)):
        return [_contract(v) for v in value]
    return value


@pytest.mark.parametrize("twin", ["cute_dsl_fused_moe_nvfp4", "cute_dsl_moe_wrapper_w4a4"])
def test_the_w4a4_entries_share_one_contract(twin):
    families = _catalogue().families
    a, b = families[twin].model_dump(), families["cute_dsl_fused_moe_w4a4"].model_dump()
    for key in ("name", "name_template", "api", "description", "rules", "inputs", "outputs"):
        a.pop(key), b.pop(key)
    assert _contract(a) == _contract(b)  # axes, reference, tolerance, instances
    # The same tensors, but for where the wrapper's values come from and its output buffer.
    strip = ("source", "target", "span", "spans")
    for key in ("inputs", "outputs"):
        ta = [
            {k: v for k, v in t.items() if k not in strip}
            for t in _contract(families[twin].model_dump()[key])
        ]
        tb = [
            {k: v for k, v in t.items() if k not in strip}
            for t in _contract(families["cute_dsl_fused_moe_w4a4"].model_dump()[key])
        ]
        assert ta == tb


def test_cute_dsl_fused_moe_nvfp4_is_routed_as_cute_dsl_fused_moe(monkeypatch):
    call = calls.cute_dsl_fused_moe_nvfp4(_catalogue())
    out = _route(monkeypatch, ALIAS, call.name, (), _bound(call, ALIAS))
    seen = _hit(out)
    assert torch.equal(out.result, _reference(call.name)(**seen))
    # The same call through cute_dsl_fused_moe reaches the same inputs.
    same = calls.cute_dsl_fused_moe(_catalogue())
    out = _route(monkeypatch, NVFP4, same.name, (), _bound(same, NVFP4))
    again = _hit(out)
    assert seen.keys() == again.keys()
    for k, v in seen.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(
                v.reshape(-1).view(torch.uint8), again[k].reshape(-1).view(torch.uint8)
            ), k
        else:
            assert v == again[k], k


def test_cute_dsl_moe_wrapper_run_reads_the_wrappers_configuration(monkeypatch):
    call = calls.cute_dsl_moe_wrapper(_catalogue())
    out = _route(monkeypatch, WRAPPER, call.name, (), _bound(call, WRAPPER))
    seen = _hit(out)
    wrapper = call.args[0]
    assert seen["swiglu_alpha"] == wrapper.swiglu_alpha == pytest.approx(1.702)
    assert seen["swiglu_limit"] == wrapper.swiglu_limit == 7.0
    assert seen["local_expert_offset"] == wrapper.local_expert_offset
    assert torch.equal(out.result, _reference(call.name)(**seen))


@pytest.mark.parametrize(
    ("attr", "value"),
    [
        ("quant_mode", "w4a8"),
        ("output_dtype", torch.float16),
        ("num_local_experts", 4),
        ("top_k", 4),
        ("activation_type", 8),
        ("situ_beta", 4.0),
    ],
)
def test_a_wrapper_configured_for_another_contract_falls_back(monkeypatch, attr, value):
    # The same call is routed with the wrapper as built (the test above); rules over the
    # wrapper are counted under `self`.
    call = calls.cute_dsl_moe_wrapper(_catalogue())
    setattr(call.args[0], attr, value)
    _refused(_route(monkeypatch, WRAPPER, call.name, (), _bound(call, WRAPPER)), "self")


def test_a_wrapper_call_with_per_token_scales_falls_back(monkeypatch):
    call = calls.cute_dsl_moe_wrapper(_catalogue())
    kwargs = _bound(call, WRAPPER) | {"per_token_scale": torch.ones(5)}
    _refused(_route(monkeypatch, WRAPPER, call.name, (), kwargs), "per_token_scale")


# ---------------------------------------------------------------------------------------
# cute_dsl_fused_moe_mxfp8_mxfp4 and CuteDslMxfp8Mxfp4MoEWrapper.run (W4A8, SM100)
# ---------------------------------------------------------------------------------------

W4A8 = "flashinfer.fused_moe.cute_dsl_fused_moe_mxfp8_mxfp4"
W4A8_WRAPPER = "flashinfer.fused_moe.CuteDslMxfp8Mxfp4MoEWrapper.run"


def test_cute_dsl_fused_moe_mxfp8_mxfp4_with_flashinfers_defaults_is_routed(monkeypatch):
    call = calls.cute_dsl_fused_moe_mxfp8_mxfp4(_catalogue())
    bound = _bound(call, W4A8)
    out = _route(monkeypatch, W4A8, call.name, (), {k: bound[k] for k in list(bound)[:12]})
    seen = _hit(out)
    assert seen["w1_weight"].dtype == torch.float4_e2m1fn_x2
    assert seen["x_sf"].data_ptr() == bound["x_sf"].data_ptr()
    assert (seen["swiglu_alpha"], seen["swiglu_beta"]) == (1.0, 0.0)
    assert seen["swiglu_limit"] == FLOAT32_MAX
    assert torch.equal(out.result, _reference(call.name)(**seen))
    assert out.result.abs().sum() > 0


def test_cute_dsl_fused_moe_mxfp8_mxfp4_reference_undoes_flashinfers_weight_preparation():
    from flashinfer.fused_moe.prepare import _interleave_linear_and_gate

    x, _ = _catalogue().inputs(calls.CUTE_DSL_W4A8, seed=7, seq_len=6)
    canonical = x["w1_weight"].view(torch.uint8)  # read as [up | gate] rows
    logical = x["w1_weight_sf"].permute(5, 2, 1, 0, 4, 3).reshape(8, 256, 8)
    # prepare_cute_dsl_weights: GEMM1 rows and their scales interleaved in blocks of 64,
    # the scales stored again in the MMA view (FlashInfer's template reads that view).
    mine = dict(x)
    mine["w1_weight"] = _interleave_linear_and_gate(canonical, group_size=64, dim=1)
    rows = _interleave_linear_and_gate(logical, group_size=64, dim=1)
    mine["w1_weight_sf"] = rows.reshape(8, 2, 4, 32, 2, 4).permute(3, 2, 1, 5, 4, 0)
    for k in ("swiglu_alpha", "swiglu_beta", "swiglu_limit"):
        mine[k] = {"swiglu_alpha": 1.0, "swiglu_beta": 0.0, "swiglu_limit": FLOAT32_MAX}[k]
    got = _reference(calls.CUTE_DSL_W4A8)(**mine)
    u8 = torch.uint8
    expected = templates._cute_dsl_fused_moe_reference(
        x["x"],
        x["x_sf"].view(u8),
        x["token_selected_experts"],
        x["token_final_scales"],
        canonical,
        x["w1_weight_sf"].view(u8),
        x["w1_alpha"],
        None,
        x["w2_weight"].view(u8),
        x["w2_weight_sf"].view(u8),
        x["w2_alpha"],
        8,
        2,
        quant_mode="w4a8",
    )
    # FlashInfer's template leaves GEMM2's input unquantized; the kernel rounds it to MXFP8
    # (three mantissa bits), which the sums over 128 features average out.
    _close(got, expected, atol=2e-3, rtol=5e-2)
    assert (got.float() - expected.float()).abs().max() > 0  # the MXFP8 rounding is there


@pytest.mark.parametrize(("param", "value"), [("activation_type", 6), ("activation_type", 8)])
def test_cute_dsl_fused_moe_mxfp8_mxfp4_other_activations_are_refused(monkeypatch, param, value):
    call = calls.cute_dsl_fused_moe_mxfp8_mxfp4(_catalogue())
    out = _route(monkeypatch, W4A8, call.name, (), _bound(call, W4A8) | {param: value})
    _refused(out, param)


def test_cute_dsl_mxfp8_mxfp4_wrapper_is_the_function_with_its_configuration(monkeypatch):
    families = _catalogue().families
    a = families["cute_dsl_mxfp8_mxfp4_moe_wrapper"].model_dump()
    b = families["cute_dsl_fused_moe_mxfp8_mxfp4"].model_dump()
    for key in ("name", "name_template", "api", "description", "rules", "inputs", "outputs"):
        a.pop(key), b.pop(key)
    assert _contract(a) == _contract(b)
    call = calls.cute_dsl_mxfp8_mxfp4_moe_wrapper(_catalogue())
    out = _route(monkeypatch, W4A8_WRAPPER, call.name, (), _bound(call, W4A8_WRAPPER))
    seen = _hit(out)
    assert seen["swiglu_alpha"] == call.args[0].swiglu_alpha
    assert seen["local_expert_offset"] == call.args[0].local_expert_offset
    assert torch.equal(out.result, _reference(call.name)(**seen))
    call.args[0].activation_type = 6  # a wrapper built for ReLU2
    _refused(_route(monkeypatch, W4A8_WRAPPER, call.name, (), _bound(call, W4A8_WRAPPER)), "self")


# ---------------------------------------------------------------------------------------
# b12x_fused_moe and B12xMoEWrapper.run, NVFP4 (SM120)
# ---------------------------------------------------------------------------------------

B12X = "flashinfer.fused_moe.b12x_fused_moe"
B12X_WRAPPER = "flashinfer.fused_moe.B12xMoEWrapper.run"


def test_b12x_fused_moe_with_flashinfers_defaults_is_routed(monkeypatch):
    call = calls.b12x_fused_moe(_catalogue())
    bound = _bound(call, B12X)
    required = ["x", "w1_weight", "w1_weight_sf", "w2_weight", "w2_weight_sf"]
    required += ["token_selected_experts", "token_final_scales", "num_experts", "top_k"]
    required += ["w1_alpha", "w2_alpha", "fc2_input_scale"]
    out = _route(monkeypatch, B12X, call.name, (), {k: bound[k] for k in required})
    seen = _hit(out)
    # SiLU (the default activation): no clamp, no beta; x quantized with w1_alpha, which is
    # also GEMM1's multiplier; one FC2 input scale for every expert.
    assert (seen["swiglu_alpha"], seen["swiglu_beta"]) == (1.0, 0.0)
    assert seen["swiglu_limit"] == FLOAT32_MAX
    assert torch.equal(seen["fc1_input_scale"], bound["w1_alpha"])
    assert torch.equal(seen["fc1_alpha"], bound["w1_alpha"])
    assert torch.equal(seen["fc2_input_scale"], bound["fc2_input_scale"].expand(8))
    assert seen["w1_weight"].dtype == torch.float4_e2m1fn_x2
    assert seen["w1_weight"].data_ptr() == bound["w1_weight"].data_ptr()
    assert torch.equal(out.result, _reference(call.name)(**seen))
    assert out.result.abs().sum() > 0


def test_b12x_fused_moe_folds_the_fc1_input_scale_into_gemm1s_multiplier(monkeypatch):
    call = calls.b12x_fused_moe(_catalogue())
    bound = _bound(call, B12X)
    seen = _hit(_route(monkeypatch, B12X, call.name, (), bound))
    igs, w1_alpha = bound["input_global_scale"], bound["w1_alpha"]
    assert torch.equal(seen["fc1_input_scale"], igs)
    assert torch.equal(seen["fc1_alpha"], w1_alpha * igs)
    assert seen["swiglu_limit"] == 7.0 and seen["swiglu_beta"] == 1.0
    # A scalar input_global_scale serves every expert.
    scalar = bound | {"input_global_scale": torch.tensor([0.5])}
    seen = _hit(_route(monkeypatch, B12X, call.name, (), scalar))
    assert torch.equal(seen["fc1_input_scale"], torch.full((8,), 0.5))
    assert torch.equal(seen["fc1_alpha"], w1_alpha * 0.5)


def _e2m1_nearest_even(block: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """FlashInfer's template quantizer's nibble codes, its ties (which it rounds to the lower
    magnitude) rounded to even as the hardware's cvt.rn.satfinite.e2m1x2 rounds them."""
    mag = block.abs()
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    odd_below = torch.tensor([False, True, False, True, False, True, False])
    idx = torch.bucketize(mag, mids)  # a tie counts as below it
    idx = torch.where(((mag.unsqueeze(-1) == mids) & odd_below).any(-1), idx + 1, idx)
    return (idx | ((block < 0).to(torch.int64) << 3)) & 0x0F


def _b12x_template_output(x: dict, s1: torch.Tensor, s2: torch.Tensor, w1: torch.Tensor):
    from flashinfer.trace.templates.quantize import _fp4_quantize_reference

    unpack = templates._dequantize_fp4_tensor
    # x as the kernel quantizes it: global scale 0.5 divides, the reference's 2.0 multiplies.
    hidden = unpack(*_fp4_quantize_reference(x["x"].float(), torch.tensor(2.0), 16), False)
    w1 = unpack(w1, s1, is_ue8m0_scales=False) * x["fc1_alpha"].view(8, 1, 1)
    w2 = unpack(x["w2_weight"].view(torch.uint8), s2, is_ue8m0_scales=False)
    w2 = w2 * x["w2_alpha"].view(8, 1, 1)
    ids, scales = x["token_selected_experts"].long(), x["token_final_scales"]
    gs2 = torch.tensor(0.5)  # the kernel's 2.0
    return templates._b12x_moe_run_experts(hidden, w1, w2, scales, ids, 0, 8, "fp4", gs2)


def test_b12x_fused_moe_reference_is_flashinfers_expert_math(monkeypatch):
    from flashinfer.trace.templates import quantize

    monkeypatch.setattr(quantize, "_fp4_e2m1_quantize_block", _e2m1_nearest_even)
    x, _ = _catalogue().inputs(calls.B12X, seed=3, seq_len=6)
    e4m3 = torch.float8_e4m3fn
    s1 = torch.rand(8, 256, 16, generator=torch.Generator().manual_seed(1)) * 0.015 + 0.005
    s2 = torch.rand(8, 256, 8, generator=torch.Generator().manual_seed(2)) * 0.015 + 0.005
    s1, s2 = s1.to(e4m3), s2.to(e4m3)
    x["w1_weight_sf"] = _mma_view(s1.view(torch.uint8)).view(e4m3)
    x["w2_weight_sf"] = _mma_view(s2.view(torch.uint8)).view(e4m3)
    x["fc1_input_scale"] = torch.full((8,), 0.5)
    x["fc2_input_scale"] = torch.full((8,), 2.0)
    x["swiglu_alpha"], x["swiglu_beta"], x["swiglu_limit"] = 1.0, 0.0, FLOAT32_MAX
    got = _reference(calls.B12X)(**x).float()
    w1 = x["w1_weight"].view(torch.uint8)
    expected = _b12x_template_output(x, s1, s2, w1).float()

    # FlashInfer's template divides by the block scale where the kernel multiplies by its
    # reciprocal, and keeps the activation in float32 where the kernel stores it in
    # bfloat16: values near a rounding midpoint quantize to either neighbour. Those flips
    # stay a few percent of the output; the wrong half as the gate, or x left unquantized,
    # are far off.
    def error(e):
        return float((got - e).abs().mean() / e.abs().mean())

    assert error(expected) < 0.06
    swapped = torch.cat([w1[:, 128:], w1[:, :128]], dim=1)
    assert error(_b12x_template_output(x, s1, s2, swapped).float()) > 0.5
    unquantized = templates._b12x_moe_run_experts(
        x["x"].float() * 2.0,
        templates._dequantize_fp4_tensor(w1, s1, False) * x["fc1_alpha"].view(8, 1, 1),
        templates._dequantize_fp4_tensor(x["w2_weight"].view(torch.uint8), s2, False)
        * x["w2_alpha"].view(8, 1, 1),
        x["token_final_scales"],
        x["token_selected_experts"].long(),
        0,
        8,
        "fp4",
        torch.tensor(0.5),
    )
    assert error(unquantized.float()) > 0.12


def test_b12x_fused_moe_skips_unrouted_slots():
    x, _ = _catalogue().inputs(calls.B12X, seed=4, seq_len=4)
    ref = _reference(calls.B12X)
    full = ref(**x)
    x["token_selected_experts"][1] = -1  # token 1: every slot unrouted
    x["token_selected_experts"][2, 1] = -1  # token 2: its second slot
    out = ref(**x)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(out[[0, 3]], full[[0, 3]]) and not torch.equal(out[2], full[2])


@pytest.mark.parametrize(
    ("param", "value", "rule"),
    [
        ("quant_mode", "mxfp4", "activation_precision,quant_mode"),
        ("quant_mode", "w4a16", "activation_precision,quant_mode"),
        ("expert_map", torch.arange(8, dtype=torch.int32), "expert_map"),
        ("num_local_experts", 4, "num_local_experts,num_experts"),
        ("output_dtype", torch.float16, "output_dtype"),
        ("source_format", "compressed_tensors", "source_format"),
        ("activation", "gelu_tanh", "activation"),
        ("activation", "relu2", "activation"),
        ("swiglu_limit", None, "swiglu_limit"),
        ("fc2_input_scale", None, "fc2_input_scale"),
    ],
)
def test_b12x_fused_moe_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, param, value, rule
):
    call = calls.b12x_fused_moe(_catalogue())
    out = _route(monkeypatch, B12X, call.name, (), _bound(call, B12X) | {param: value})
    _refused(out, rule)


def test_b12x_fused_moe_in_bf16_precision_is_refused(monkeypatch):
    call = calls.b12x_fused_moe(_catalogue())
    kwargs = _bound(call, B12X) | {"quant_mode": None, "activation_precision": "bf16"}
    _refused(_route(monkeypatch, B12X, call.name, (), kwargs), "activation_precision,quant_mode")
    kwargs["activation_precision"] = "fp4"
    _hit(_route(monkeypatch, B12X, call.name, (), kwargs))


def test_b12x_wrapper_is_the_function_with_its_configuration(monkeypatch):
    families = _catalogue().families
    a = families["b12x_moe_wrapper_nvfp4"].model_dump()
    b = families["b12x_fused_moe_nvfp4"].model_dump()
    for key in ("name", "name_template", "api", "description", "rules", "inputs", "outputs"):
        a.pop(key), b.pop(key)
    assert _contract(a) == _contract(b)
    call = calls.b12x_moe_wrapper(_catalogue())
    out = _route(monkeypatch, B12X_WRAPPER, call.name, (), _bound(call, B12X_WRAPPER))
    seen = _hit(out)
    wrapper = call.args[0]
    assert seen["swiglu_alpha"] == pytest.approx(wrapper.swiglu_alpha)
    assert seen["swiglu_limit"] == wrapper.swiglu_limit == 7.0
    assert torch.equal(out.result, _reference(call.name)(**seen))
    # The function, given what the wrapper holds, computes the same.
    same = calls.b12x_fused_moe(_catalogue())
    again = _hit(_route(monkeypatch, B12X, same.name, (), _bound(same, B12X)))
    assert seen.keys() == again.keys()
    for k, v in seen.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v.view(torch.uint8), again[k].view(torch.uint8)), k
        else:
            assert v == again[k], k


@pytest.mark.parametrize(
    ("attr", "value", "rule"),
    [
        ("quant_mode", "mxfp4", "self"),
        ("num_local_experts", 4, "self"),
        ("top_k", 4, "self"),
        ("expert_map", torch.arange(8, dtype=torch.int32), "self"),
        ("output_dtype", torch.float16, "self"),
        ("activation", "relu2", "self"),
        ("swiglu_limit", None, "swiglu_limit"),
    ],
)
def test_a_b12x_wrapper_configured_for_another_contract_falls_back(monkeypatch, attr, value, rule):
    call = calls.b12x_moe_wrapper(_catalogue())
    setattr(call.args[0], attr, value)
    _refused(_route(monkeypatch, B12X_WRAPPER, call.name, (), _bound(call, B12X_WRAPPER)), rule)
