"""The MiniMax-H3 families of minimax_h3.fidef, held to the real FlashInfer 0.7.2 on the CPU.

Routing: FlashInfer's own entry points are called with apply on and a solution that records
what it is given and returns what the reference does; the send buffers come back in the
caller's tensors, the scales in the per-destination 128x4 layout (Note [minimax send-buffer
scales]), checked against the catalogue's fp4_quantize and mxfp8_quantize on each
destination's rows, laid out one scale at a time. A call the definitions do not model is
refused, counted with its rule, and goes to FlashInfer itself, which raises here.

The bf16 pre-attention reference is checked on a narrow hidden size against the formula
written out in float64 (its roundings to bf16 where the kernel rounds).
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from _routable_minimax import BF16, PACK_MXFP8, PACK_NVFP4, bf16_call, pack_call
from _shared import catalogue_module, require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import flashinfer.diffusion_ops as diffusion_ops  # noqa: E402

import fibgen.runtime as rt  # noqa: E402

PACK_PATH = "flashinfer.cake_minimax_h3.MiniMaxH3QkvQuantizePack.run"
BF16_PATH = "flashinfer.diffusion_ops.minimax_h3.minimax_h3_bf16_pre_attention"
pytestmark = pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning")


@functools.cache
def _catalogue():
    from _routable_calls import Catalogue

    return Catalogue(catalogue_module())


@functools.cache
def _reference(name):
    d = _catalogue().defs[name]
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
    def solution(**inputs):
        seen.append(inputs)
        return _reference(name)(**inputs)

    return solution


def _swizzled(scales: torch.Tensor) -> torch.Tensor:
    """[R, C] scale bytes in the 128x4 layout, rows padded to 128 with zeros, one at a time."""
    r_n, c_n = scales.shape
    out = torch.zeros(-(-r_n // 128) * 128 * c_n, dtype=torch.uint8)
    for r in range(r_n):
        for c in range(c_n):
            offset = c % 4 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
            out[offset + (r // 128) * 128 * c_n] = scales[r, c]
    return out


# ---------------------------------------------------------------------------------------
# MiniMaxH3QkvQuantizePack.run
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [PACK_NVFP4, PACK_MXFP8])
def test_qkv_pack_calls_are_routed_into_the_callers_send_buffer(name):
    call, seen = pack_call(_catalogue(), name), []
    op, kw = call.args[0], call.kwargs
    nvfp4 = name == PACK_NVFP4
    with rt.enable_apply({name: _recorder(name, seen)}, strict=True):
        out_q, out_sf = op.run(**kw)
    assert len(seen) == 1
    assert out_q is kw["out_q"] and out_sf is kw["out_sf"]
    p, m = out_q.shape[0], out_q.shape[1]
    hdst = 56 // p
    # Destination p, token t, local head h, kind c is head p * hdst + h of q, k or v: each
    # row quantized as the catalogue's fp4_quantize / mxfp8_quantize quantize a row.
    rows = torch.stack((kw["q"], kw["k"], kw["v"]), dim=2)  # [M, 56, 3, 128]
    if nvfp4:
        quantize = _reference("fp4_quantize_k4096")
        gs = kw["out_global_scale"]
    else:
        quantize = _reference("mxfp8_quantize_k4096")
    for dst in range(p):
        mine = rows[:, dst * hdst : (dst + 1) * hdst].reshape(-1, 128)
        want_q, want_sf = quantize(mine, gs) if nvfp4 else quantize(mine)
        got_q = out_q[dst].reshape(mine.shape[0], -1).view(torch.uint8)
        assert torch.equal(got_q, want_q.view(torch.uint8))
        # The caller's 0xFF filler is overwritten everywhere: padding rows are zero.
        assert torch.equal(out_sf[dst], _swizzled(want_sf.view(torch.uint8)))
    assert m * hdst * 3 % 128 != 0  # the instance exercises the padding rows


def test_a_qkv_pack_call_with_tensors_it_was_not_bound_to_falls_back():
    call, seen = pack_call(_catalogue(), PACK_MXFP8), []
    op, kw = call.args[0], dict(call.kwargs)
    kw["q"] = kw["q"].clone()
    with rt.enable_apply({PACK_MXFP8: _recorder(PACK_MXFP8, seen)}):
        with pytest.raises(ValueError, match="cannot be rebound"):
            op.run(**kw)
    assert not seen
    assert sum(rt.stats()[PACK_PATH]["rules"].values()) == 1


# ---------------------------------------------------------------------------------------
# minimax_h3_bf16_pre_attention
# ---------------------------------------------------------------------------------------


def _bf(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).double()


def _pre_attention_by_hand(x, xw, scale, shift, index, w, qw, kw, cache, pos, p, eps, qk_eps):
    """The kernel's formula in float64, rounded to bf16 where the kernel rounds."""
    m = x.shape[0]
    xd = x.double()
    n = _bf(xw.double() * xd / (xd.pow(2).mean(-1, keepdim=True) + eps).sqrt())
    a = torch.zeros_like(n)
    for t in range(m):
        i = int(index[t])
        if 0 <= i < scale.shape[0]:
            a[t] = _bf(n[t] * _bf(scale[i].double() + 1) + shift[i].double())
    y = _bf(a @ w.double().t()).reshape(m, 3, -1, 128)
    out = torch.empty(m, y.shape[2], 3, 128, dtype=torch.float64)
    for t in range(m):
        r = min(max(int(pos[t]), 0), cache.shape[0] - 1)
        cos, sin = cache[r, :48].double(), cache[r, 48:].double()
        for c, nw in ((0, qw), (1, kw)):
            h = y[t, c]
            h = _bf(nw.double() * h / (h.pow(2).mean(-1, keepdim=True) + qk_eps).sqrt())
            lo, hi = h[:, :48].clone(), h[:, 48:96].clone()
            h[:, :48], h[:, 48:96] = lo * cos - hi * sin, hi * cos + lo * sin
            out[t, :, c] = h
        out[t, :, 2] = y[t, 2]
    heads = y.shape[2]
    return out.reshape(m, p, heads // p, 3, 128).permute(1, 0, 2, 3, 4)


def test_bf16_pre_attention_reference_is_the_kernels_formula():
    # A narrow stand-in (hidden 64, 4 heads): the reference reads its sizes from the tensors.
    g = torch.Generator().manual_seed(3)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).bfloat16()

    m, hidden, heads, p = 5, 64, 4, 2
    x, xw = rnd(m, hidden), (torch.rand(hidden, generator=g) + 0.5).bfloat16()
    scale, shift = rnd(3, hidden, s=0.3), rnd(3, hidden, s=0.3)
    index = torch.tensor([0, 2, 1, 3, -1])  # 3 and -1: outside the table, zero rows
    w = rnd(3 * heads * 128, hidden, s=0.2)
    qw, kw = rnd(128, s=0.2) + 1, rnd(128, s=0.2) + 1
    cache = rnd(4, 96)
    pos = torch.tensor([0, 3, 9, -2, 1])  # clamped into the cache's 4 rows
    out = torch.zeros(p, m, heads // p, 3, 128, dtype=torch.bfloat16)
    run = _reference(BF16)
    got = run(x, xw, scale, shift, index, w, qw, kw, cache, pos, out, 1e-5, 1e-3)
    want = _pre_attention_by_hand(x, xw, scale, shift, index, w, qw, kw, cache, pos, p, 1e-5, 1e-3)
    assert got.shape == out.shape and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)
    assert (got[:, 3:].double() == 0).sum() > 0 and (got[:, 3:, :, 2] == 0).all()


def test_bf16_pre_attention_calls_are_routed_with_its_defaults():
    call, seen = bf16_call(_catalogue()), []
    kw = dict(call.kwargs)
    kw.pop("qk_eps"), kw.pop("rope_positions")  # None: eps and the identity
    with rt.enable_apply({BF16: _recorder(BF16, seen)}, strict=True):
        got = diffusion_ops.minimax_h3_bf16_pre_attention(*call.args, **kw)
    assert len(seen) == 1 and got is kw["out"]
    (inputs,) = seen
    assert inputs["qk_eps"] == inputs["eps"] == 1e-5
    assert torch.equal(inputs["rope_positions"], torch.arange(3))
    p = kw["ulysses_degree"]
    assert got.shape == (p, 3, 56 // p, 3, 128) and got.abs().sum() > 0


def test_a_bf16_pre_attention_call_with_a_short_rope_cache_falls_back():
    call, seen = bf16_call(_catalogue()), []
    args, kw = list(call.args), dict(call.kwargs)
    args[8] = args[8][:2]  # 2 cache rows for 3 tokens, and no positions
    kw["rope_positions"] = None
    with rt.enable_apply({BF16: _recorder(BF16, seen)}):
        with pytest.raises(ValueError, match="rope_cos_sin has 2 rows"):
            diffusion_ops.minimax_h3_bf16_pre_attention(*args, **kw)
    assert not seen
    assert sum(rt.stats()[BF16_PATH]["rules"].values()) == 1


# ---------------------------------------------------------------------------------------
# MiniMaxH3Mxfp8PreAttention.run
# ---------------------------------------------------------------------------------------

MXFP8_PATH = "flashinfer.cake_minimax_h3.MiniMaxH3Mxfp8PreAttention.run"


def _swizzle_rows(scales: torch.Tensor) -> torch.Tensor:
    """[R, C] bytes, R padded to 128, in the 128x4 layout (as mxfp8_quantize lays them out)."""
    r, c = scales.shape
    padded = torch.nn.functional.pad(scales, (0, 0, 0, (-r) % 128))
    return padded.reshape(-1, 4, 32, c // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)


# Seconds: the reference dequantizes the whole [21504, 5376] projection.
@pytest.mark.slow
def test_mxfp8_pre_attention_is_the_catalogues_quantize_gemm_and_pack():
    from _routable_minimax import MXFP8, mxfp8_call

    call, seen = mxfp8_call(_catalogue()), []
    op, kw = call.args[0], call.kwargs
    with rt.enable_apply({MXFP8: _recorder(MXFP8, seen)}, strict=True):
        out_q, out_sf = op.run(**kw)
    assert len(seen) == 1 and out_q is kw["out_q"] and out_sf is kw["out_sf"]
    # The same pipeline from other families' references and the GEMM written out: the
    # activation as mxfp8_quantize quantizes it; the projection, whose weight the builder
    # makes 1 beyond its first 64 columns, as the block sums of the dequantized activation
    # times each weight row's block scales, plus the first two blocks in full; Q/K norm and
    # RoPE written out; the pack as minimax_h3_qkv_quantize_pack_mxfp8 packs bf16 q, k, v.
    x, i = kw["x"].double(), kw["adaln_index"].long()
    n = _bf(kw["x_norm_weight"].double() * x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
    a = _bf(n * _bf(kw["adaln_scale"][i].double() + 1) + kw["adaln_shift"][i].double())
    a_q, a_e = _reference("mxfp8_quantize_k4096")(a.bfloat16())
    a_deq = (
        a_q.double().reshape(3, 168, 32)
        * torch.exp2(a_e.view(torch.uint8).double() - 127)[..., None]
    )
    w, w_sf = kw["qkv_weight_q"], kw["qkv_weight_sf"]
    w_e = w_sf.reshape(168, 42, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(21504, 168)
    w_scale = torch.exp2(w_e.double() - 127)  # [N, 168]
    y = a_deq[:, 2:].sum(-1) @ w_scale[:, 2:].t()
    head = w[:, :64].double().reshape(21504, 2, 32) * w_scale[:, :2, None]
    y += a_deq[:, :2].reshape(3, 64) @ head.reshape(21504, 64).t()
    y = _bf(y)
    y = y.double().reshape(3, 56, 3, 128)  # [M, head, kind, d]
    heads = []
    for c, nw in ((0, kw["q_norm_weight"]), (1, kw["k_norm_weight"])):
        h = y[:, :, c]
        h = _bf(nw.double() * h / (h.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
        cos = kw["rope_cos_sin"][:, None, :48].double()
        sin = kw["rope_cos_sin"][:, None, 48:].double()
        lo, hi = h[..., :48], h[..., 48:96]
        heads.append(torch.cat((lo * cos - hi * sin, hi * cos + lo * sin, h[..., 96:]), -1))
    q, k, v = (t.bfloat16() for t in (*heads, y[:, :, 2]))
    want_q, want_sf = _reference(PACK_MXFP8.replace("_p2_hdst28", "_p8_hdst7"))(q, k, v)
    same = out_q.view(torch.uint8) == want_q.view(torch.uint8)
    # float64 here, float32 there: a value on an e4m3 rounding boundary may take the
    # neighbouring code.
    assert same.float().mean() > 0.995
    want_sf = torch.stack([_swizzle_rows(s.reshape(-1, 4).view(torch.uint8)) for s in want_sf])
    assert (out_sf == want_sf).float().mean() > 0.995


def test_an_mxfp8_pre_attention_call_asking_for_debug_outputs_falls_back():
    from _routable_minimax import MXFP8, mxfp8_call

    call, seen = mxfp8_call(_catalogue(), m=1), []
    op, kw = call.args[0], dict(call.kwargs)
    debug = torch.zeros(1, 56, 128, dtype=torch.bfloat16)
    kw |= {"debug_q_bf16": debug, "debug_k_bf16": debug.clone()}
    op.__dict__["_bound_tensors"] = dict(kw)
    with rt.enable_apply({MXFP8: _recorder(MXFP8, seen)}):
        with pytest.raises(Exception):  # noqa: B017 - FlashInfer's prepared route, absent here
            op.run(**kw)
    assert not seen
    assert sum(rt.stats()[MXFP8_PATH]["rules"].values()) == 1


# ---------------------------------------------------------------------------------------
# MiniMaxH3Nvfp4PreAttention.run
# ---------------------------------------------------------------------------------------

NVFP4_PATH = "flashinfer.cake_minimax_h3.MiniMaxH3Nvfp4PreAttention.run"
E2M1 = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
)


def _unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 pairs, low nibble first, as float64 values."""
    b = packed.view(torch.uint8).long()
    return torch.stack((E2M1[b & 15], E2M1[b >> 4]), dim=-1).flatten(-2).double()


# Seconds: the reference dequantizes the whole [21504, 5376] projection.
@pytest.mark.slow
def test_nvfp4_pre_attention_is_the_catalogues_quantize_gemm_and_pack():
    from _routable_minimax import NVFP4, nvfp4_call

    call, seen = nvfp4_call(_catalogue()), []
    op, kw = call.args[0], call.kwargs
    with rt.enable_apply({NVFP4: _recorder(NVFP4, seen)}, strict=True):
        out_q, out_sf = op.run(**kw)
    assert len(seen) == 1 and out_q is kw["out_q"] and out_sf is kw["out_sf"]
    # The same pipeline from other families' references and the GEMM written out: the
    # activation as fp4_quantize quantizes it with x_global_scale; the projection, whose
    # weight the builder makes 1.0 beyond its first 64 values a row, as the block sums of
    # the dequantized activation times each weight row's block scales, plus the first four
    # blocks in full, times 1 / (x_global_scale * w_global_scale); Q/K norm and RoPE
    # written out; the pack as minimax_h3_qkv_quantize_pack_nvfp4 packs bf16 q, k, v.
    x, i = kw["x"].double(), kw["adaln_index"].long()
    n = _bf(kw["x_norm_weight"].double() * x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
    a = _bf(n * _bf(kw["adaln_scale"][i].double() + 1) + kw["adaln_shift"][i].double())
    a_q, a_sf = _reference("fp4_quantize_k4096")(a.bfloat16(), kw["x_global_scale"])
    a_deq = _unpack_e2m1(a_q).reshape(3, 336, 16) * a_sf.double()[..., None]
    w_sf = kw["qkv_weight_sf"].view(torch.float8_e4m3fn).double()
    w_sf = w_sf.reshape(168, 84, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(21504, 336)
    y = a_deq[:, 4:].sum(-1) @ w_sf[:, 4:].t()
    head = _unpack_e2m1(kw["qkv_weight_q"][:, :32]).reshape(21504, 4, 16) * w_sf[:, :4, None]
    y += a_deq[:, :4].reshape(3, 64) @ head.reshape(21504, 64).t()
    y = _bf(y / (kw["x_global_scale"].double() * kw["w_global_scale"].double()))
    y = y.reshape(3, 56, 3, 128)  # [M, head, kind, d]
    heads = []
    for c, nw in ((0, kw["q_norm_weight"]), (1, kw["k_norm_weight"])):
        h = y[:, :, c]
        h = _bf(nw.double() * h / (h.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
        cos = kw["rope_cos_sin"][:, None, :48].double()
        sin = kw["rope_cos_sin"][:, None, 48:].double()
        lo, hi = h[..., :48], h[..., 48:96]
        heads.append(torch.cat((lo * cos - hi * sin, hi * cos + lo * sin, h[..., 96:]), -1))
    q, k, v = (t.bfloat16() for t in (*heads, y[:, :, 2]))
    want_q, want_sf = _reference(PACK_NVFP4)(q, k, v, kw["out_global_scale"])
    same = out_q == want_q.view(torch.uint8)
    # float64 here, float32 there: a value on an e2m1 rounding boundary may take the
    # neighbouring code.
    assert same.float().mean() > 0.99
    want_sf = torch.stack([_swizzle_rows(s.reshape(-1, 8).view(torch.uint8)) for s in want_sf])
    assert (out_sf == want_sf).float().mean() > 0.99


def test_an_nvfp4_pre_attention_call_with_a_rebound_global_scale_falls_back():
    from _routable_minimax import NVFP4, nvfp4_call

    call, seen = nvfp4_call(_catalogue(), m=1), []
    op, kw = call.args[0], dict(call.kwargs)
    kw["x_global_scale"] = kw["x_global_scale"].clone()
    with rt.enable_apply({NVFP4: _recorder(NVFP4, seen)}):
        with pytest.raises(ValueError, match="cannot be rebound"):
            op.run(**kw)
    assert not seen
    assert sum(rt.stats()[NVFP4_PATH]["rules"].values()) == 1
