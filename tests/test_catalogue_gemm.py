"""The GEMM families (gemm_bf16.fidef, gemm_fp8.fidef) against the real FlashInfer.

FlashInfer 0.7.2.post1 is installed; its GEMM kernels need a GPU, so its functions are never
run here. For each API the real function is replaced by a recorder with its signature before
apply is enabled, and each check calls the patched API:

- a call with FlashInfer's defaults is routed, and the solution sees the definition's inputs;
- each ruled parameter at a non-default value is routed (a layout the rules convert, an
  ignored launch option) or refused with its rule counted, and then reaches FlashInfer's
  function unchanged;
- the reference agrees with an independent computation: the reference of FlashInfer's own
  trace template, or FlashInfer's own weight preparation undone.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from _shared import catalogue_module, require_module, strided

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _gemm_moe_calls as calls
import _routable_calls as routable
from flashinfer.trace.templates import attention as attention_templates
from flashinfer.trace.templates import gemm as templates
from flashinfer.trace.templates import page as page_templates

import fibgen.runtime as rt
from fibgen.compiler import compile_paths
from fibgen.runtime.routing import patching

ROOT = Path(__file__).resolve().parents[1]
# Slow as a whole: GEMM calls through the real FlashInfer's API.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning"),
]


@functools.cache
def _catalogue():
    return routable.Catalogue(catalogue_module())


@functools.cache
def _reference(name: str):
    namespace: dict = {}
    exec(_catalogue().defs[name].reference, namespace)
    return namespace["run"]


@pytest.fixture(autouse=True)
def _off():
    yield
    rt.disable_apply()


@dataclass
class Outcome:
    result: Any
    seen: list  # the inputs each solution call got
    originals: list  # the arguments FlashInfer's function got, as its signature binds them
    counts: dict


def _recorder(real, calls_):
    sig = inspect.signature(real)

    def original(*args, **kwargs):
        calls_.append(sig.bind(*args, **kwargs).arguments)
        return "flashinfer"

    original.__signature__ = sig
    return original


def _route(monkeypatch, path: str, name: str, args: tuple, kwargs: dict) -> Outcome:
    """Call the patched API with a solution for ``name`` that runs the reference."""
    owner, attr = patching._locate(path)
    originals: list = []
    monkeypatch.setattr(owner, attr, _recorder(getattr(owner, attr), originals))
    seen: list = []
    ref = _reference(name)

    def solution(**inputs):
        seen.append(inputs)
        return ref(**inputs)

    rt.enable_apply({name: solution})
    result = getattr(owner, attr)(*args, **kwargs)
    counts = rt.stats()[path]
    rt.disable_apply()
    return Outcome(result, seen, originals, counts)


def _hit(outcome: Outcome) -> dict:
    assert outcome.counts["hit"] == 1 and len(outcome.seen) == 1, outcome.counts
    assert not outcome.originals
    return outcome.seen[0]


def _refused(outcome: Outcome, rule: str | None) -> None:
    """Not routed: a rule failed (counted by name), or with ``rule`` None, the call names a
    definition nothing serves."""
    assert outcome.counts["hit"] == 0 and not outcome.seen, outcome.counts
    if rule is None:
        assert outcome.counts["fallback_no_candidate"] == 1, outcome.counts
    else:
        assert outcome.counts["fallback_guard"] == 1, outcome.counts
        assert outcome.counts["rules"] == {rule: 1}, outcome.counts
    assert outcome.result == "flashinfer" and len(outcome.originals) == 1


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 2e-2, rtol: float = 1e-2) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol)


def _bound(call, path: str) -> dict:
    """The call's arguments by name, as the real signature binds them."""
    owner, attr = patching._locate(path)
    return inspect.signature(getattr(owner, attr)).bind(*call.args, **call.kwargs).arguments


MM_BF16_FP4_PATH = "flashinfer.gemm.gemm_bf16_fp4.mm_bf16_fp4"
MASKED_PATH = "flashinfer.gemm.kernels.grouped_gemm_masked_wrapper.grouped_gemm_nt_masked"

# Parameters with a default that the FP8 mode of an API still needs given.
SCALES = {"flashinfer.gemm.fp8_blockscale_gemm_sm90": ("input_scale", "weight_scale")}


def _required(call, path: str) -> tuple[tuple, dict]:
    """The call's arguments with every defaulted parameter left out: FlashInfer's defaults."""
    owner, attr = patching._locate(path)
    params = inspect.signature(getattr(owner, attr)).parameters
    keep = SCALES.get(path, ())
    bound = _bound(call, path)
    kept = {
        k: v for k, v in bound.items() if params[k].default is inspect.Parameter.empty or k in keep
    }
    return (), kept


# ---------------------------------------------------------------------------------------
# Calls with FlashInfer's defaults are routed, and the solution's result is returned
# ---------------------------------------------------------------------------------------

# The APIs whose defaults a definition serves (the others need a rule-accepted value).
DEFAULTS_ROUTE = [
    "flashinfer.gemm.mm_bf16",
    "flashinfer.gemm.bmm_bf16",
    "flashinfer.gemm.tinygemm_bf16",
    "flashinfer.gemm.mm_M1_16_K7168_N256",
    "flashinfer.gemm.mm_M1_16_K6144_N256",
    "flashinfer.gemm.tgv_gemm_sm100",
    "flashinfer.gemm.mm_fp8",
    "flashinfer.gemm.bmm_fp8",
    "flashinfer.gemm.group_gemm_fp8_nt_groupwise_contiguous",
    "flashinfer.gemm.batch_deepgemm_fp8_nt_groupwise",
    "flashinfer.gemm.fp8_blockscale_gemm_sm90",
    "flashinfer.gemm.mm_fp4",
    "flashinfer.gemm.mm_mxfp8",
    "flashinfer.gemm.bmm_mxfp8",
    "flashinfer.gemm.gemm_bf16_fp4.mm_bf16_fp4",
]


@pytest.mark.parametrize("path", DEFAULTS_ROUTE)
def test_a_call_with_flashinfers_defaults_is_routed(path, monkeypatch):
    call = calls.ROUTABLE[path](_catalogue())
    args, kwargs = _required(call, path)
    out = _route(monkeypatch, path, call.name, args, kwargs)
    seen = _hit(out)
    expected = _reference(call.name)(**seen)
    # In-place APIs (out given) get the result in out; the others return it.
    result = out.result if isinstance(out.result, torch.Tensor) else kwargs["out"]
    assert torch.equal(result, expected)


def test_the_groupwise_gemms_default_scale_mode_is_refused(monkeypatch):
    # scale_major_mode None with the cutlass backend: FlashInfer's default is not a layout
    # the definition models, so the call reaches FlashInfer.
    path = "flashinfer.gemm.gemm_fp8_nt_groupwise"
    x, _ = _catalogue().inputs(calls.GROUPWISE, M=4)
    args = (x["a"], x["b"], x["a_scale"], x["b_scale"])
    _refused(_route(monkeypatch, path, calls.GROUPWISE, args, {}), "scale_major_mode")


def test_fp8_blockscale_gemm_sm90_with_bfloat16_operands_is_refused(monkeypatch):
    # Its other mode quantizes bfloat16 operands inside the kernel: another contract.
    path = "flashinfer.gemm.fp8_blockscale_gemm_sm90"
    x, _ = _catalogue().inputs(calls.SM90, M=3)
    out = _route(monkeypatch, path, calls.SM90, (x["input"].bfloat16(), x["weight"]), {})
    assert out.counts["hit"] == 0 and out.counts["fallback_guard"] == 1, out.counts
    # The missing scale's shape cannot be read: the guard counts the call as unevaluable.
    assert out.counts["rules"] == {"unevaluable": 1}, out.counts
    assert out.result == "flashinfer" and len(out.originals) == 1


def test_fp8_blockscale_gemm_sm90_routes_only_the_scale_layout_its_kernel_reads(monkeypatch):
    # Note [blockscale input scales]: FlashInfer 0.7.2's kernel reads input_scale as
    # M-major memory with M padded to a multiple of 4, whatever the strides; the row-major
    # tensor of its docstring gives another result on an H100, so such calls go to it.
    path = "flashinfer.gemm.fp8_blockscale_gemm_sm90"
    x, _ = _catalogue().inputs(calls.SM90, M=3)
    scale = x["input_scale"]
    for laid_out in (scale, scale.T.contiguous().T):  # row-major; M-major, M not padded
        args = (x["input"], x["weight"], laid_out, x["weight_scale"])
        _refused(_route(monkeypatch, path, calls.SM90, args, {}), "input_scale")
    aligned = calls.tma_aligned(scale)
    assert aligned.stride() == (1, 4) and torch.equal(aligned, scale)
    strided_weight = x["weight_scale"].T.contiguous().T
    args = (x["input"], x["weight"], aligned, strided_weight)
    _refused(_route(monkeypatch, path, calls.SM90, args, {}), "weight_scale")
    args = (x["input"], x["weight"], aligned, x["weight_scale"])
    out = _route(monkeypatch, path, calls.SM90, args, {})
    seen = _hit(out)
    expected = _reference(calls.SM90)(**(seen | {"input_scale": scale}))
    assert torch.equal(out.result, expected)


def test_mm_bf16_hands_the_solution_the_column_major_weight_as_given(monkeypatch):
    path = "flashinfer.gemm.mm_bf16"
    c = _catalogue()
    x, _ = c.inputs(calls.MM_BF16, M=3)
    weight = torch.randn(2048, 512).to(torch.bfloat16)  # [N, K], as a checkpoint holds it
    out = _route(monkeypatch, path, calls.MM_BF16, (x["A"], weight.T), {})
    seen = _hit(out)
    assert seen["B"].data_ptr() == weight.data_ptr() and seen["B"].shape == (512, 2048)
    _close(out.result, torch.nn.functional.linear(x["A"].float(), weight.float()).bfloat16())


# ---------------------------------------------------------------------------------------
# Each ruled parameter at a non-default value
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "param", "value", "rule"),
    [
        ("flashinfer.gemm.mm_bf16", "out_dtype", torch.float16, "out_dtype"),
        ("flashinfer.gemm.bmm_bf16", "out_dtype", torch.float16, "out_dtype"),
        ("flashinfer.gemm.tgv_gemm_sm100", "a_descale", torch.ones(1), "a_descale"),
        ("flashinfer.gemm.tgv_gemm_sm100", "b_descale", torch.ones(1), "b_descale"),
        ("flashinfer.gemm.mm_fp8", "out_dtype", torch.float16, "out_dtype"),
        ("flashinfer.gemm.bmm_fp8", "dtype", torch.float16, "dtype"),
        ("flashinfer.gemm.gemm_fp8_nt_groupwise", "backend", "trtllm", "backend"),
        (
            "flashinfer.gemm.gemm_fp8_nt_groupwise",
            "scale_granularity_mnk",
            (1, 128, 64),
            "scale_granularity_mnk",
        ),
        ("flashinfer.gemm.gemm_fp8_nt_groupwise", "out_dtype", torch.float16, "out_dtype"),
        (
            "flashinfer.gemm.group_gemm_fp8_nt_groupwise_contiguous",
            "scale_granularity_mnk",
            (1, 128, 64),
            "scale_granularity_mnk",
        ),
        (
            "flashinfer.gemm.group_gemm_fp8_nt_groupwise_contiguous",
            "out_dtype",
            torch.float16,
            "out_dtype",
        ),
        (
            "flashinfer.gemm.batch_deepgemm_fp8_nt_groupwise",
            "scale_granularity_mnk",
            (1, 128, 64),
            "scale_granularity_mnk",
        ),
        ("flashinfer.gemm.fp8_blockscale_gemm_sm90", "out_dtype", torch.float16, "out_dtype"),
        ("flashinfer.gemm.mm_fp4", "use_nvfp4", False, "use_nvfp4"),
        ("flashinfer.gemm.mm_fp4", "block_size", 32, "block_size"),
        ("flashinfer.gemm.mm_fp4", "use_8x4_sf_layout", True, "use_8x4_sf_layout"),
        ("flashinfer.gemm.mm_fp4", "out_dtype", torch.float16, "out_dtype"),
        ("flashinfer.gemm.mm_fp4", "backend", "trtllm", "backend"),
        ("flashinfer.gemm.mm_fp4", "backend", "cute-dsl", "backend"),
        ("flashinfer.gemm.mm_fp4", "alpha", torch.ones(3), "alpha"),
        ("flashinfer.gemm.mm_mxfp8", "use_8x4_sf_layout", True, "use_8x4_sf_layout"),
        ("flashinfer.gemm.mm_mxfp8", "out_dtype", torch.float16, "out_dtype"),
        ("flashinfer.gemm.mm_mxfp8", "backend", "trtllm", "backend"),
        ("flashinfer.gemm.bmm_mxfp8", "dtype", torch.float16, "dtype"),
        (MM_BF16_FP4_PATH, "backend", "blackwell-tiled", "backend"),
        (MM_BF16_FP4_PATH, "block_size", 32, "block_size"),
        (MM_BF16_FP4_PATH, "out_dtype", torch.float16, "out_dtype"),
        (MM_BF16_FP4_PATH, "alpha", torch.ones(3), "alpha"),
    ],
)
def test_parameters_the_definition_does_not_model_are_refused(
    path, param, value, rule, monkeypatch
):
    call = calls.ROUTABLE[path](_catalogue())
    kwargs = _bound(call, path)
    if "out" in kwargs and param in ("out_dtype", "dtype"):
        kwargs["out"] = None
    out = _route(monkeypatch, path, call.name, (), kwargs | {param: value})
    _refused(out, rule)
    assert out.originals[0][param] is value


@pytest.mark.parametrize(
    "path",
    [
        "flashinfer.gemm.gemm_fp8_nt_groupwise",
        "flashinfer.gemm.group_gemm_fp8_nt_groupwise_contiguous",
        "flashinfer.gemm.batch_deepgemm_fp8_nt_groupwise",
        "flashinfer.gemm.fp8_blockscale_gemm_sm90",
    ],
)
def test_a_float16_out_buffer_is_refused(path, monkeypatch):
    call = calls.ROUTABLE[path](_catalogue())
    kwargs = dict(call.kwargs)
    kwargs["out"] = kwargs["out"].to(torch.float16)
    if "out_dtype" in kwargs:
        kwargs["out_dtype"] = None
    out = _route(monkeypatch, path, call.name, call.args, kwargs)
    assert out.counts["hit"] == 0 and out.counts["fallback_guard"] == 1, out.counts
    assert out.result == "flashinfer"


@pytest.mark.parametrize(
    ("path", "param", "value"),
    [
        ("flashinfer.gemm.mm_bf16", "pdl", False),
        ("flashinfer.gemm.mm_bf16", "backend", "tgv"),
        ("flashinfer.gemm.bmm_bf16", "backend", "cudnn"),
        ("flashinfer.gemm.tinygemm_bf16", "use_pdl", False),
        ("flashinfer.gemm.tinygemm_bf16", "bias", None),
        ("flashinfer.gemm.mm_M1_16_K7168_N256", "launch_with_pdl", True),
        ("flashinfer.gemm.tgv_gemm_sm100", "pdl", False),
        ("flashinfer.gemm.mm_fp8", "alpha", None),
        ("flashinfer.gemm.mm_fp8", "backend", "trtllm_low_latency"),
        ("flashinfer.gemm.bmm_fp8", "backend", "cutlass"),
        ("flashinfer.gemm.gemm_fp8_nt_groupwise", "mma_sm", 1),
        ("flashinfer.gemm.gemm_fp8_nt_groupwise", "backend", "cutile"),
        ("flashinfer.gemm.group_gemm_fp8_nt_groupwise_contiguous", "validate_indices", False),
        ("flashinfer.gemm.batch_deepgemm_fp8_nt_groupwise", "expected_m", 64),
        ("flashinfer.gemm.batch_deepgemm_fp8_nt_groupwise", "backend", "cutlass"),
        ("flashinfer.gemm.fp8_blockscale_gemm_sm90", "out_dtype", None),
        ("flashinfer.gemm.mm_fp4", "enable_pdl", True),
        ("flashinfer.gemm.mm_fp4", "backend", "cudnn"),
        ("flashinfer.gemm.mm_fp4", "alpha", None),
        ("flashinfer.gemm.mm_mxfp8", "backend", "cudnn"),
        ("flashinfer.gemm.mm_mxfp8", "backend", "auto"),
        (MM_BF16_FP4_PATH, "backend", "blackwell-native"),
        (MM_BF16_FP4_PATH, "alpha", None),
    ],
)
def test_launch_options_and_accepted_values_stay_routed(path, param, value, monkeypatch):
    call = calls.ROUTABLE[path](_catalogue())
    bound = _bound(call, path)
    bound[param] = value
    out = _route(monkeypatch, path, call.name, (), bound)
    seen = _hit(out)
    expected = _reference(call.name)(**seen)
    result = out.result if isinstance(out.result, torch.Tensor) else bound["out"]
    assert torch.equal(result, expected)


@pytest.mark.parametrize(
    ("path", "position", "layout", "rule"),
    [
        # FlashInfer documents B as [K, N] column-major; its kernel reads it K-contiguous.
        ("flashinfer.gemm.tgv_gemm_sm100", 1, "row_major", "b"),
        ("flashinfer.gemm.tgv_gemm_sm100", 0, "strided", "a"),
        # The CUTLASS kernel takes bare pointers: dense A, B and scales.
        ("flashinfer.gemm.gemm_fp8_nt_groupwise", 1, "strided", "a,b"),
        ("flashinfer.gemm.gemm_fp8_nt_groupwise", 2, "strided", "a_scale,b_scale"),
    ],
)
def test_operands_in_a_layout_the_kernel_does_not_read_fall_back(
    path, position, layout, rule, monkeypatch
):
    call = calls.ROUTABLE[path](_catalogue())
    args = list(call.args)
    t = args[position]
    if layout == "row_major":
        args[position] = t.contiguous()
    else:
        args[position] = strided(t)
    assert torch.equal(args[position].float(), t.float())
    _refused(_route(monkeypatch, path, call.name, tuple(args), call.kwargs), rule)


def test_a_biased_mm_bf16_goes_to_the_bias_family(monkeypatch):
    path = "flashinfer.gemm.mm_bf16"
    c = _catalogue()
    x, _ = c.inputs(calls.MM_BF16_BIAS, M=3)
    out = _route(monkeypatch, path, calls.MM_BF16_BIAS, (x["A"], x["B"]), {"bias": x["bias"]})
    seen = _hit(out)
    assert torch.equal(seen["bias"], x["bias"])
    expected = (x["A"].float() @ x["B"].float() + x["bias"].float()).bfloat16()
    assert torch.equal(out.result, expected)


def test_a_biased_mm_bf16_is_refused_by_the_unbiased_family(monkeypatch):
    path = "flashinfer.gemm.mm_bf16"
    call = calls.mm_bf16(_catalogue())
    out = _route(monkeypatch, path, call.name, call.args, call.kwargs | {"bias": torch.ones(2048)})
    _refused(out, "bias")


def test_mm_fp8_backends_choose_the_weight_layout(monkeypatch):
    # cuBLAS takes the [N, K] weight as quantized; on a prepared 3-D weight the
    # low-latency family's backend rule refuses it.
    path = "flashinfer.gemm.mm_fp8"
    call = calls.mm_fp8(_catalogue())
    out = _route(monkeypatch, path, call.name, call.args, call.kwargs | {"backend": "cublas"})
    assert out.counts["hit"] == 0 and out.counts["fallback_guard"] == 1, out.counts
    assert out.result == "flashinfer"
    c = _catalogue()
    x, _ = c.inputs(calls.MM_FP8_PER_TENSOR, M=3)
    out = _route(
        monkeypatch,
        path,
        calls.MM_FP8_PER_TENSOR,
        (x["A"], x["B"]),
        {"alpha": x["alpha"].reshape(1), "backend": "cublas"},
    )
    seen = _hit(out)
    assert seen["alpha"].shape == ()
    expected = (x["A"].float() @ x["B"].float().T * x["alpha"]).bfloat16()
    assert torch.equal(out.result, expected)


def test_groupwise_k_major_scales_reach_the_solution_unchanged(monkeypatch):
    path = "flashinfer.gemm.gemm_fp8_nt_groupwise"
    c = _catalogue()
    x, _ = c.inputs(calls.GROUPWISE, M=4)
    args = (x["a"], x["b"], x["a_scale"], x["b_scale"])
    out = _route(monkeypatch, path, calls.GROUPWISE, args, {"scale_major_mode": "K"})
    seen = _hit(out)
    assert seen["a_scale"] is x["a_scale"] and seen["b_scale"] is x["b_scale"]


def test_groupwise_mn_major_scales_reach_the_solution_k_major(monkeypatch):
    path = "flashinfer.gemm.gemm_fp8_nt_groupwise"
    call = calls.gemm_fp8_nt_groupwise(_catalogue())
    out = _route(monkeypatch, path, call.name, call.args, call.kwargs)
    seen = _hit(out)
    assert torch.equal(seen["a_scale"], call.args[2].T) and torch.equal(
        seen["b_scale"], call.args[3].T
    )


def test_segment_gemm_takes_lengths_or_indptr_and_either_weight_layout(monkeypatch):
    path = "flashinfer.gemm.SegmentGEMMWrapper.run"
    call = calls.segment_gemm(_catalogue())
    wrapper, x, weights_nk, batch_size, _ = call.args
    indptr, indices = call.kwargs["seg_indptr"], call.kwargs["weight_indices"]
    expected = _reference(call.name)(
        x=x, weights=weights_nk.transpose(-1, -2), seg_indptr=indptr, weight_indices=indices
    )
    # Lengths only, row-major [num_weights, K, N] weights.
    kwargs = {"seg_lens": indptr.diff(), "weight_indices": indices}
    args = (wrapper, x, weights_nk.transpose(-1, -2).contiguous(), batch_size, False)
    out = _route(monkeypatch, path, call.name, args, kwargs)
    seen = _hit(out)
    assert torch.equal(seen["seg_indptr"], indptr)
    assert torch.equal(out.result, expected)
    # Indptr only, column-major weights.
    kwargs = {"seg_indptr": indptr, "weight_indices": indices}
    out = _route(monkeypatch, path, call.name, call.args[:5], kwargs)
    _hit(out)
    assert torch.equal(out.result, expected)


def test_segment_gemm_with_a_batch_size_that_is_not_the_segments_is_refused(monkeypatch):
    path = "flashinfer.gemm.SegmentGEMMWrapper.run"
    call = calls.segment_gemm(_catalogue())
    args = (*call.args[:3], 3, call.args[4])
    _refused(_route(monkeypatch, path, call.name, args, call.kwargs), "batch_size,seg_indptr")


def test_a_router_gemm_of_more_than_16_rows_is_refused(monkeypatch):
    path = "flashinfer.gemm.mm_M1_16_K7168_N256"
    a = torch.randn(17, 7168).to(torch.bfloat16)
    b = torch.randn(7168, 256).to(torch.bfloat16)
    out = _route(monkeypatch, path, calls.ROUTER_7168, (a, b, torch.empty(17, 256)), {})
    _refused(out, "mat_a")
    # 16 rows are served.
    out = _route(monkeypatch, path, calls.ROUTER_7168, (a[:16], b, torch.empty(16, 256)), {})
    _hit(out)


# ---------------------------------------------------------------------------------------
# The references agree with FlashInfer's own
# ---------------------------------------------------------------------------------------


def _inputs(name: str, **axes):
    return _catalogue().inputs(name, seed=1, **axes)


def test_gemm_bf16_matches_flashinfers_template_reference():
    x, _ = _inputs(calls.MM_BF16, M=5)
    _close(_reference(calls.MM_BF16)(**x), templates._mm_reference(x["A"], x["B"]))


def test_bmm_bf16_matches_flashinfers_template_reference():
    x, _ = _inputs(calls.BMM_BF16, batch_size=2, M=3)
    _close(_reference(calls.BMM_BF16)(**x), templates._bmm_reference(x["A"], x["B"]))


@pytest.mark.parametrize("with_bias", [True, False])
def test_tinygemm_matches_flashinfers_template_reference(with_bias):
    x, axes = _inputs(calls.TINYGEMM, M=3)
    if not with_bias:
        x["bias"] = None
    out = torch.empty(axes["M"], axes["N"], dtype=torch.bfloat16)
    templates._tinygemm_bf16_reference(x["input"], x["weight"], out, bias=x["bias"])
    assert torch.equal(_reference(calls.TINYGEMM)(**x), out)


@pytest.mark.parametrize(
    ("name", "template"),
    [
        (calls.ROUTER_7168, templates._mm_M1_16_K7168_N256_reference),
        (calls.ROUTER_6144, templates._mm_M1_16_K6144_N256_reference),
    ],
)
def test_router_gemms_match_flashinfers_template_references(name, template):
    x, axes = _inputs(name, M=7)
    out = torch.empty(axes["M"], axes["N"], dtype=torch.float32)
    template(x["mat_a"], x["mat_b"], out)
    torch.testing.assert_close(_reference(name)(**x), out)


def test_tgv_gemm_matches_flashinfers_template_reference():
    x, _ = _inputs(calls.TGV, M=3)
    expected = page_templates._tgv_gemm_sm100_reference(x["a"], x["b"], x["bias"])
    assert torch.equal(_reference(calls.TGV)(**x), expected)


def test_segment_gemm_matches_flashinfers_template_reference():
    # The template's reference takes segment i to weight i (no weight_indices).
    x, _ = _inputs(calls.SEGMENT, total_rows=9, num_weights=3, batch_size=3, len_indptr=4)
    x["weight_indices"] = None
    expected = attention_templates._segment_gemm_run_reference(
        x["x"], x["weights"], seg_indptr=x["seg_indptr"]
    )
    assert torch.equal(_reference(calls.SEGMENT)(**x), expected)


def test_gemm_fp8_undoes_flashinfers_low_latency_weight_preparation():
    # FlashInfer's own preparation (pure torch) of an [N, K] weight; the reference must
    # compute A @ W.T from the prepared tensor.
    from flashinfer import prepare_low_latency_gemm_weights

    weight = (torch.randn(256, 384) * 0.5).to(torch.float8_e4m3fn)
    a = (torch.randn(3, 384) * 0.5).to(torch.float8_e4m3fn)
    prepared = prepare_low_latency_gemm_weights(weight, {})
    assert prepared.shape == (3, 256, 128)
    alpha = torch.tensor(0.75)
    expected = (a.float() @ weight.float().T * 0.75).bfloat16()
    assert torch.equal(_reference(calls.MM_FP8)(A=a, B=prepared, alpha=alpha), expected)
    unscaled = (a.float() @ weight.float().T).bfloat16()
    assert torch.equal(_reference(calls.MM_FP8)(A=a, B=prepared, alpha=None), unscaled)


def test_bmm_fp8_matches_flashinfers_template_reference():
    x, _ = _inputs(calls.BMM_FP8, batch_size=2, M=3)
    expected = templates._bmm_fp8_reference(
        x["A"], x["B"], x["A_scale"], x["B_scale"], torch.bfloat16
    )
    _close(_reference(calls.BMM_FP8)(**x), expected)


def test_gemm_fp8_nt_groupwise_matches_flashinfers_template_reference():
    x, _ = _inputs(calls.GROUPWISE, M=4)
    expected = templates._gemm_fp8_nt_groupwise_reference(
        x["a"], x["b"], x["a_scale"], x["b_scale"]
    )
    _close(_reference(calls.GROUPWISE)(**x), expected)


def test_gemm_fp8_nt_groupwise_scales_a_partial_last_tile_row():
    # N = 2112 is not a multiple of 128: the last row of weight tiles covers 64 rows.
    name = "gemm_fp8_nt_groupwise_n2112_k7168"
    a = (torch.randn(2, 7168) * 0.5).to(torch.float8_e4m3fn)
    b = (torch.randn(2112, 7168) * 0.5).to(torch.float8_e4m3fn)
    a_scale = torch.rand(2, 56) + 0.5
    b_scale = torch.rand(17, 56) + 0.5
    expected = templates._gemm_fp8_nt_groupwise_reference(a, b, a_scale, b_scale)
    _close(_reference(name)(a=a, b=b, a_scale=a_scale, b_scale=b_scale), expected, atol=0.5)


def test_group_gemm_fp8_matches_flashinfers_template_reference():
    x, _ = _inputs(calls.GROUPED, M=8)
    x["m_indices"] = x["m_indices"].sort().values
    expected = templates._group_gemm_fp8_nt_groupwise_contiguous_reference(**x)
    assert torch.equal(_reference(calls.GROUPED)(**x), expected)


def _as_sm100_reads(scale: torch.Tensor) -> torch.Tensor:
    """The scales DeepGEMM's SM100 kernel reads: FlashInfer's own conversion to packed UE8M0
    bytes (four per int32 along K), each byte e read as 2 ** (e - 127)."""
    from flashinfer.deep_gemm import get_col_major_tma_aligned_packed_tensor

    packed = get_col_major_tma_aligned_packed_tensor(scale.float())
    k = scale.shape[-1]
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int32)
    e = ((packed.unsqueeze(-1) >> shifts) & 0xFF).flatten(-2)[..., :k]
    return torch.ldexp(torch.ones_like(scale, dtype=torch.float32), e.int() - 127)


def test_batch_deepgemm_matches_flashinfers_template_reference_on_the_scales_sm100_reads():
    # FlashInfer's template reference multiplies by the float32 scales; its SM100 kernels read
    # each as the power of two below it (Note [DeepGEMM's power-of-two scales]).
    x, _ = _inputs(calls.DEEPGEMM, batch_size=3, M_max=4)
    x["masked_m"] = torch.tensor([4, 0, 2], dtype=torch.int32)
    got = _reference(calls.DEEPGEMM)(**x)
    read = x | {"a_scale": _as_sm100_reads(x["a_scale"]), "b_scale": _as_sm100_reads(x["b_scale"])}
    assert not torch.equal(read["a_scale"], x["a_scale"])  # the generated scales are not 2 ** e
    expected = templates._batch_deepgemm_fp8_nt_groupwise_reference(**read, expected_m=2)
    assert torch.equal(got, expected)
    assert not got[1].any() and not got[2, 2:].any()
    unrounded = templates._batch_deepgemm_fp8_nt_groupwise_reference(**x, expected_m=2)
    assert not torch.equal(got, unrounded)


def test_fp8_blockscale_gemm_sm90_matches_flashinfers_template_reference():
    x, _ = _inputs(calls.SM90, M=3)
    expected = templates._fp8_blockscale_gemm_sm90_reference(**x)
    _close(_reference(calls.SM90)(**x), expected)


# ---------------------------------------------------------------------------------------
# mm_fp4: NVFP4 operands as nvfp4_quantize leaves them
# ---------------------------------------------------------------------------------------


def _swizzled_128x4(scales: torch.Tensor) -> torch.Tensor:
    """[M, C] scales in FlashInfer's 128x4 layout, [padded M, padded C], one index at a time
    (compute_sf_index_swizzled_128x4_gpu in quantization_cute_dsl_utils.py)."""
    m, c = scales.shape
    rows, cols = -(-m // 128) * 128, -(-c // 4) * 4
    out = torch.zeros(rows * cols, dtype=scales.dtype)
    for r in range(m):
        for k in range(c):
            offset = k % 4 + (k // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
            out[offset + (r // 128) * 128 * cols] = scales[r, k]
    return out.reshape(rows, cols)


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _dequantize_nvfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Values of packed e2m1 rows (low nibble first) times their linear e4m3 scales."""
    b = packed.view(torch.uint8).to(torch.int64)
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)
    values = torch.where(codes >= 8, -E2M1[codes & 7], E2M1[codes & 7])
    return values * scales.float().repeat_interleave(16, dim=-1)


def test_mm_fp4_of_nvfp4_quantized_operands_is_their_dequantized_product(monkeypatch):
    # The operands as FlashInfer's documented recipe makes them: nvfp4_quantize with the
    # 128x4 layout, B and its scales passed transposed, alpha = 1 / (gs_a * gs_b).
    path, name = "flashinfer.gemm.mm_fp4", "gemm_fp4_N8192_K1024"
    g = torch.Generator().manual_seed(11)
    a = torch.randn(130, 1024, generator=g).to(torch.bfloat16)
    w = torch.randn(8192, 1024, generator=g).to(torch.bfloat16)
    gs_a = torch.tensor([448 * 6 / a.float().abs().max()])
    gs_w = torch.tensor([448 * 6 / w.float().abs().max()])
    quantize = compile_paths([str(ROOT / "definitions" / "quantization.fidef")]).module
    # The family's reference reads K from its input: any instance's quantizes K = 1024.
    (q,) = [d for d in quantize.definitions if d.name == "nvfp4_quantize_k4096"]
    namespace: dict = {}
    exec(q.reference, namespace)
    qa, sa = namespace["run"](a, gs_a)
    qw, sw = namespace["run"](w, gs_w)
    args = (qa.view(torch.uint8), qw.view(torch.uint8).T)
    args += (_swizzled_128x4(sa.view(torch.uint8)), _swizzled_128x4(sw.view(torch.uint8)).T)
    out = _route(monkeypatch, path, name, args, {"alpha": 1.0 / (gs_a * gs_w)})
    seen = _hit(out)
    assert seen["a_descale"].shape == (256, 64) and seen["b_descale"].shape == (8192, 64)
    assert seen["B"].shape == (8192, 512)
    deq = _dequantize_nvfp4(qa, sa) @ _dequantize_nvfp4(qw, sw).T / (gs_a * gs_w)
    _close(out.result, deq.to(torch.bfloat16), atol=1e-2, rtol=1e-2)
    # And within NVFP4's error of the bfloat16 product.
    exact = a.float() @ w.float().T
    assert (out.result.float() - exact).abs().mean() < 0.2 * exact.abs().mean()


def test_mm_mxfp8_of_mxfp8_quantized_operands_is_flashinfers_template_reference(monkeypatch):
    # The operands as mxfp8_quantize makes them (swizzled scales, B the transposed view);
    # FlashInfer's template reference unswizzles the scales its own way.
    path, name = "flashinfer.gemm.mm_mxfp8", "gemm_mxfp8_N8192_K1024"
    g = torch.Generator().manual_seed(12)
    a = torch.randn(130, 1024, generator=g).to(torch.bfloat16)
    w = torch.randn(8192, 1024, generator=g).to(torch.bfloat16)
    quantize = compile_paths([str(ROOT / "definitions" / "quantization.fidef")]).module
    # The family's reference reads K from its input: any instance's quantizes K = 1024.
    (q,) = [d for d in quantize.definitions if d.name == "mxfp8_quantize_k4096"]
    namespace: dict = {}
    exec(q.reference, namespace)
    qa, sa = namespace["run"](a)
    qw, sw = namespace["run"](w)
    a_sf = _swizzled_128x4(sa.view(torch.uint8)).reshape(-1)
    w_sf = _swizzled_128x4(sw.view(torch.uint8)).reshape(-1)
    out = _route(monkeypatch, path, name, (qa, qw.T, a_sf, w_sf), {})
    seen = _hit(out)
    assert seen["a_descale"].shape == (256 * 32,) and seen["B"].shape == (1024, 8192)
    assert seen["B"].data_ptr() == qw.data_ptr() and seen["B"].stride() == (1, 1024)
    theirs = templates._mm_mxfp8_reference(qa, qw.T, a_sf, w_sf)
    _close(out.result, theirs, atol=1e-2, rtol=1e-2)
    exact = a.float() @ w.float().T
    assert (out.result.float() - exact).abs().mean() < 0.05 * exact.abs().mean()


def test_bmm_mxfp8_of_mxfp8_quantized_operands_is_flashinfers_template_reference(monkeypatch):
    # Each batch entry quantized on its own and the scale buffers concatenated, as
    # FlashInfer's template (_bmm_mxfp8_init) builds them; B the transposed views.
    path, name = "flashinfer.gemm.bmm_mxfp8", "bmm_mxfp8_N512_K128"
    g = torch.Generator().manual_seed(13)
    a = torch.randn(2, 5, 128, generator=g).to(torch.bfloat16)
    w = torch.randn(2, 512, 128, generator=g).to(torch.bfloat16)
    quantize = compile_paths([str(ROOT / "definitions" / "quantization.fidef")]).module
    (q,) = [d for d in quantize.definitions if d.name == "mxfp8_quantize_k4096"]
    namespace: dict = {}
    exec(q.reference, namespace)
    qa, sa = zip(*(namespace["run"](x) for x in a))
    qw, sw = zip(*(namespace["run"](x) for x in w))
    a_sf = torch.cat([_swizzled_128x4(s.view(torch.uint8)).reshape(-1) for s in sa])
    w_sf = torch.cat([_swizzled_128x4(s.view(torch.uint8)).reshape(-1) for s in sw])
    A, B = torch.stack(qa), torch.stack(qw).transpose(1, 2)
    out = _route(monkeypatch, path, name, (A, B, a_sf, w_sf, torch.bfloat16), {})
    seen = _hit(out)
    assert seen["A_scale"].shape == (2 * 128 * 4,) and seen["B_scale"].shape == (2 * 512 * 4,)
    assert seen["B"].shape == (2, 128, 512) and seen["B"].stride() == (512 * 128, 1, 128)
    theirs = templates._bmm_mxfp8_reference(A, B, a_sf, w_sf, torch.bfloat16)
    _close(out.result, theirs, atol=1e-2, rtol=1e-2)
    exact = torch.matmul(a.float(), w.float().transpose(1, 2))
    assert (out.result.float() - exact).abs().mean() < 0.05 * exact.abs().mean()


def _swizzled_flat(scales: torch.Tensor) -> torch.Tensor:
    """_swizzled_128x4, flat, its index computed for every scale at once."""
    m, c = scales.shape
    cols = -(-c // 4) * 4
    r, k = torch.arange(m).unsqueeze(1), torch.arange(c).unsqueeze(0)
    offset = (
        k % 4 + (k // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (r // 128) * 128 * cols
    )
    out = torch.zeros(-(-m // 128) * 128 * cols, dtype=scales.dtype)
    out[offset.reshape(-1)] = scales.reshape(-1)
    return out


def test_mm_nvfp4_svdquant_is_the_nvfp4_gemm_plus_the_lora_correction(monkeypatch):
    # The activation as FlashInfer's template makes it (_mm_nvfp4_svdquant_init), quantized
    # by the catalogue's nvfp4_quantize_smooth; a residual weight of random e2m1 bytes and
    # e4m3 scales (quantizing a 3072 x 3072 one by the reference recipe costs seconds).
    path, name = (
        "flashinfer.gemm.gemm_svdquant.mm_nvfp4_svdquant",
        "gemm_nvfp4_svdquant_N3072_K3072_r32",
    )
    g = torch.Generator().manual_seed(14)
    x = torch.randn(5, 3072, generator=g).to(torch.bfloat16)
    pqs = (torch.rand(3072, generator=g) + 0.5).to(torch.bfloat16)
    b = torch.randint(0, 256, (3072, 1536), generator=g, dtype=torch.uint8)
    b_sf = (torch.rand(3072, 192, generator=g) * 2 + 0.25).to(torch.float8_e4m3fn)
    l1 = (torch.randn(3072, 32, generator=g) / 32**0.5).to(torch.bfloat16)
    l2 = (torch.randn(32, 3072, generator=g) / 3072**0.5).to(torch.bfloat16)
    bias = torch.randn(3072, generator=g).to(torch.bfloat16)
    x_hat = (x.float() * pqs.float()).to(torch.bfloat16)
    x_gs = (448 * 6 / x_hat.float().abs().max()).reshape(1)
    a, a_sf = _reference("nvfp4_quantize_smooth_n3072")(x, pqs, x_gs)
    a_flat, b_flat = _swizzled_flat(a_sf.view(torch.uint8)), _swizzled_flat(b_sf.view(torch.uint8))
    alpha = (1.0 / (x_gs * 100.0)).float()
    d = torch.mm(x_hat, l2.t().contiguous())
    l1_scaled = (l1.float() / alpha.item()).to(torch.bfloat16)
    args = (a.view(torch.uint8), b, a_flat, b_flat, alpha, d, l1_scaled)
    out = _route(monkeypatch, path, name, args, {"bias": bias})
    seen = _hit(out)
    assert seen["a_sf"].shape == (128, 192) and seen["b_sf"].shape == (3072, 192)
    assert torch.equal(seen["b_sf"].view(torch.uint8).reshape(-1), b_flat)
    # The residual term is the catalogue's NVFP4 GEMM (gemm_fp4, whose reference reads its
    # shapes from the operands), the correction alpha * d @ l1.T, then the bias.
    residual = _reference("gemm_fp4_N4096_K4096")(
        seen["a"], seen["b"], seen["a_sf"], seen["b_sf"], None
    ).float()
    lora = d.float() @ l1_scaled.float().T
    want = alpha * (residual + lora) + bias.float()
    _close(out.result, want.to(torch.bfloat16), atol=5e-2, rtol=2e-2)
    # The correction carries L1 at its own scale: alpha * l1 / alpha.
    assert ((alpha * lora - d.float() @ l1.float().T).abs() < 1e-1).all()


def test_svdquant_linear_is_smooth_quantization_then_the_svdquant_gemm(monkeypatch):
    path, name = "flashinfer.gemm.gemm_svdquant.svdquant_linear", "svdquant_linear_N3072_K3072_r32"
    g = torch.Generator().manual_seed(15)
    x = torch.randn(5, 3072, generator=g).to(torch.bfloat16)
    pqs = (torch.rand(3072, generator=g) + 0.5).to(torch.bfloat16)
    w = torch.randint(0, 256, (3072, 1536), generator=g, dtype=torch.uint8)
    w_sf = _swizzled_flat((torch.rand(3072, 192, generator=g) * 2 + 0.25).to(torch.float8_e4m3fn))
    l2t = (torch.randn(3072, 32, generator=g) / 3072**0.5).to(torch.bfloat16)
    l1 = (torch.randn(3072, 32, generator=g) * 20).to(torch.bfloat16)
    x_gs = (448 * 6 / (x.float() * pqs.float()).abs().max()).reshape(1)
    alpha = (1.0 / (x_gs * 100.0)).float()
    args = (x, w, w_sf.view(torch.uint8), alpha, pqs, l2t, l1, x_gs)
    out = _route(monkeypatch, path, name, args, {"bias": None})
    _hit(out)
    # FlashInfer's chain (gemm_svdquant.py) through the catalogue's references:
    # nvfp4_quantize_smooth, the bf16 LoRA-down product, then mm_nvfp4_svdquant.
    a, a_sf = _reference("nvfp4_quantize_smooth_n3072")(x, pqs, x_gs)
    down = torch.mm(x, l2t)
    a_sf = _swizzled_flat(a_sf.view(torch.uint8)).reshape(128, 192).view(torch.float8_e4m3fn)
    want = _reference("gemm_nvfp4_svdquant_N3072_K3072_r32")(
        a,
        w.view(torch.float4_e2m1fn_x2),
        a_sf,
        w_sf.reshape(3072, 192),
        alpha.reshape(()),
        down,
        l1,
        None,
    )
    _close(out.result, want, atol=5e-2, rtol=2e-2)


# ---------------------------------------------------------------------------------------
# mm_bf16_fp4: a bfloat16 activation times an NVFP4 weight prepared for cuDNN
# ---------------------------------------------------------------------------------------


def test_mm_bf16_fp4_of_a_cudnn_prepared_weight_is_flashinfers_reference(monkeypatch):
    # A canonical NVFP4 weight (packed bytes and its 128x4 scale buffer, as nvfp4_quantize
    # leaves them), prepared as FlashInfer's cuDNN preparation does (_prepare_cudnn: the
    # weight as it is, the scales unswizzled by _unswizzle_sf_128x4), then multiplied: the
    # result is FlashInfer's template reference of the canonical weight, bit for bit (alpha
    # a power of two, so that scaling the weight, as that reference does, or the product,
    # as cuDNN and the definition do, round alike).
    from flashinfer.gemm.gemm_bf16_fp4 import _unswizzle_sf_128x4

    g = torch.Generator().manual_seed(13)
    a = torch.randn(5, 7168, generator=g).to(torch.bfloat16)
    b = torch.randint(0, 256, (2048, 3584), dtype=torch.uint8, generator=g)
    swizzled = (torch.rand(2048, 448, generator=g) * 3.75 + 0.25).to(torch.float8_e4m3fn)
    alpha = torch.tensor([0.5])
    sf = _unswizzle_sf_128x4(swizzled.reshape(-1), 2048, 448).contiguous()
    sf = sf.view(torch.float8_e4m3fn)
    args = (a, b, sf, alpha)
    out = _route(monkeypatch, MM_BF16_FP4_PATH, calls.MM_BF16_FP4, args, {"backend": "cudnn"})
    seen = _hit(out)
    assert seen["B"].dtype == torch.float4_e2m1fn_x2 and seen["B"].data_ptr() == b.data_ptr()
    assert seen["b_descale"] is sf and seen["alpha"].shape == ()
    theirs = templates._mm_bf16_fp4_native_reference(a, b, swizzled.reshape(-1), alpha)
    assert torch.equal(out.result, theirs)


@pytest.mark.parametrize("flat", [True, False])
def test_mm_bf16_fp4_of_a_canonical_weight_goes_to_the_swizzled_family(flat, monkeypatch):
    # cute-dsl-native takes the weight as nvfp4_quantize leaves it: its scales the 128x4
    # buffer, flat or 2-D. The linear family refuses the backend; the swizzled one routes it,
    # and its result is FlashInfer's template reference bit for bit (alpha a power of two).
    name = "gemm_bf16_fp4_swizzled_N2048_K7168"
    g = torch.Generator().manual_seed(14)
    a = torch.randn(3, 7168, generator=g).to(torch.bfloat16)
    b = torch.randint(0, 256, (2048, 3584), dtype=torch.uint8, generator=g)
    swizzled = (torch.rand(2048, 448, generator=g) * 3.75 + 0.25).to(torch.float8_e4m3fn)
    alpha = torch.tensor([0.25])
    sf = swizzled.view(torch.uint8).reshape(-1) if flat else swizzled
    out = _route(
        monkeypatch, MM_BF16_FP4_PATH, name, (a, b, sf, alpha), {"backend": "cute-dsl-native"}
    )
    seen = _hit(out)
    assert seen["b_descale"].shape == (2048, 448) and seen["b_descale"].data_ptr() == sf.data_ptr()
    theirs = templates._mm_bf16_fp4_native_reference(a, b, swizzled.reshape(-1), alpha)
    assert torch.equal(out.result, theirs)


# ---------------------------------------------------------------------------------------
# grouped_gemm_nt_masked: per expert, its first masked_m rows times its NVFP4 weight
# ---------------------------------------------------------------------------------------


def _masked_call(**overrides):
    call = calls.ROUTABLE[MASKED_PATH](_catalogue())
    lhs, rhs, out, masked_m = call.args
    kwargs = dict(call.kwargs)
    given = {"lhs": lhs, "rhs": rhs, "out": out, "masked_m": masked_m} | overrides
    return (
        given.pop("lhs"),
        given.pop("rhs"),
        given.pop("out"),
        given.pop("masked_m"),
        {
            **kwargs,
            **given,
        },
    )


def test_grouped_gemm_nt_masked_writes_each_groups_rows_into_the_callers_view(monkeypatch):
    from flashinfer.gemm.gemm_bf16_fp4 import _unswizzle_sf_128x4

    lhs, rhs, out, _, kwargs = _masked_call()
    masked_m = torch.tensor([2, 0], dtype=torch.int32)
    out.fill_(7.0)  # [M, N, G]: what the call held before
    result = _route(monkeypatch, MASKED_PATH, calls.MASKED_NVFP4, (lhs, rhs, out, masked_m), kwargs)
    seen = _hit(result)
    assert seen["a"].shape == (2, 3, 384) and seen["b_sf"].shape == (2, 2048, 48)
    # The solution is handed the caller's memory, group-major, and writes into its view.
    assert seen["a"].data_ptr() == lhs[0].data_ptr() and seen["b"].is_contiguous()
    alpha = kwargs["alpha"]
    for g, m in enumerate(masked_m.tolist()):
        # Each group's scales unswizzled by FlashInfer's own helper, from the caller's buffer.
        sfa = _unswizzle_sf_128x4(lhs[1][..., g].permute(2, 4, 0, 1, 3).reshape(-1), 3, 48)
        sfb = _unswizzle_sf_128x4(rhs[1][..., g].permute(2, 4, 0, 1, 3).reshape(-1), 2048, 48)
        x = _dequantize_nvfp4(lhs[0][..., g], sfa.view(torch.float8_e4m3fn))
        w = _dequantize_nvfp4(rhs[0][..., g], sfb.view(torch.float8_e4m3fn))
        expected = ((x[:m] @ w.T) * alpha[g]).to(torch.bfloat16)
        assert torch.equal(out[:m, :, g], expected)
        # Rows past masked_m: the kernel leaves them, the definition zeroes them.
        assert (out[m:, :, g] == 0).all()


@pytest.mark.parametrize(
    ("param", "value", "rule"),
    [
        ("ab_dtype", "float8_e4m3fn", "ab_dtype"),
        ("sf_dtype", "float8_e8m0fnu", "sf_dtype"),
        ("sf_vec_size", 32, "sf_vec_size"),
        ("c_dtype", "float16", "c_dtype"),
        ("is_swap_ab", True, "is_swap_ab"),
        ("num_ranks", 2, "num_ranks"),
        ("dst_signals", torch.zeros(4, dtype=torch.int32), "dst_signals"),
        ("alpha_dtype", "bfloat16", "alpha_dtype"),
    ],
)
def test_a_grouped_gemm_nt_masked_mode_the_definition_does_not_model_is_refused(
    param, value, rule, monkeypatch
):
    lhs, rhs, out, masked_m, kwargs = _masked_call(**{param: value})
    result = _route(monkeypatch, MASKED_PATH, calls.MASKED_NVFP4, (lhs, rhs, out, masked_m), kwargs)
    assert result.counts["hit"] == 0 and result.counts["fallback_guard"] == 1, result.counts
    (counted,) = result.counts["rules"]
    # FlashInfer's function gets the call as given.
    bound = result.originals[0]
    assert rule in counted and (bound[param] if param in bound else bound["kwargs"][param]) is value


def test_a_grouped_gemm_nt_masked_operand_in_another_memory_order_is_refused(monkeypatch):
    # The kernel reads data pointers group-major: a contiguous [M, K / 2, G] activation is
    # other memory, which the definition does not read.
    lhs, rhs, out, masked_m, kwargs = _masked_call()
    moved = (lhs[0].contiguous(), lhs[1])
    result = _route(
        monkeypatch, MASKED_PATH, calls.MASKED_NVFP4, (moved, rhs, out, masked_m), kwargs
    )
    assert result.counts["hit"] == 0 and result.counts["fallback_guard"] == 1, result.counts
    (counted,) = result.counts["rules"]
    assert counted == "lhs"


@pytest.mark.parametrize(
    "overrides",
    [
        {"sm_count": None, "mma_tiler_mn": (128, 128), "cluster_shape_mn": (1, 1)},
        {"alpha": None, "alpha_dtype": None},
    ],
)
def test_grouped_gemm_nt_masked_launch_options_and_no_alpha_stay_routed(overrides, monkeypatch):
    lhs, rhs, out, masked_m, kwargs = _masked_call(**overrides)
    result = _route(monkeypatch, MASKED_PATH, calls.MASKED_NVFP4, (lhs, rhs, out, masked_m), kwargs)
    seen = _hit(result)
    assert torch.equal(out, _reference(calls.MASKED_NVFP4)(**seen))


SVDQUANT_PATHS = {
    "mm": "flashinfer.gemm.gemm_svdquant.mm_nvfp4_svdquant",
    "linear": "flashinfer.gemm.gemm_svdquant.svdquant_linear",
}


@pytest.mark.parametrize("which", sorted(SVDQUANT_PATHS))
def test_svdquant_backends_that_round_otherwise_fall_back(monkeypatch, which):
    # cute-dsl-unfused rounds the product, the low-rank branch and their sum to bfloat16
    # apart; the fused kernels round once, as the definition.
    path = SVDQUANT_PATHS[which]
    call = calls.ROUTABLE[path](_catalogue())
    kwargs = call.kwargs | {"backend": "cute-dsl-unfused"}
    out = _route(monkeypatch, path, call.name, call.args, kwargs)
    rules = out.counts["rules"]
    assert out.counts["hit"] == 0 and "backend" in next(iter(rules)), rules


@pytest.mark.parametrize(
    ("path", "backend", "routed"),
    [
        ("flashinfer.gemm.gemm_svdquant.svdquant_linear", "cutlass", True),
        ("flashinfer.gemm.gemm_svdquant.svdquant_linear", "auto", False),
        ("flashinfer.gemm.gemm_svdquant.nvfp4_quantize_smooth", "cutlass", True),
        ("flashinfer.gemm.gemm_svdquant.nvfp4_quantize_smooth", "cute-dsl", False),
    ],
)
def test_svdquant_quantizers_under_flashinfers_4over6_environment(
    monkeypatch, path, backend, routed
):
    # Set, FLASHINFER_NVFP4_4OVER6 switches the CuTe-DSL quantizer (which auto may pick) to
    # another recipe; the CUTLASS kernel has none.
    import _routable_samp_quant

    builders = {**calls.ROUTABLE, **_routable_samp_quant.ROUTABLE}
    call = builders[path](_catalogue())
    kwargs = {**call.kwargs, "backend": backend}
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "1")
    out = _route(monkeypatch, path, call.name, call.args, kwargs)
    if routed:
        _hit(out)
    else:
        rules = out.counts["rules"]
        assert out.counts["hit"] == 0 and "backend" in next(iter(rules)), rules
    monkeypatch.delenv("FLASHINFER_NVFP4_4OVER6")
    _hit(_route(monkeypatch, path, call.name, call.args, kwargs))


def test_mm_nvfp4_svdquant_with_a_strided_operand_falls_back(monkeypatch):
    path = SVDQUANT_PATHS["mm"]
    call = calls.ROUTABLE[path](_catalogue())
    args = list(call.args)
    d = args[5]
    args[5] = d.T.contiguous().T  # the same values, column-major: FlashInfer refuses it
    assert torch.equal(args[5], d) and not args[5].is_contiguous()
    _refused(
        _route(monkeypatch, path, call.name, tuple(args), call.kwargs), "a,b,d,l1,a_sf,b_sf,out"
    )
