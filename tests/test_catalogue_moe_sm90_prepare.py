"""The MoE weight preparation families: SM90 mixed-input (moe_sm90_mixed_prepare.fidef) and
AlphaMoE's gate/up interleave (moe_alphamoe.fidef).

interleave_moe_scales_for_sm90_mixed_gemm is torch in FlashInfer, so its reference is held
to FlashInfer's own function on the CPU. interleave_moe_weights_for_sm90_mixed_gemm runs a
CUDA kernel; its reference (index tensors) is held to a line-by-line transcription of that
kernel's loops below (moe_gemm_mixed_utils.cu), thread by thread, and on an H100 to the
kernel itself (benchmarks/flashinfer_conformance.py). Then calls through the real API with a
recorder in place of FlashInfer's function: routed, with FlashInfer's uint8 returned.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from _shared import require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

from test_catalogue_gemm import (
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

SCALES = "flashinfer.fused_moe.interleave_moe_scales_for_sm90_mixed_gemm"
WEIGHTS = "flashinfer.fused_moe.interleave_moe_weights_for_sm90_mixed_gemm"


# ---------------------------------------------------------------------------------------
# The CUDA kernels, transcribed: one iteration of the loops per (block, partition, lane)
# ---------------------------------------------------------------------------------------

FP4_MASKS = [
    (0b00000000000000000000000010000000, "<<", 24),
    (0b00000000000000000000000001110000, "<<", 18),
    (0b00000000000000000000000000001000, "<<", 12),
    (0b00000000000000000000000000000111, "<<", 6),
    (0b00000000000000001000000000000000, "<<", 13),
    (0b00000000000000000111000000000000, "<<", 7),
    (0b00000000000000000000100000000000, "<<", 1),
    (0b00000000000000000000011100000000, ">>", 5),
    (0b00000000100000000000000000000000, "<<", 2),
    (0b00000000011100000000000000000000, ">>", 4),
    (0b00000000000010000000000000000000, ">>", 10),
    (0b00000000000001110000000000000000, ">>", 16),
    (0b10000000000000000000000000000000, ">>", 1),
    (0b00010000000000000000000000000000, "<<", 1),
    (0b01100000000000000000000000000000, ">>", 3),
    (0b00001000000000000000000000000000, ">>", 13),
    (0b00000001000000000000000000000000, ">>", 11),
    (0b00000110000000000000000000000000, ">>", 15),
]


def _kernel_fp4(src: list[int], rows: int, cols: int) -> list[int]:
    dst = [0] * len(src)
    for block_id in range(rows // 2):
        for partition_id in range(cols // 64):
            for lane_id in range(16):
                row_id = block_id // 8 * 16 + block_id % 8
                mma_id = lane_id // 4
                dst_row_id = row_id + (mma_id % 2) * 8
                interleaved_lane_id = lane_id // 8 * 16 + (lane_id % 4) * 4
                col_id = partition_id * 32 + mma_id * 8 + lane_id % 4
                dst_col_id = partition_id * 32 + interleaved_lane_id
                first = row_id * cols // 2 + col_id
                second = (row_id + 8) * cols // 2 + col_id
                raw = src[first] | src[second] << 8 | src[first + 4] << 16
                raw |= src[second + 4] << 24
                out = 0
                for mask, op, shift in FP4_MASKS:
                    out |= ((raw & mask) << shift if op == "<<" else (raw & mask) >> shift) & (
                        0xFFFFFFFF
                    )
                dst_id = dst_row_id * cols // 2 + dst_col_id
                for j in range(4):
                    dst[dst_id + j] = (out >> (8 * j)) & 0xFF
    return dst


def _signs_for_fp8(x: int) -> int:
    em = x & 0x77777777
    signs = (
        ((x & 0x00000008) << 4)
        | ((x & 0x00000080) << 8)
        | ((x & 0x00000800) << 12)
        | ((x & 0x00008000) << 16)
        | ((x & 0x00080000) >> 16)
        | ((x & 0x00800000) >> 12)
        | ((x & 0x08000000) >> 8)
        | ((x & 0x80000000) >> 4)
    )
    return em | signs


def _kernel_16bit(src: list[int], rows: int, cols: int, signs: bool) -> list[int]:
    u = [src[2 * i] | src[2 * i + 1] << 8 for i in range(len(src) // 2)]
    dst = [0] * len(u)
    for block_id in range(rows // 2):
        for partition_id in range(cols // 64):
            for lane_id in range(16):
                row_id = block_id // 8 * 16 + block_id % 8
                dst_row_id = row_id + (lane_id % 8) // 4 * 8
                mma_id = lane_id // 8
                interleaved_lane_id = mma_id * 8 + lane_id % 4 * 2
                col_id = partition_id * 16 + lane_id
                dst_col_id = partition_id * 16 + interleaved_lane_id
                a = u[row_id * cols // 4 + col_id]
                b = u[(row_id + 8) * cols // 4 + col_id]
                if signs:
                    x = _signs_for_fp8(a | b << 16)
                    a, b = x & 0xFFFF, x >> 16
                dst_id = dst_row_id * cols // 4 + dst_col_id
                dst[dst_id], dst[dst_id + 1] = a, b
    return [byte for w in dst for byte in (w & 0xFF, w >> 8)]


def _kernel(weight: torch.Tensor, quant_type: str) -> torch.Tensor:
    """FlashInfer's interleave, expert by expert, as its CUDA kernels compute it."""
    experts, n, kb = weight.shape
    out = []
    for e in range(experts):
        src = weight[e].reshape(-1).tolist()
        if quant_type == "fp4":
            dst = _kernel_fp4(src, n, 2 * kb)
        else:
            dst = _kernel_16bit(src, n, 2 * kb, signs=quant_type == "fp4_fp8")
        out.append(torch.tensor(dst, dtype=torch.uint8).reshape(n, kb))
    return torch.stack(out)


def _blocked(w: torch.Tensor) -> torch.Tensor:
    """[E, n, k / 2] uint8 as the definition reads it: int8 in blocks of 16 rows, 32 bytes."""
    e, n, kb = w.shape
    return w.view(torch.int8).reshape(e, n // 16, 16, kb // 32, 32)


def _weights(experts=2, n=32, kb=64, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (experts, n, kb), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("quant_type", ["fp4", "fp4_fp8", "int4"])
def test_the_weight_interleave_reference_is_flashinfers_kernel(quant_type):
    w = _weights()
    got = _reference(f"sm90_mixed_gemm_weight_interleave_{quant_type}")(_blocked(w))
    assert got.dtype == torch.int8 and got.shape == _blocked(w).shape
    assert torch.equal(got.reshape(w.shape).view(torch.uint8), _kernel(w, quant_type))


def test_the_int4_weight_interleave_only_moves_bytes():
    # A permutation: every byte of each expert once; fp4 and fp4_fp8 move bits as well.
    w = _weights(experts=1, n=16, kb=32)
    got = _reference("sm90_mixed_gemm_weight_interleave_int4")(_blocked(w))
    got = got.reshape(w.shape).view(torch.uint8)
    assert torch.equal(got.reshape(-1).sort().values, w.reshape(-1).sort().values)
    assert not torch.equal(got, w)


@pytest.mark.parametrize("quant_type", ["fp4", "fp4_fp8", "int4"])
def test_a_weight_interleave_call_is_routed_and_returns_uint8(monkeypatch, quant_type):
    w = _weights(seed=1)
    name = f"sm90_mixed_gemm_weight_interleave_{quant_type}"
    out = _route(monkeypatch, WEIGHTS, name, (w,), {"quant_type": quant_type})
    seen = _hit(out)
    assert seen["weight"].dtype == torch.int8 and seen["weight"].shape == (2, 2, 16, 2, 32)
    assert out.result.shape == w.shape
    assert out.result.dtype == torch.uint8 and torch.equal(out.result, _kernel(w, quant_type))


def test_a_weight_interleave_call_with_flashinfers_default_is_fp4(monkeypatch):
    w = _weights(seed=2)
    out = _route(monkeypatch, WEIGHTS, "sm90_mixed_gemm_weight_interleave_fp4", (w,), {})
    _hit(out)
    assert torch.equal(out.result, _kernel(w, "fp4"))


@pytest.mark.parametrize(
    "weight",
    [
        _weights(n=24),  # rows not a multiple of 16
        _weights(kb=48),  # K not a multiple of 64
    ],
)
def test_weights_the_kernel_refuses_fall_back(monkeypatch, weight):
    out = _route(monkeypatch, WEIGHTS, "sm90_mixed_gemm_weight_interleave_fp4", (weight,), {})
    assert out.counts["hit"] == 0 and not out.seen, out.counts
    assert out.result == "flashinfer" and len(out.originals) == 1


def test_an_unknown_quant_type_falls_back(monkeypatch):
    out = _route(
        monkeypatch,
        WEIGHTS,
        "sm90_mixed_gemm_weight_interleave_fp4",
        (_weights(),),
        {"quant_type": "nvfp4"},
    )
    assert out.counts["hit"] == 0 and out.result == "flashinfer"


# ---------------------------------------------------------------------------------------
# interleave_moe_scales_for_sm90_mixed_gemm
# ---------------------------------------------------------------------------------------


def _flashinfers_scales_interleave():
    from flashinfer.fused_moe import interleave_moe_scales_for_sm90_mixed_gemm as fn

    return inspect.unwrap(fn)


@pytest.mark.parametrize(
    ("dtype", "group_size", "name"),
    [
        (torch.uint8, 32, "sm90_mixed_gemm_scale_interleave_g32_i8"),
        (torch.bfloat16, 128, "sm90_mixed_gemm_scale_interleave_g128_bf16"),
    ],
)
def test_a_scale_interleave_call_is_routed_and_is_flashinfers_layout(
    monkeypatch, dtype, group_size, name
):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.uint8:
        scales = torch.randint(100, 140, (3, 128, 8 * 128 // group_size), dtype=dtype, generator=g)
    else:
        scales = torch.rand(3, 128, 8, generator=g).to(dtype)
    expected = _flashinfers_scales_interleave()(scales, group_size)
    kwargs = {} if group_size == 32 else {"group_size": group_size}
    out = _route(monkeypatch, SCALES, name, (scales,), kwargs)
    seen = _hit(out)
    assert seen["scales"].shape == (3, 2, 64, 8, 128 // group_size)
    assert out.result.dtype == dtype and torch.equal(out.result, expected)


@pytest.mark.parametrize(
    ("scales", "group_size"),
    [
        (torch.zeros(2, 96, 8, dtype=torch.uint8), 32),  # rows not a multiple of 64
        (torch.zeros(2, 64, 6, dtype=torch.uint8), 32),  # K not a multiple of 128
        (torch.zeros(2, 64, 8, dtype=torch.uint8), 64),  # a group size with no definition
        (torch.zeros(2, 64, 8, dtype=torch.float32), 32),  # no dtype of the definition
    ],
)
def test_scales_that_do_not_fold_fall_back(monkeypatch, scales, group_size):
    name = "sm90_mixed_gemm_scale_interleave_g32_i8"
    out = _route(monkeypatch, SCALES, name, (scales,), {"group_size": group_size})
    assert out.counts["hit"] == 0 and not out.seen, out.counts
    assert out.result == "flashinfer" and len(out.originals) == 1


def test_every_scale_instance_matches_flashinfer_on_generated_inputs():
    fn = _flashinfers_scales_interleave()
    for name, d in _catalogue().defs.items():
        if d.family != "interleave_moe_scales_for_sm90_mixed_gemm":
            continue
        x, _ = _catalogue().inputs(name, num_experts=2, m64_blocks=3, k128_blocks=2)
        group_size = dict(d.param_values)["group_size"]
        logical = x["scales"].reshape(2, 3 * 64, -1)
        expected = fn(
            logical.view(torch.uint8) if logical.dtype == torch.int8 else logical, group_size
        )
        got = _reference(name)(x["scales"])
        assert torch.equal(got.view(expected.dtype), expected), name


# ---------------------------------------------------------------------------------------
# alphamoe_interleave_gated_weights
# ---------------------------------------------------------------------------------------

ALPHAMOE = "flashinfer.fused_moe.alphamoe_interleave_gated_weights"


def test_alphamoe_interleave_is_routed_and_is_flashinfers_layout(monkeypatch):
    import _gemm_moe_calls as calls
    from flashinfer.fused_moe import alphamoe_interleave_gated_weights as fn

    call = calls.alphamoe_interleave(_catalogue())
    w, s = call.args
    expected = inspect.unwrap(fn)(w, s)
    out = _route(monkeypatch, ALPHAMOE, call.name, call.args, {})
    _hit(out)
    weights, scales = out.result
    assert weights.dtype == torch.float8_e4m3fn and scales.dtype == torch.float32
    assert torch.equal(weights.view(torch.uint8), expected[0].view(torch.uint8))
    assert torch.equal(scales, expected[1])
    # Eight gate rows, then the first eight up rows (the up half starts at row 128).
    assert torch.equal(weights[:, 8:16].view(torch.uint8), w[:, 128:136].view(torch.uint8))


def test_alphamoe_interleave_of_a_shape_with_no_instance_falls_back(monkeypatch):
    w = torch.zeros(4, 512, 384).to(torch.float8_e4m3fn)  # hidden size 384: no instance
    s = torch.ones(4, 4, 3)
    out = _route(monkeypatch, ALPHAMOE, "alphamoe_interleave_gated_weights_h256_i128", (w, s), {})
    assert out.counts["hit"] == 0 and not out.seen, out.counts
    assert out.result == "flashinfer"


# ---------------------------------------------------------------------------------------
# preprocess_moe_weights_for_sm90_mixed_gemm_humming: FlashInfer's torch helpers run on the
# CPU (they only refuse tensors that are not on CUDA), then its two interleaves
# ---------------------------------------------------------------------------------------

HUMMING = "flashinfer.fused_moe.preprocess_moe_weights_for_sm90_mixed_gemm_humming"


def _humming_bytes(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    weight = torch.randint(0, 256, (2, 64, 64), generator=g, dtype=torch.uint8)
    # Expert 0 spans 20 exponents (clamped to 11), expert 1 only 6.
    spans = torch.tensor([20, 6]).view(2, 1, 1)
    scale = 110 + (torch.rand(2, 64, 4, generator=g) * spans).round().to(torch.uint8)
    return weight, scale


def _flashinfer_logical(monkeypatch, weight, scale, max_range=11):
    from flashinfer.fused_moe import prepare

    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    offset, residual, delta = prepare._preprocess_humming_e8m0_weight_scale(scale, max_range)
    payload = prepare._process_humming_mxfp4_w4a8_payload(weight, delta)
    monkeypatch.undo()
    return payload, offset, residual


def test_the_humming_logical_reference_is_flashinfers_rewrite(monkeypatch):
    weight, scale = _humming_bytes(0)
    want = _flashinfer_logical(monkeypatch, weight, scale)
    assert int((want[0] != weight).sum()) > 0  # the clamp rewrote some codes
    got = _reference("sm90_mixed_gemm_humming_preprocess_logical_r11")(
        weight.view(torch.int8), scale.view(torch.int8)
    )
    assert torch.equal(got[0].view(torch.uint8), want[0])
    assert torch.equal(got[1].view(torch.uint8), want[1])
    assert torch.equal(got[2], want[2])


def test_the_humming_reference_is_the_rewrite_then_flashinfers_interleaves(monkeypatch):
    weight, scale = _humming_bytes(1)
    payload, offset, residual = _flashinfer_logical(monkeypatch, weight, scale)
    from flashinfer.fused_moe.prepare import interleave_moe_scales_for_sm90_mixed_gemm

    folded = inspect.unwrap(interleave_moe_scales_for_sm90_mixed_gemm)(offset)
    interleaved = _reference("sm90_mixed_gemm_weight_interleave_fp4_fp8")(
        payload.view(torch.int8).reshape(2, 4, 16, 2, 32)
    )
    got = _reference("sm90_mixed_gemm_humming_preprocess_r11")(
        weight.view(torch.int8).reshape(2, 4, 16, 2, 32),
        scale.view(torch.int8).reshape(2, 1, 64, 1, 4),
    )
    assert torch.equal(got[0], interleaved)
    assert torch.equal(got[1].view(torch.uint8), folded)
    assert torch.equal(got[2], residual)


@pytest.mark.parametrize("interleave", [True, False])
def test_a_humming_call_is_routed_by_its_layout_and_returns_uint8(monkeypatch, interleave):
    weight, scale = _humming_bytes(2)
    name = "sm90_mixed_gemm_humming_preprocess_" + ("r11" if interleave else "logical_r11")
    out = _route(monkeypatch, HUMMING, name, (weight, scale), {"interleave": interleave})
    seen = _hit(out)
    assert seen["weight"].data_ptr() == weight.data_ptr()
    processed, offsets, residual = out.result
    assert processed.dtype == offsets.dtype == torch.uint8 and processed.shape == weight.shape
    assert offsets.shape == ((2, 1, 1, 16, 16) if interleave else scale.shape)
    assert residual.shape == (2,) and residual.dtype == torch.float32


def test_a_humming_call_with_another_range_falls_back(monkeypatch):
    # The definitions are Humming's range, 11: a call for 8 names none of them.
    weight, scale = _humming_bytes(3)
    name = "sm90_mixed_gemm_humming_preprocess_r11"
    _refused(_route(monkeypatch, HUMMING, name, (weight, scale, 8), {}), None)
