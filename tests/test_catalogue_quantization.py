"""The quantization families of quantization.fidef, held to the real FlashInfer 0.7.2 on
the CPU.

Routing: FlashInfer's own functions are called with apply on and a solution that records
what it is given; the scales come back in the layout the call asks for (Note [block scale
layouts]), checked here against the 128x4 swizzle index written out one scale at a time. A
call the definition does not model is refused, counted with its rule, and goes to
FlashInfer itself, whose kernels raise on this CPU.

References: against FlashInfer's template references and the formats' definitions
(values that dequantize to the input, scales that are powers of two).
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

from _shared import require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import flashinfer  # noqa: E402
from flashinfer.tllm_enums import SfLayout  # noqa: E402
from flashinfer.trace.templates import quantize as fi_quantize  # noqa: E402

import fibgen.runtime as rt  # noqa: E402
from fibgen.compiler import compile_paths  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# What FlashInfer raises here: its JIT's architecture check, or its device checks.
FLASHINFER_ON_CPU = (RuntimeError, ValueError)
pytestmark = pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning")


@functools.cache
def _module():
    result = compile_paths([str(ROOT / "definitions" / "quantization.fidef")])
    assert result.ok, "the quantization definitions do not compile"
    return result.module


@functools.cache
def _reference(name):
    (d,) = [d for d in _module().definitions if d.name == name]
    namespace: dict = {}
    exec(d.reference, namespace)
    return namespace["run"]


@pytest.fixture(autouse=True)
def _off():
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.disable_apply()


def _recorder(name, seen):
    """A solution of ``name`` that records its inputs and returns what the reference does."""

    def solution(**inputs):
        seen.append(inputs)
        return _reference(name)(**inputs)

    return solution


def _bf16(*shape, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


def _swizzled_128x4(scales: torch.Tensor) -> torch.Tensor:
    """[M, C] scales in FlashInfer's 128x4 layout, one index at a time
    (compute_sf_index_swizzled_128x4_gpu in quantization_cute_dsl_utils.py)."""
    m, c = scales.shape
    rows, cols = -(-m // 128) * 128, -(-c // 4) * 4
    out = torch.zeros(rows * cols, dtype=scales.dtype)
    for r in range(m):
        for k in range(c):
            offset = k % 4 + (k // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
            out[offset + (r // 128) * 128 * cols] = scales[r, k]
    return out


# ---------------------------------------------------------------------------------------
# mxfp8_quantize
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("k", [2880, 4096])
def test_mxfp8_calls_are_routed_and_return_flashinfers_layouts(k):
    name = f"mxfp8_quantize_k{k}"
    x, seen = _bf16(130, k), []
    with rt.enable_apply({name: _recorder(name, seen)}, strict=True):
        q, swizzled = flashinfer.mxfp8_quantize(x)
        q2, linear = flashinfer.mxfp8_quantize(
            x, is_sf_swizzled_layout=False, enable_pdl=True, backend="cute-dsl"
        )
    assert len(seen) == 2 and torch.equal(seen[0]["input"], x)
    ref_q, ref_scales = _reference(name)(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (130, k)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(
        q2.view(torch.uint8), q.view(torch.uint8)
    )
    assert swizzled.dtype == linear.dtype == torch.uint8
    # The sizes FlashInfer allocates (fp8_quantization.py): padded rows times padded columns.
    cols = -(-k // 32 // 4) * 4
    assert swizzled.shape == (256 * cols,) and linear.shape == (130 * k // 32,)
    expected = ref_scales.view(torch.uint8)
    assert torch.equal(linear, expected.reshape(-1))
    assert torch.equal(swizzled, _swizzled_128x4(expected))


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"alignment": 64}, "alignment"),
        ({"sf_swizzle_layout": SfLayout.layout_8x4}, "sf_swizzle_layout"),
    ],
)
def test_an_mxfp8_call_the_definition_does_not_model_falls_back(kwargs, rule):
    name, seen = "mxfp8_quantize_k4096", []
    with rt.enable_apply({name: _recorder(name, seen)}):
        with pytest.raises(FLASHINFER_ON_CPU):
            flashinfer.mxfp8_quantize(_bf16(4, 4096), **kwargs)
    assert not seen
    path = "flashinfer.quantization.fp8_quantization.mxfp8_quantize"
    assert rt.stats()[path]["rules"] == {rule: 1}


def test_mxfp8_reference_rounds_the_scale_up_and_never_saturates():
    x = _bf16(64, 4096, seed=1)
    x[0, :32] = 0.0  # an all-zero block: scale byte 0, values 0
    x[1, :32] = 448.0 * 4  # amax / 448 a power of two: scale 2^2 exactly
    q, scales = _reference("mxfp8_quantize_k4096")(x)
    scales = scales.view(torch.uint8).to(torch.int32)
    assert scales[0, 0] == 0 and (q[0, :32].float() == 0).all()
    assert scales[1, 0] == 127 + 2 and (q[1, :32].float() == 448.0).all()
    blocks = x.float().reshape(64, -1, 32)
    amax = blocks.abs().amax(-1)
    scale = torch.pow(2.0, (scales - 127).float())
    live = amax > 0
    # The smallest power of two that brings the block's amax within 448.
    assert (amax[live] / scale[live] <= 448.0).all()
    assert (amax[live] / scale[live] > 224.0).all()
    # Values dequantize to the input within e4m3's rounding (3 mantissa bits).
    deq = q.float().reshape(64, -1, 32) * scale.unsqueeze(-1)
    err = (deq - blocks).abs()
    assert (err <= blocks.abs() * 2**-4 + scale.unsqueeze(-1) * 2**-9).all()


def test_mxfp8_reference_is_flashinfers_template_up_to_its_exponent_rounding():
    # FlashInfer's template takes floor(log2(amax / 448)); its kernels round up. Where
    # amax / 448 is a power of two they agree; elsewhere the kernels' exponent is one more.
    x = _bf16(16, 4096, seed=2)
    x[:, ::32] = 448.0 * 2.0 ** torch.arange(-8, 8).repeat_interleave(1).reshape(16, 1)
    ours_q, ours_s = _reference("mxfp8_quantize_k4096")(x)
    theirs_q, theirs_s = fi_quantize._quantize_mxfp8(x)
    ours_s, theirs_s = ours_s.view(torch.uint8), theirs_s.view(torch.uint8)
    amax = x.float().reshape(16, -1, 32).abs().amax(-1) / 448.0
    exact = torch.frexp(amax).mantissa == 0.5
    assert exact.any() and (~exact).any()
    assert torch.equal(ours_s[exact], theirs_s[exact])
    assert torch.equal(ours_s[~exact].int(), theirs_s[~exact].int() + 1)
    assert torch.equal(
        ours_q.reshape(16, -1, 32)[exact].float(), theirs_q.reshape(16, -1, 32)[exact].float()
    )


# ---------------------------------------------------------------------------------------
# mxfp4_quantize
# ---------------------------------------------------------------------------------------

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Values of packed e2m1 bytes, low nibble first."""
    b = packed.view(torch.uint8).to(torch.int64)
    nibbles = torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)
    values = E2M1[nibbles & 7]
    return torch.where(nibbles >= 8, -values, values)


@pytest.mark.slow
@pytest.mark.parametrize("k", [2880, 4096])
def test_mxfp4_calls_are_routed_and_return_flashinfers_layouts(k):
    name = f"mxfp4_quantize_k{k}"
    x, seen = _bf16(130, k), []
    with rt.enable_apply({name: _recorder(name, seen)}, strict=True):
        q, swizzled = flashinfer.mxfp4_quantize(x)
        q2, linear = flashinfer.mxfp4_quantize(
            x, sfLayout=SfLayout.layout_linear, backend="cute-dsl"
        )
        _, linear_int = flashinfer.mxfp4_quantize(x, "cuda", True, 2)
    assert len(seen) == 3 and torch.equal(seen[0]["a"], x)
    assert q.dtype == torch.uint8 and q.shape == (130, k // 2) and torch.equal(q, q2)
    ref_q, ref_scales = _reference(name)(x)
    assert torch.equal(q, ref_q.view(torch.uint8))
    # The shapes fp4_quantize returns: [padded rows, padded columns] or [M, K / 32].
    cols = -(-k // 32 // 4) * 4
    assert swizzled.dtype == linear.dtype == torch.uint8
    assert swizzled.shape == (256, cols) and linear.shape == (130, k // 32)
    expected = ref_scales.view(torch.uint8)
    assert torch.equal(linear, expected) and torch.equal(linear_int, expected)
    assert torch.equal(swizzled.reshape(-1), _swizzled_128x4(expected))


def test_an_mxfp4_call_with_the_8x4_layout_falls_back():
    name, seen = "mxfp4_quantize_k4096", []
    with rt.enable_apply({name: _recorder(name, seen)}):
        # FlashInfer's CUDA path moves the input to the GPU first, which asserts here.
        with pytest.raises((*FLASHINFER_ON_CPU, AssertionError)):
            flashinfer.mxfp4_quantize(_bf16(4, 4096), sfLayout=SfLayout.layout_8x4)
    assert not seen
    path = "flashinfer.quantization.fp4_quantization.mxfp4_quantize"
    assert rt.stats()[path]["rules"] == {"sfLayout": 1}


def test_mxfp4_reference_rounds_to_nearest_even_and_scales_up():
    x = torch.zeros(2, 4096, dtype=torch.bfloat16)
    # Block 0 of row 0: amax 6 * 2 = 12, so the scale is 2 (exactly) and the values halve.
    x[0, :8] = torch.tensor([12.0, 0.5, 1.5, 3.5, 7.0, -5.0, -0.25, 10.0])
    x[1, :32] = 0.0  # an all-zero block
    q, scales = _reference("mxfp4_quantize_k4096")(x)
    scales = scales.view(torch.uint8)
    assert scales[0, 0] == 128 and scales[1, 0] == 0
    # 0.25 -> 0 and 0.75 -> 1.0, 1.75 -> 2.0, 3.5 -> 4.0, -2.5 -> -2.0: ties to the even code.
    got = _unpack_e2m1(q[0, :4])
    assert got.tolist() == [6.0, 0.0, 1.0, 2.0, 4.0, -2.0, -0.0, 4.0]
    assert (_unpack_e2m1(q[1, :16]) == 0).all()
    # Random rows: the values dequantize to the input within e2m1's rounding, and the scale
    # is the smallest power of two that brings amax within 6.
    x = _bf16(64, 4096, seed=3)
    q, scales = _reference("mxfp4_quantize_k4096")(x)
    scale = torch.pow(2.0, (scales.view(torch.uint8).to(torch.int32) - 127).float())
    blocks = x.float().reshape(64, -1, 32)
    amax = blocks.abs().amax(-1)
    assert (amax / scale <= 6.0).all() and (amax / scale > 3.0).all()
    deq = _unpack_e2m1(q).reshape(64, -1, 32) * scale.unsqueeze(-1)
    assert ((deq - blocks).abs() <= scale.unsqueeze(-1) * 1.0 + 1e-6).all()
    assert ((deq - blocks).abs() <= blocks.abs() * 0.25 + scale.unsqueeze(-1) * 0.25).all()


def test_mxfp4_reference_is_flashinfers_template_where_their_roundings_agree():
    # FlashInfer's template takes floor(log2(amax / 6)) and breaks ties toward the smaller
    # magnitude; its kernels round the exponent up and ties to even. Blocks whose amax / 6
    # is a power of two and whose scaled values are on the e2m1 grid agree exactly.
    grid = torch.cat([E2M1, -E2M1[1:]])
    g = torch.Generator().manual_seed(4)
    codes = grid[torch.randint(0, len(grid), (8, 4096), generator=g)]
    codes[:, ::32] = 6.0
    exps = torch.randint(-4, 5, (8, 128, 1), generator=g).float()
    x = (codes.reshape(8, 128, 32) * torch.pow(2.0, exps)).reshape(8, 4096).to(torch.bfloat16)
    ours_q, ours_s = _reference("mxfp4_quantize_k4096")(x)
    theirs_q, theirs_s = fi_quantize._mxfp4_quantize_reference(x)
    assert torch.equal(ours_s.view(torch.uint8), theirs_s.view(torch.uint8))
    assert torch.equal(_unpack_e2m1(ours_q), _unpack_e2m1(theirs_q))
    assert torch.equal(
        _unpack_e2m1(ours_q),
        x.float() / torch.pow(2.0, exps).repeat_interleave(32, 1).reshape(8, 4096),
    )


# ---------------------------------------------------------------------------------------
# nvfp4_kv_quantize
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_nvfp4_kv_calls_are_routed_and_return_uint8_bytes():
    name, seen = "nvfp4_kv_quantize_k128", []
    x, gs = _bf16(40, 128), torch.tensor([0.5])
    with rt.enable_apply({name: _recorder(name, seen)}, strict=True):
        x_q, sf = flashinfer.nvfp4_kv_quantize(x, gs)
    assert len(seen) == 1 and torch.equal(seen[0]["global_scale"], gs)
    assert x_q.dtype == sf.dtype == torch.uint8
    assert x_q.shape == (40, 64) and sf.shape == (40, 8)
    ref_q, ref_sf = _reference(name)(x, gs)
    assert torch.equal(x_q, ref_q.view(torch.uint8)) and torch.equal(sf, ref_sf.view(torch.uint8))


def test_an_nvfp4_kv_call_of_another_head_dim_falls_back():
    name, seen = "nvfp4_kv_quantize_k128", []
    with rt.enable_apply({name: _recorder(name, seen)}):
        with pytest.raises(FLASHINFER_ON_CPU):
            flashinfer.nvfp4_kv_quantize(_bf16(4, 96), torch.tensor([1.0]))
    assert not seen


@pytest.mark.parametrize("gs", [0.5, 1.0, 3.0])
def test_nvfp4_kv_reference_dequantizes_with_the_global_scale(gs):
    # x is about value * sf * global_scale, within e2m1's rounding of the block.
    x = _bf16(64, 128, seed=5, scale=2.0)
    x[0, :16] = 0.0
    q, sf = _reference("nvfp4_kv_quantize_k128")(x, torch.tensor([gs]))
    assert (sf[0, 0].float() == 0) and (_unpack_e2m1(q[0, :8]) == 0).all()
    scale = sf.float().unsqueeze(-1) * gs
    blocks = x.float().reshape(64, -1, 16)
    deq = _unpack_e2m1(q).reshape(64, -1, 16) * scale
    amax = blocks.abs().amax(-1, keepdim=True)
    # The e4m3 scale is within 1/16 of amax / 6 / global_scale.
    assert ((sf.float() * gs * 6 - amax[..., 0]).abs() <= amax[..., 0] / 16 + 1e-6).all()
    assert ((deq - blocks).abs() <= scale * 1.0 + 1e-6).all()
    assert (deq - blocks).abs().mean() < 0.1 * blocks.abs().mean()


def test_nvfp4_kv_reference_agrees_with_flashinfers_template_at_a_global_scale_of_one():
    # With global_scale 1 the directions agree; the template breaks e2m1 ties toward the
    # smaller magnitude, the kernel to the even code, so compare dequantized values loosely
    # and scales exactly.
    x = _bf16(32, 128, seed=6)
    one = torch.tensor([1.0])
    ours_q, ours_sf = _reference("nvfp4_kv_quantize_k128")(x, one)
    theirs_q, theirs_sf = fi_quantize._nvfp4_kv_quantize_reference(x, one)
    assert torch.equal(ours_sf.view(torch.uint8), theirs_sf.view(torch.uint8))
    ours, theirs = _unpack_e2m1(ours_q), _unpack_e2m1(theirs_q)
    assert (ours - theirs).abs().max() <= 1.0  # at most one e2m1 step apart
    assert (ours == theirs).float().mean() > 0.9
    # A global scale of 2: the kernel divides by it, the template multiplies.
    ours_sf2 = _reference("nvfp4_kv_quantize_k128")(x, torch.tensor([2.0]))[1]
    assert (ours_sf2.float() < ours_sf.float()).float().mean() > 0.9


# ---------------------------------------------------------------------------------------
# nvfp4_quantize, fp4_quantize, silu_and_mul_nvfp4_quantize (Note [nvfp4 recipe])
# ---------------------------------------------------------------------------------------

NVFP4_PATHS = {
    "nvfp4": "flashinfer.quantization.fp4_quantization.nvfp4_quantize",
    "fp4": "flashinfer.quantization.fp4_quantization.fp4_quantize",
    "silu": "flashinfer.quantization.fp4_quantization.silu_and_mul_nvfp4_quantize",
}


def _e2m1_code(m: torch.Tensor) -> torch.Tensor:
    """The e2m1 code of magnitudes in [0, 6], rounded to nearest with ties to the even code,
    written as its thresholds: a tie goes up where the code above is even."""
    t = [(0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True)]
    code = torch.zeros_like(m, dtype=torch.int64)
    for edge, tie_up in [*t, (5.0, False)]:
        code += (m >= edge) if tie_up else (m > edge)
    return code


def _nvfp4_by_blocks(x: torch.Tensor, gs: float) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 of bf16 rows one block at a time, in float32 as the CUDA kernel orders it:
    sf = e4m3(gs * (amax * (1/6))), out_scale = 1 / (sf * (1/gs)), values e2m1(x * out_scale).
    Returns the signed e2m1 values and the e4m3 scales."""
    f32 = torch.float32
    g = torch.tensor(gs, dtype=f32)
    rows, k = x.shape
    values = torch.zeros(rows, k)
    scales = torch.zeros(rows, k // 16, dtype=torch.float8_e4m3fn)
    for r in range(rows):
        for b in range(k // 16):
            block = x[r, b * 16 : (b + 1) * 16].float()
            amax = block.abs().max()
            sf = (g * (amax * torch.tensor(1 / 6, dtype=f32))).clamp(max=448.0)
            sf = sf.to(torch.float8_e4m3fn)
            scales[r, b] = sf
            if sf.float() == 0:
                continue
            out_scale = torch.tensor(1.0, dtype=f32) / (sf.float() * (1.0 / g))
            s = block * out_scale
            mag = E2M1[_e2m1_code(s.abs().clamp(max=6.0))]
            values[r, b * 16 : (b + 1) * 16] = torch.where(s < 0, -mag, mag)
    return values, scales


@pytest.mark.slow
@pytest.mark.parametrize("k", [4096, 7168])
def test_nvfp4_calls_are_routed_and_return_flashinfers_layouts(k):
    name = f"nvfp4_quantize_k{k}"
    x, seen, gs = _bf16(130, k), [], torch.tensor([150.0])
    with rt.enable_apply({name: _recorder(name, seen)}, strict=True):
        q, swizzled = flashinfer.nvfp4_quantize(x, gs)
        q2, linear = flashinfer.nvfp4_quantize(
            x, gs, sfLayout=SfLayout.layout_linear, backend="cute-dsl", nvfp4_4over6=None
        )
        _, linear_pos = flashinfer.nvfp4_quantize(x, gs, 2, False, 16, True)
    assert len(seen) == 3 and torch.equal(seen[0]["a"], x)
    assert torch.equal(seen[0]["a_global_sf"], gs)
    assert q.dtype == torch.uint8 and q.shape == (130, k // 2) and torch.equal(q, q2)
    ref_q, ref_scales = _reference(name)(x, gs)
    assert torch.equal(q, ref_q.view(torch.uint8))
    # fp4_quantize's shapes: [padded rows, padded columns] or [M, K / 16].
    cols = -(-k // 16 // 4) * 4
    assert swizzled.dtype == linear.dtype == torch.uint8
    assert swizzled.shape == (256, cols) and linear.shape == (130, k // 16)
    expected = ref_scales.view(torch.uint8)
    assert torch.equal(linear, expected) and torch.equal(linear_pos, expected)
    assert torch.equal(swizzled.reshape(-1), _swizzled_128x4(expected))


@pytest.mark.slow
def test_nvfp4_quantize_leaves_a_column_major_input_to_flashinfer():
    # FlashInfer quantizes a column-major input along its other axis.
    name, seen = "nvfp4_quantize_k4096", []
    x = _bf16(4096, 130).T
    with rt.enable_apply({name: _recorder(name, seen)}):
        with pytest.raises(Exception):  # FlashInfer's own kernel, which needs a GPU here
            flashinfer.nvfp4_quantize(x, torch.tensor([150.0]))
    api = rt.stats()["flashinfer.quantization.fp4_quantization.nvfp4_quantize"]
    assert not seen and api["rules"] == {"a": 1}, api


def test_fp4_quantize_calls_are_routed_like_nvfp4_quantize():
    name, seen, gs = "fp4_quantize_k4096", [], torch.tensor([120.0])
    x = _bf16(40, 4096)
    with rt.enable_apply({name: _recorder(name, seen)}, strict=True):
        q, swizzled = flashinfer.fp4_quantize(x, gs)
        q2, linear = flashinfer.fp4_quantize(
            x, gs, 16, False, False, True, enable_pdl=True, backend="cute-dsl"
        )
    assert len(seen) == 2 and torch.equal(seen[1]["global_scale"], gs)
    ref_q, ref_scales = _reference("nvfp4_quantize_k4096")(x, gs)
    assert torch.equal(q, ref_q.view(torch.uint8)) and torch.equal(q2, q)
    # is_sf_8x4_layout only matters for a swizzled layout: the linear call is routed.
    assert linear.shape == (40, 256) and torch.equal(linear, ref_scales.view(torch.uint8))
    assert swizzled.shape == (128, 256)
    assert torch.equal(swizzled.reshape(-1), _swizzled_128x4(ref_scales.view(torch.uint8)))


@pytest.mark.slow
def test_silu_and_mul_nvfp4_calls_are_routed_and_quantize_the_swiglu():
    name, seen, gs = "silu_and_mul_nvfp4_quantize_k28672", [], torch.tensor([200.0])
    x = _bf16(3, 28672, scale=1.0)
    with rt.enable_apply({name: _recorder(name, seen)}, strict=True):
        q, swizzled = flashinfer.silu_and_mul_nvfp4_quantize(x, gs)
        q2, linear = flashinfer.silu_and_mul_nvfp4_quantize(
            x, gs, is_sf_swizzled_layout=False, is_sf_8x4_layout=True, nvfp4_4over6=None
        )
    assert len(seen) == 2 and q.dtype == torch.uint8 and q.shape == (3, 14336 // 2)
    assert torch.equal(q, q2) and linear.shape == (3, 14336 // 16)
    assert swizzled.shape == (128, 14336 // 16)
    assert torch.equal(swizzled.reshape(-1), _swizzled_128x4(linear))
    # The quantized SwiGLU is nvfp4_quantize of bf16(silu(gate) * up).
    gate, up = x[:, :14336].float(), x[:, 14336:].float()
    h = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
    want_q, want_sf = _reference("nvfp4_quantize_k14336")(h, gs)
    assert torch.equal(linear, want_sf.view(torch.uint8))
    assert torch.equal(q, want_q.view(torch.uint8))


@pytest.mark.parametrize(
    ("api", "call", "rule"),
    [
        ("nvfp4", lambda x, gs: flashinfer.nvfp4_quantize(x, gs, sfLayout=1), "sfLayout"),
        ("nvfp4", lambda x, gs: flashinfer.nvfp4_quantize(x, gs, do_shuffle=True), "do_shuffle"),
        (
            "nvfp4",
            lambda x, gs: flashinfer.nvfp4_quantize(x, gs, per_token_activation=True),
            "per_token_activation",
        ),
        ("nvfp4", lambda x, gs: flashinfer.nvfp4_quantize(x, gs, backend="cake"), "backend"),
        # The definition reads a global scale: a call without one cannot be evaluated.
        ("fp4", lambda x, gs: flashinfer.fp4_quantize(x), "unevaluable"),
        ("fp4", lambda x, gs: flashinfer.fp4_quantize(x, gs, 32, True), "sf_vec_size"),
        ("fp4", lambda x, gs: flashinfer.fp4_quantize(x, gs, sf_use_ue8m0=True), "sf_use_ue8m0"),
        (
            "fp4",
            lambda x, gs: flashinfer.fp4_quantize(x, gs, is_sf_8x4_layout=True),
            "is_sf_8x4_layout",
        ),
        (
            "fp4",
            lambda x, gs: flashinfer.fp4_quantize(x, gs, is_global_scale_inversed=True),
            "is_global_scale_inversed",
        ),
        ("fp4", lambda x, gs: flashinfer.fp4_quantize(x.t().contiguous().t(), gs), "input"),
    ],
)
def test_an_nvfp4_call_the_definitions_do_not_model_falls_back(api, call, rule):
    names = ["nvfp4_quantize_k4096", "fp4_quantize_k4096"]
    seen: list = []
    x = _bf16(4096, 4096, scale=1.0) if rule == "input" else _bf16(4, 4096)
    with rt.enable_apply({n: _recorder(n, seen) for n in names}):
        with pytest.raises((*FLASHINFER_ON_CPU, AssertionError, NotImplementedError)):
            call(x, torch.tensor([150.0]))
    assert not seen
    (counted,) = rt.stats()[NVFP4_PATHS[api]]["rules"]
    assert rule in counted


def test_the_4over6_recipe_is_left_to_flashinfer(monkeypatch):
    from flashinfer.quantization import NVFP44Over6Config

    name, seen = "silu_and_mul_nvfp4_quantize_k28672", []
    x, gs = _bf16(2, 28672, scale=1.0), torch.tensor([200.0])
    with rt.enable_apply({name: _recorder(name, seen)}):
        with pytest.raises((*FLASHINFER_ON_CPU, AssertionError)):
            flashinfer.silu_and_mul_nvfp4_quantize(x, gs, nvfp4_4over6=NVFP44Over6Config())
        # Left out, the argument defers to the environment, read at each call.
        monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "1")
        with pytest.raises((*FLASHINFER_ON_CPU, AssertionError)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                flashinfer.silu_and_mul_nvfp4_quantize(x, gs)
        monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "0")
        flashinfer.silu_and_mul_nvfp4_quantize(x, gs)
    assert len(seen) == 1
    assert rt.stats()[NVFP4_PATHS["silu"]]["rules"] == {"nvfp4_4over6": 2}


@pytest.mark.parametrize("gs", [150.0, 3.0, 1000.0])
def test_nvfp4_reference_is_the_kernels_arithmetic_block_by_block(gs):
    x = _bf16(6, 4096, seed=7)
    x[0, :16] = 0.0  # an all-zero block: scale 0, values 0
    # Values whose scaled magnitudes fall on e2m1 ties: amax 6 gives sf = gs exactly
    # when gs is an e4m3 value, and out_scale = 1.
    x[1, :8] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    x[1, 8:16] = 0.0
    # A block whose scale underflows to 0 at gs = 150 (150 * 1e-5 / 6 < 2^-10): values 0.
    x[2, :16] = 1e-5
    q, sf = _reference("nvfp4_quantize_k4096")(x, torch.tensor([gs]))
    b = q.view(torch.uint8).to(torch.int64)
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)
    got = torch.where(codes >= 8, -E2M1[codes & 7], E2M1[codes & 7])
    want, want_sf = _nvfp4_by_blocks(x, gs)
    assert torch.equal(sf.view(torch.uint8), want_sf.view(torch.uint8))
    assert torch.equal(got, want)
    assert (sf[0, 0].float() == 0) and (got[0, :16] == 0).all()
    if gs == 150.0:
        # 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4 (even codes);
        # the block's scale is e4m3(150) = 144, so out_scale = 150 / 144 moves them off ties.
        assert sf[1, 0].float() == 144.0
        assert sf[2, 0].float() == 0 and (got[2, :16] == 0).all()
    if gs == 3.0:
        assert sf[1, 0].float() == 3.0
        assert got[1, :8].tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_nvfp4_reference_dequantizes_to_its_input_with_the_global_scale():
    x, gs = _bf16(64, 4096, seed=8), 448.0 * 6.0 / 14.0
    q, sf = _reference("nvfp4_quantize_k4096")(x, torch.tensor([gs]))
    got = _unpack_e2m1(q).reshape(64, -1, 16)
    blocks = x.float().reshape(64, -1, 16)
    amax = blocks.abs().amax(-1)
    # The e4m3 scale is within e4m3's rounding of gs * amax / 6 (3 mantissa bits).
    assert ((sf.float() - gs * amax / 6).abs() <= gs * amax / 6 / 16 + 2**-9).all()
    # x is about value * sf / gs, within half an e2m1 step at most (the step is 2 at 4..6).
    deq = got * sf.float().unsqueeze(-1) / gs
    step = sf.float().unsqueeze(-1) / gs
    assert ((deq - blocks).abs() <= step * 1.0 + 1e-6).all()
    assert (deq - blocks).abs().mean() < 0.1 * blocks.abs().mean()


def test_nvfp4_reference_and_flashinfers_template_agree_up_to_ties_and_rounding():
    # The template multiplies by gs / sf where the kernel multiplies by rcp(sf * rcp(gs)),
    # and breaks ties toward the smaller magnitude: scales agree, values within a step.
    x, gs = _bf16(32, 4096, seed=9), torch.tensor([180.0])
    ours_q, ours_sf = _reference("nvfp4_quantize_k4096")(x, gs)
    theirs_q, theirs_sf = fi_quantize._nvfp4_quantize_reference(x, gs)
    assert torch.equal(ours_sf.view(torch.uint8), theirs_sf.view(torch.uint8))
    ours, theirs = _unpack_e2m1(ours_q), _unpack_e2m1(theirs_q)
    assert (ours - theirs).abs().max() <= 2.0  # one e2m1 step at most
    assert (ours == theirs).float().mean() > 0.99
    fp4_q, fp4_sf = _reference("fp4_quantize_k4096")(x, gs)
    assert torch.equal(fp4_q.view(torch.uint8), ours_q.view(torch.uint8))
    assert torch.equal(fp4_sf.view(torch.uint8), ours_sf.view(torch.uint8))


def test_silu_and_mul_nvfp4_reference_and_flashinfers_template_agree_up_to_ties():
    x, gs = _bf16(8, 28672, seed=10, scale=1.0), torch.tensor([200.0])
    ours_q, ours_sf = _reference("silu_and_mul_nvfp4_quantize_k28672")(x, gs)
    theirs_q, theirs_sf = fi_quantize._silu_and_mul_nvfp4_quantize_reference(x, gs)
    assert ours_q.view(torch.uint8).shape == theirs_q.shape == (8, 14336 // 2)
    # silu as g / (1 + exp(-g)) against torch's sigmoid: bf16 rounding apart at most.
    same_sf = ours_sf.view(torch.uint8) == theirs_sf
    assert same_sf.float().mean() > 0.99
    ours, theirs = _unpack_e2m1(ours_q), _unpack_e2m1(theirs_q)
    assert (ours == theirs).float().mean() > 0.98


def test_nvfp4_4over6_off_reads_the_argument_then_the_environment(monkeypatch):
    from flashinfer.quantization import NVFP44Over6Config
    from flashinfer.quantization.nvfp4_quantization_utils import _UNSET

    from fibgen.runtime.routing.rulefns import nvfp4_4over6_off

    monkeypatch.delenv("FLASHINFER_NVFP4_4OVER6", raising=False)
    assert nvfp4_4over6_off(None) and nvfp4_4over6_off(_UNSET)
    assert not nvfp4_4over6_off(NVFP44Over6Config())
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "1")
    assert nvfp4_4over6_off(None) and not nvfp4_4over6_off(_UNSET)


# ---------------------------------------------------------------------------------------
# nvfp4_kv_dequantize_paged
# ---------------------------------------------------------------------------------------

DEQUANT = "nvfp4_kv_dequantize_paged_h8_dk128_dv128_ps16"
DEQUANT_PATH = "flashinfer.quantization.fp4_quantization.nvfp4_kv_dequantize_paged"


def _paged_nvfp4_cache(pages=6, seed=13):
    """K and V of 8 heads of 128, quantized by the catalogue's nvfp4_kv_quantize into pages
    of 16 tokens (NHD), with their bf16 originals and global scales."""
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(pages, 16, 8, 128, generator=g) * 2).to(torch.bfloat16)
    v = (torch.randn(pages, 16, 8, 128, generator=g) * 3).to(torch.bfloat16)
    gk, gv = torch.tensor([0.5]), torch.tensor([0.25])
    quantize = _reference("nvfp4_kv_quantize_k128")
    kq, ks = quantize(k.reshape(-1, 128), gk)
    vq, vs = quantize(v.reshape(-1, 128), gv)
    cache = (
        kq.view(torch.uint8).reshape(pages, 16, 8, 64),
        vq.view(torch.uint8).reshape(pages, 16, 8, 64),
    )
    sf = (
        ks.view(torch.uint8).reshape(pages, 16, 8, 8),
        vs.view(torch.uint8).reshape(pages, 16, 8, 8),
    )
    return cache, sf, (k, v), (gk, gv)


def _dequant_call(cache, sf, scales, layout="NHD", stacked=False):
    if layout == "HND":
        cache = tuple(t.transpose(1, 2).contiguous() for t in cache)
        sf = tuple(t.transpose(1, 2).contiguous() for t in sf)
    if stacked:
        cache, sf = torch.stack(cache, dim=1), torch.stack(sf, dim=1)
    block_tables = torch.tensor([[3, 1, 0], [5, 2, 4]], dtype=torch.int32)
    seq_lens = torch.tensor([20, 40], dtype=torch.int32)
    out_k = torch.full((2, 40, 8, 128), 7.0, dtype=torch.bfloat16)
    out_v = out_k.clone()
    args = (cache, sf, block_tables, seq_lens, *scales, out_k, out_v)
    return args, {"kv_layout": layout}


@pytest.mark.parametrize(("layout", "stacked"), [("NHD", False), ("HND", True)])
def test_nvfp4_kv_dequantize_paged_gathers_pages_into_the_callers_buffers(layout, stacked):
    cache, sf, (k, v), scales = _paged_nvfp4_cache()
    args, kwargs = _dequant_call(cache, sf, scales, layout, stacked)
    out_k, out_v = args[-2], args[-1]
    seen: list = []
    with rt.enable_apply({DEQUANT: _recorder(DEQUANT, seen)}, strict=True):
        assert flashinfer.nvfp4_kv_dequantize_paged(*args, **kwargs) is None
    assert len(seen) == 1 and seen[0]["paged_k_cache"].shape == (6, 16, 8, 64)
    # Each sequence's tokens from its pages, one element at a time from the packed bytes.
    for out, (c, s), gs in (
        (out_k, (cache[0], sf[0]), scales[0]),
        (out_v, (cache[1], sf[1]), scales[1]),
    ):
        for i, (pages, n) in enumerate((([3, 1, 0], 20), ([5, 2, 4], 40))):
            for t in (0, n // 2, n - 1):
                page, slot = pages[t // 16], t % 16
                values = _unpack_e2m1(c[page, slot])  # [heads, 128]
                block = s[page, slot].view(torch.float8_e4m3fn).float().repeat_interleave(16, -1)
                want = (values * block * gs).to(torch.bfloat16)
                assert torch.equal(out[i, t], want)
            # Positions past the sequence's length keep what the caller's buffer held.
            assert (out[i, n:] == 7.0).all()
    # And the round trip through nvfp4_kv_quantize is within NVFP4's error of the original.
    ref = k[[3, 1]].reshape(32, 8, 128)[:20].float()
    assert (out_k[0, :20].float() - ref).abs().mean() < 0.1 * ref.abs().mean()


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        # The let that reads the cache as NHD views refuses an unknown layout first.
        ({"kv_layout": "NDH"}, "paged_kv_cache"),
        ({"output_dtype": torch.float16}, "output_k"),
    ],
)
def test_an_nvfp4_kv_dequantize_call_the_definition_does_not_model_falls_back(change, rule):
    cache, sf, _, scales = _paged_nvfp4_cache()
    args, kwargs = _dequant_call(cache, sf, scales)
    if "output_dtype" in change:
        args = (*args[:-2], args[-2].half(), args[-1].half())
    else:
        kwargs = change
    seen: list = []
    with rt.enable_apply({DEQUANT: _recorder(DEQUANT, seen)}):
        with pytest.raises((*FLASHINFER_ON_CPU, AssertionError)):
            flashinfer.nvfp4_kv_dequantize_paged(*args, **kwargs)
    assert not seen
    (counted,) = rt.stats()[DEQUANT_PATH]["rules"]
    assert rule in counted


# ---------------------------------------------------------------------------------------
# silu_and_mul_mxfp8_quantize and its backward (Note [gated mxfp8])
# ---------------------------------------------------------------------------------------

GATED_MXFP8 = {
    "forward": (
        "silu_and_mul_mxfp8_forward_row_k24576",
        "flashinfer.gated_act_mxfp8.silu_and_mul_mxfp8_quantize",
    ),
    "backward": (
        "silu_and_mul_mxfp8_backward_row_k24576",
        "flashinfer.gated_act_mxfp8.silu_and_mul_mxfp8_quantize_backward",
    ),
}


def _gated_call(direction, x, grad, **kwargs):
    from flashinfer import gated_act_mxfp8 as fi_gated

    if direction == "forward":
        return fi_gated.silu_and_mul_mxfp8_quantize(x, **kwargs)
    return fi_gated.silu_and_mul_mxfp8_quantize_backward(x, grad, **kwargs)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_gated_mxfp8_rowwise_calls_are_routed_with_swizzled_e8m0_scales(direction):
    name, _ = GATED_MXFP8[direction]
    x, grad, given = _bf16(128, 24576, scale=1.0), _bf16(128, 12288, seed=1, scale=1.0), []

    def solution(**inputs):
        given.append((inputs, _reference(name)(**inputs)))
        return given[-1][1]

    with rt.enable_apply({name: solution}, strict=True):
        row_q, col_q, row_s, col_s = _gated_call(direction, x, grad)
    ((inputs, (ref_q, _, ref_s, _)),) = given
    assert torch.equal(inputs["gated_input"], x)
    width = 12288 if direction == "forward" else 24576
    assert row_q.dtype == torch.float8_e4m3fn and row_q.shape == (128, width)
    assert torch.equal(row_q.view(torch.uint8), ref_q.view(torch.uint8))
    # As FlashInfer returns them: e8m0 bytes [M, O / 32] in the 128x4 layout; empty
    # column-wise outputs.
    assert row_s.dtype == torch.float8_e8m0fnu and row_s.shape == (128, width // 32)
    # The 128x4 index of each scale (row r, column c), as the kernel computes it
    # (data/csrc/gated_act_mxfp8/gated_act_mxfp8_fwd_row.cu, scale_index).
    r = torch.arange(128).unsqueeze(1)
    c = torch.arange(width // 32).unsqueeze(0)
    index = (
        ((r >> 7) * (width // 128) + (c >> 2)) * 512 + (r & 31) * 16 + (r >> 5 & 3) * 4 + (c & 3)
    )
    want = torch.zeros(128 * width // 32, dtype=torch.uint8)
    want[index.reshape(-1)] = ref_s.view(torch.uint8).reshape(-1)
    assert torch.equal(row_s.view(torch.uint8).reshape(-1), want)
    assert col_q.shape == col_s.shape == (0,) and col_s.dtype == torch.float8_e8m0fnu
    assert col_q.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize(
    ("rows", "kwargs", "rule"),
    [
        (128, {"colwise": True}, "colwise"),
        (128, {"rowwise": False, "colwise": True}, "rowwise"),
        (64, {}, "gated_input"),
    ],
)
def test_a_gated_mxfp8_call_the_definition_does_not_model_falls_back(direction, rows, kwargs, rule):
    name, path = GATED_MXFP8[direction]
    x, grad, seen = _bf16(rows, 24576), _bf16(rows, 12288, seed=1), []
    with rt.enable_apply({name: _recorder(name, seen)}):
        with pytest.raises(FLASHINFER_ON_CPU):
            _gated_call(direction, x, grad, **kwargs)
    assert not seen
    (counted,) = rt.stats()[path]["rules"]
    assert rule in counted


def _gated_logical(direction, x, grad):
    """FlashInfer's template's bf16 result before quantization (trace/templates/
    gated_act_mxfp8.py), with torch's sigmoid."""
    k = x.shape[1] // 2
    gate, up = x[:, :k].float(), x[:, k:].float()
    if direction == "forward":
        return (torch.nn.functional.silu(gate) * up).bfloat16()
    sig = torch.sigmoid(gate)
    silu = gate * sig
    dact = silu * (1.0 - sig) + sig
    return torch.cat((((dact * grad.float()) * up).bfloat16(), (silu * grad.float()).bfloat16()), 1)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_gated_mxfp8_reference_is_mxfp8_of_the_swiglu_with_rceil_scales(direction):
    name, _ = GATED_MXFP8[direction]
    x, grad = _bf16(128, 24576, seed=3, scale=1.0), _bf16(128, 12288, seed=4, scale=1.0)
    x[0, :32] = 0.0  # a zero gate: a zero block of the forward result, scale byte 0
    args = (x,) if direction == "forward" else (x, grad)
    q, col_q, scales, col_s = _reference(name)(*args)
    assert col_q.numel() == col_s.numel() == 0
    h = _gated_logical(direction, x, grad).float()
    rows, width = h.shape
    blocks = h.reshape(rows, -1, 32)
    s = scales.view(torch.uint8).to(torch.int32)
    if direction == "forward":
        assert s[0, 0] == 0 and (q[0, :32].float() == 0).all()
    # RCEIL: the smallest power of two that brings the block's amax within 448.
    amax = blocks.abs().amax(-1)
    scale = torch.pow(2.0, (s - 127).float())
    live = amax > 0
    assert (amax[live] / scale[live] <= 448.0).all()
    assert (amax[live] / scale[live] > 224.0).all()
    # The values: the template's bf16 result (torch's sigmoid: one bf16 step apart at
    # most), divided by the scale and rounded to e4m3.
    deq = q.float().reshape(rows, -1, 32) * scale.unsqueeze(-1)
    err = (deq - blocks).abs()
    assert (err <= blocks.abs() * 2**-4 * 1.1 + scale.unsqueeze(-1) * 2**-9).all()
    # Bit for bit, but for values whose bf16 activation the approximate exp moves a step:
    # e4m3 of the template's result over 2^ceil(log2(amax / 448)), computed in float64.
    agree = (q.view(torch.uint8) == _reference_mxfp8_rceil(h)).float().mean()
    assert agree > 0.999


def _reference_mxfp8_rceil(h):
    """e4m3 bytes of h over 2^ceil(log2(amax / 448)) per block of 32, computed in float64."""
    blocks = h.double().reshape(h.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    e = torch.ceil(torch.log2(amax / 448.0)).clamp(min=-127)
    e = torch.where(amax > 0, e, torch.full_like(e, -127.0))
    q = (blocks / torch.pow(2.0, e)).float().clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.reshape(h.shape).view(torch.uint8)


# ---------------------------------------------------------------------------------------
# silu_and_mul_scaled_nvfp4_experts_quantize
# ---------------------------------------------------------------------------------------

EXPERTS = "silu_and_mul_scaled_nvfp4_experts_quantize_k4096"
EXPERTS_PATH = "flashinfer.activation.silu_and_mul_scaled_nvfp4_experts_quantize"


def test_silu_nvfp4_experts_calls_are_routed_and_quantize_each_experts_tokens():
    a = _bf16(2, 6, 4096, seed=5, scale=1.0)
    mask, gs, seen = torch.tensor([6, 2], dtype=torch.int32), torch.tensor([200.0, 150.0]), []
    with rt.enable_apply({EXPERTS: _recorder(EXPERTS, seen)}, strict=True):
        q, sf = flashinfer.silu_and_mul_scaled_nvfp4_experts_quantize(a, mask, gs)
    assert len(seen) == 1
    # As FlashInfer returns them (fp4_quantization.py): [B, M, K/2] bytes permuted to
    # [M, K/2, B]; per expert, the 128x4 layout of [M padded to 128, 128 scales], viewed
    # [32, 4, M tiles, 4, K tiles, B].
    assert q.dtype == torch.uint8 and q.shape == (6, 1024, 2)
    assert q.stride() == (1024, 1, 6 * 1024)
    assert sf.dtype == torch.float8_e4m3fn and sf.shape == (32, 4, 1, 4, 32, 2)
    storage = sf.permute(5, 2, 4, 0, 1, 3).reshape(2, -1).view(torch.uint8)
    for b in range(2):
        n = int(mask[b])
        gate, up = a[b, :, :2048].float(), a[b, :, 2048:].float()
        h = (gate / (1.0 + torch.exp(-gate)) * up).to(torch.bfloat16)
        # The catalogue's NVFP4 recipe (fp4_quantize) on the expert's tokens and scale.
        want_q, want_sf = _reference("fp4_quantize_k4096")(h[:n], gs[b : b + 1])
        assert torch.equal(q[:n, :, b], want_q.view(torch.uint8))
        assert (q[n:, :, b] == 0).all()
        linear = torch.zeros(6, 128, dtype=torch.uint8)
        linear[:n] = want_sf.view(torch.uint8)
        assert torch.equal(storage[b], _swizzled_128x4(linear))


def test_a_silu_nvfp4_experts_call_the_definition_does_not_model_falls_back():
    from flashinfer.quantization import NVFP44Over6Config

    a, mask, seen = _bf16(2, 4, 4096), torch.tensor([4, 1], dtype=torch.int32), []
    gs = torch.tensor([200.0, 150.0])
    with rt.enable_apply({EXPERTS: _recorder(EXPERTS, seen)}):
        with pytest.raises(FLASHINFER_ON_CPU):
            flashinfer.silu_and_mul_scaled_nvfp4_experts_quantize(
                a, mask, gs, nvfp4_4over6=NVFP44Over6Config()
            )
    assert not seen
    assert rt.stats()[EXPERTS_PATH]["rules"] == {"nvfp4_4over6": 1}


# ---------------------------------------------------------------------------------------
# mxfp8_grouped_quantize
# ---------------------------------------------------------------------------------------

GROUPED = "mxfp8_grouped_quantize_k4096"
GROUPED_PATH = "flashinfer.quantization.fp8_quantization.mxfp8_grouped_quantize"


def test_mxfp8_grouped_calls_are_routed_and_quantize_each_groups_rows():
    a = _bf16(2, 6, 4096, seed=6)
    a[0, 0, :32] = 0.0  # an all-zero block: scale byte 0
    mask, seen = torch.tensor([6, 2], dtype=torch.int32), []
    with rt.enable_apply({GROUPED: _recorder(GROUPED, seen)}, strict=True):
        q, sf = flashinfer.mxfp8_grouped_quantize(a, mask)
    assert len(seen) == 1
    # As FlashInfer returns them (fp8_quantization.py): [B, M, K] permuted to [M, K, B];
    # per group, the 128x4 layout of [M padded to 128, K / 32] bytes, viewed
    # [32, 4, M tiles, 4, K tiles, B].
    assert q.dtype == torch.float8_e4m3fn and q.shape == (6, 4096, 2)
    assert q.stride() == (4096, 1, 6 * 4096)
    assert sf.dtype == torch.uint8 and sf.shape == (32, 4, 1, 4, 32, 2)
    storage = sf.permute(5, 2, 4, 0, 1, 3).reshape(2, -1)
    for b in range(2):
        n = int(mask[b])
        # The catalogue's mxfp8_quantize on the group's valid rows: the same format
        # (its kernel rounds amax * (1/448) up, this one amax / 448: the same exponent
        # but at the rare amax where the two roundings part).
        want_q, want_sf = _reference("mxfp8_quantize_k4096")(a[b, :n])
        assert torch.equal(q[:n, :, b].view(torch.uint8), want_q.view(torch.uint8))
        assert (q[n:, :, b].float() == 0).all()
        linear = torch.zeros(6, 128, dtype=torch.uint8)
        linear[:n] = want_sf.view(torch.uint8)
        assert torch.equal(storage[b], _swizzled_128x4(linear))
    assert storage[0][0] == 0 and (q[0, :32, 0].float() == 0).all()


def test_a_cake_mxfp8_grouped_call_falls_back():
    seen: list = []
    mask = torch.tensor([2, 1], dtype=torch.int32)
    with rt.enable_apply({GROUPED: _recorder(GROUPED, seen)}):
        with pytest.raises(FLASHINFER_ON_CPU):
            flashinfer.mxfp8_grouped_quantize(_bf16(2, 2, 4096), mask, backend="cake")
    assert not seen
    assert rt.stats()[GROUPED_PATH]["rules"] == {"backend": 1}


# ---------------------------------------------------------------------------------------
# nvfp4_quantize_smooth
# ---------------------------------------------------------------------------------------


def test_nvfp4_smooth_calls_are_routed_and_quantize_the_smoothed_input():
    name, seen = "nvfp4_quantize_smooth_n3072", []
    x = _bf16(5, 3072, seed=7, scale=1.0)
    pqs = (torch.rand(3072, generator=torch.Generator().manual_seed(8)) + 0.5).bfloat16()
    gs = torch.tensor([160.0])
    with rt.enable_apply({name: _recorder(name, seen)}, strict=True):
        xq, sf = flashinfer.nvfp4_quantize_smooth(x, pqs, gs)
        xq2, sf2 = flashinfer.nvfp4_quantize_smooth(x, pqs, gs, enable_pdl=True, backend="cutlass")
    assert len(seen) == 2 and torch.equal(xq, xq2) and torch.equal(sf, sf2)
    # As FlashInfer returns them (gemm_svdquant.py): uint8 [M, N/2], and the scales' flat
    # 128x4 buffer of 128 padded rows times 192 scale columns.
    assert xq.dtype == sf.dtype == torch.uint8 and xq.shape == (5, 1536)
    assert sf.shape == (128 * 192,)
    # fp4_quantize of the bf16 product: the catalogue's NVFP4 recipe.
    h = (x.float() * pqs.float()).bfloat16()
    want_q, want_sf = _reference("fp4_quantize_k4096")(h, gs)
    assert torch.equal(xq, want_q.view(torch.uint8))
    assert torch.equal(sf, _swizzled_128x4(want_sf.view(torch.uint8)))
