"""The SM120 NVFP4 attention families of attention_nvfp4_sm120.fidef against the real
FlashInfer 0.7.2.post1.

Its kernels run on SM120/SM121 only, so they are never run here: the real function is
replaced by a recorder with its signature before apply is enabled, and each check calls the
patched API (a call is routed, with the inputs the definition declares, or refused with its
rule counted). The references are checked against the kernels' layouts written out one
element at a time, against FlashInfer's own e2m1 helpers, and against plain attention.
"""

from __future__ import annotations

import functools
import inspect
import math

import pytest
import torch
from _shared import catalogue_module, require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import flashinfer.nvfp4_attention_sm120 as fa  # noqa: E402
from flashinfer.trace.templates import quantize as fi_quantize  # noqa: E402

import fibgen.runtime as rt  # noqa: E402

QUANTIZE = "flashinfer.nvfp4_attention_sm120.nvfp4_attention_sm120_quantize_qkv"
FWD = "flashinfer.nvfp4_attention_sm120.nvfp4_attention_sm120_fwd"
QNAME = "nvfp4_attention_sm120_quantize_qkv_h32_kv8_d128"
FNAME = "nvfp4_attention_sm120_fwd_h32_kv8_d128"
pytestmark = pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning")


@functools.cache
def _module():
    return catalogue_module()


@functools.cache
def _namespace(name: str) -> dict:
    (d,) = [d for d in _module().definitions if d.name == name]
    namespace: dict = {}
    exec(d.reference, namespace)
    return namespace


def _reference(name: str):
    return _namespace(name)["run"]


@pytest.fixture(autouse=True)
def _off():
    yield
    rt.disable_apply()


def _route(monkeypatch, function: str, args: tuple, kwargs: dict):
    """Call the patched API with solutions that record their inputs and run the reference;
    FlashInfer's own function is a recorder that returns "flashinfer"."""
    real = getattr(fa, function)
    originals: list = []
    sig = inspect.signature(real)

    def original(*a, **k):
        originals.append(sig.bind(*a, **k).arguments)
        return "flashinfer"

    original.__signature__ = sig  # type: ignore[attr-defined]
    monkeypatch.setattr(fa, function, original)
    seen: list = []

    def solution(shapes):
        def run(**inputs):
            seen.append(inputs)
            return shapes(**inputs)

        return run

    rt.enable_apply({QNAME: solution(_quantized_like), FNAME: solution(_attended_like)})
    result = getattr(fa, function)(*args, **kwargs)
    counts = rt.stats()[QUANTIZE if "quantize" in function else FWD]
    rt.disable_apply()
    return result, seen, originals, counts


def _fp4(*shape):
    return torch.zeros(*shape, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)


def _quantized_like(q, k, v, kv_len, per_block_mean):
    """Outputs of the quantize definition's shapes (the routing tests check shapes only);
    the correction numbers its rows, to tell which ones FlashInfer's layout keeps."""
    b, h, m, d = q.shape
    kv, n = k.shape[1], k.shape[2]
    scales = lambda *s: torch.ones(*s).to(torch.float8_e4m3fn)  # noqa: E731
    rows = torch.arange(m, dtype=torch.float32).reshape(1, 1, m, 1).expand(b, h, m, n)
    return (
        _fp4(b, h, m, d // 2), _fp4(b, kv, n, d // 2), _fp4(b, kv, d, n // 16, 8),
        scales(b, h, m, d // 16), scales(b, kv, n, d // 16), scales(b, kv, d, n // 16),
        rows.contiguous(),
    )  # fmt: skip


def _attended_like(q_fp4, qk_correction, unpadded_k_len, **_):
    b, h, m, half = q_fp4.shape
    return torch.full((b, h, m, 2 * half), float(unpadded_k_len)).bfloat16(), torch.ones(b, h, m)


def _fwd_args(m=128, n=256, per_block_mean=True):
    """Arguments of a fwd call as nvfp4_attention_sm120_quantize_qkv returns them."""
    g = torch.Generator().manual_seed(0)
    byte = lambda *s: torch.randint(0, 256, s, generator=g, dtype=torch.uint8)  # noqa: E731
    scales = lambda *s: (torch.rand(*s, generator=g) + 0.5).to(torch.float8_e4m3fn)  # noqa: E731
    rows = m // 128 if per_block_mean else 1
    return (
        byte(1, 32, m, 64), byte(1, 8, n, 64), byte(1, 8, 128, n // 2),
        scales(1, 32, m, 8), scales(1, 8, n, 8), scales(1, 8, 128, n // 16),
        torch.randn(1, 32, rows, n, generator=g),
    )  # fmt: skip


def _bf16(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


def _qkv(m=200, n=130, seed=0):
    return (
        _bf16(1, 32, m, 128, seed=seed),
        _bf16(1, 8, n, 128, seed=seed + 1),
        _bf16(1, 8, n, 128, seed=seed + 2),
    )


def _swizzled_offset(r: int, c: int, cols: int) -> int:
    """Where scaled_fp4_quant_kernel writes the scale of row r, column c of a [R, cols]
    scale matrix (the per-64-row swizzle), as a flat index."""
    local = r % 64
    return (r // 64) * 64 * cols + (c // 4) * 256 + (local % 16) * 16 + (local // 16) * 4 + c % 4


def _key_of_row(t: int) -> int:
    """The key that row t of k_fp4 holds (scaled_fp4_quant_permute's load_token_id)."""
    local = t % 128
    r = local % 32
    return t - local + (local // 32) * 32 + (r // 8) * 2 + ((r % 8) // 2) * 8 + (r % 8) % 2


# ---------------------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("per_block_mean", [True, False])
def test_quantize_is_routed_padded_and_returns_flashinfers_shapes(monkeypatch, per_block_mean):
    q, k, v = _qkv()
    out, seen, originals, counts = _route(
        monkeypatch,
        "nvfp4_attention_sm120_quantize_qkv",
        (q, k, v),
        {"per_block_mean": per_block_mean},
    )
    assert counts["hit"] == 1 and not originals
    (inputs,) = seen
    # The solution gets q, k and v padded with zeros to 128 tokens, v in blocks of 16 keys,
    # and the keys' count before padding.
    assert inputs["q"].shape == (1, 32, 256, 128) and torch.equal(inputs["q"][:, :, :200], q)
    assert not inputs["q"][:, :, 200:].any()
    assert inputs["k"].shape == (1, 8, 256, 128) and not inputs["k"][:, :, 130:].any()
    assert inputs["v"].shape == (1, 8, 16, 16, 128)
    assert torch.equal(inputs["v"].flatten(2, 3)[:, :, :130], v)
    assert inputs["kv_len"] == 130 and inputs["per_block_mean"] is per_block_mean
    # What the docstring says FlashInfer returns.
    q_fp4, k_fp4, v_fp4_t, q_scale, k_scale, v_scale_t, corr = out
    assert (q_fp4.shape, q_fp4.dtype) == ((1, 32, 256, 64), torch.uint8)
    assert (k_fp4.shape, k_fp4.dtype) == ((1, 8, 256, 64), torch.uint8)
    assert (v_fp4_t.shape, v_fp4_t.dtype) == ((1, 8, 128, 128), torch.uint8)
    assert q_scale.shape == (1, 32, 256, 8) and k_scale.shape == (1, 8, 256, 8)
    assert v_scale_t.shape == (1, 8, 128, 16) and v_scale_t.dtype == torch.float8_e4m3fn
    assert corr.dtype == torch.float32 and corr.shape == (1, 32, 2 if per_block_mean else 1, 256)
    # One row per 128-query block (the first of each), or the one row all share.
    expected = torch.tensor([0.0, 128.0]) if per_block_mean else torch.tensor([0.0])
    assert torch.equal(corr[0, 0, :, 0], expected)


def test_fwd_is_routed_with_flashinfers_defaults_and_returns_out_and_lse(monkeypatch):
    args = _fwd_args()
    result, seen, originals, counts = _route(monkeypatch, "nvfp4_attention_sm120_fwd", args, {})
    assert counts["hit"] == 1 and not originals
    (inputs,) = seen
    assert inputs["sm_scale"] == pytest.approx(128**-0.5)
    assert inputs["causal"] is False and inputs["unpadded_k_len"] == 256
    assert inputs["q_fp4"].dtype == torch.float4_e2m1fn_x2
    assert torch.equal(inputs["q_fp4"].view(torch.uint8), args[0])
    assert torch.equal(inputs["qk_correction"], args[6])
    out, lse = result
    assert (out.shape, out.dtype) == ((1, 32, 128, 128), torch.bfloat16)
    assert (lse.shape, lse.dtype) == ((1, 32, 128), torch.float32)


def test_fwd_with_one_correction_row_an_alias_scale_and_no_lse(monkeypatch):
    args = _fwd_args(m=256, per_block_mean=False)
    kwargs = {"per_block_mean": False, "softmax_scale": 0.05, "return_lse": False}
    kwargs |= {"unpadded_k_len": 200, "out": torch.zeros(1, 32, 256, 128, dtype=torch.bfloat16)}
    result, seen, originals, counts = _route(monkeypatch, "nvfp4_attention_sm120_fwd", args, kwargs)
    assert counts["hit"] == 1 and not originals
    (inputs,) = seen
    assert inputs["sm_scale"] == 0.05 and inputs["unpadded_k_len"] == 200
    # The one row, shared by both 128-query blocks.
    assert inputs["qk_correction"].shape == (1, 32, 2, 256)
    assert torch.equal(inputs["qk_correction"][:, :, 1], args[6][:, :, 0])
    assert result is kwargs["out"] and (result == 200).all()


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        # The kernel ignores unpadded_k_len under a causal mask, against its docstring.
        ({"causal": True, "unpadded_k_len": 200}, "causal,unpadded_k_len,k_fp4"),
        ({"out_dtype": torch.float16}, "out_dtype,out"),
        ({"out": torch.zeros(1, 32, 128, 128, dtype=torch.float16)}, "out_dtype,out"),
        ({"sm_scale": 0.1, "softmax_scale": 0.1}, "sm_scale,softmax_scale"),
        ({"return_lse": False, "lse": torch.zeros(1, 32, 128)}, "return_lse,lse"),
    ],
)
def test_fwd_calls_the_definition_does_not_model_fall_back(monkeypatch, kwargs, rule):
    result, seen, originals, counts = _route(
        monkeypatch, "nvfp4_attention_sm120_fwd", _fwd_args(), kwargs
    )
    assert counts["hit"] == 0 and not seen and result == "flashinfer" and len(originals) == 1
    assert counts["fallback_guard"] == 1 and counts["rules"] == {rule: 1}, counts
    assert originals[0]["q_fp4"].dtype == torch.uint8  # FlashInfer's own arguments


def _with(args, **changes):
    """The fwd arguments with some replaced by index: a0 is q_fp4, ..., a6 qk_correction."""
    args = list(args)
    for key, value in changes.items():
        args[int(key[1:])] = value
    return tuple(args)


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        # Rows that are not whole 128-token blocks.
        (
            {
                "a0": torch.zeros(1, 32, 100, 64, dtype=torch.uint8),
                "a3": torch.ones(1, 32, 100, 8).to(torch.float8_e4m3fn),
            },
            "q_fp4,k_fp4",
        ),
        # v's rows shorter than k's.
        ({"a2": torch.zeros(1, 8, 128, 64, dtype=torch.uint8)}, "v_fp4_t,k_fp4,v_scale_t"),
    ],
)
def test_fwd_calls_flashinfer_raises_for_are_left_to_it(monkeypatch, changes, rule):
    args = _with(_fwd_args(), **changes)
    result, seen, originals, counts = _route(monkeypatch, "nvfp4_attention_sm120_fwd", args, {})
    assert counts["hit"] == 0 and not seen and result == "flashinfer" and len(originals) == 1
    assert counts["rules"] == {rule: 1}, counts


@pytest.mark.parametrize("unpadded_k_len", [0, 300, True, 200.0])
def test_fwd_key_counts_flashinfer_raises_for_are_left_to_it(monkeypatch, unpadded_k_len):
    kwargs = {"unpadded_k_len": unpadded_k_len}
    result, seen, originals, counts = _route(
        monkeypatch, "nvfp4_attention_sm120_fwd", _fwd_args(), kwargs
    )
    assert counts["hit"] == 0 and result == "flashinfer" and len(originals) == 1
    assert counts["rules"] == {"unpadded_k_len,k_fp4": 1}, counts


def test_quantize_calls_with_k_and_v_of_different_lengths_are_left_to_flashinfer(monkeypatch):
    # 130 and 120 keys pad alike; FlashInfer raises for the mismatch.
    q, k, v = _qkv(m=128, n=130)
    result, seen, originals, counts = _route(
        monkeypatch, "nvfp4_attention_sm120_quantize_qkv", (q, k, v[:, :, :120]), {}
    )
    assert counts["hit"] == 0 and result == "flashinfer" and len(originals) == 1
    assert counts["rules"] == {"k,v": 1}, counts


def test_float16_quantize_calls_fall_back(monkeypatch):
    q, k, v = (t.half() for t in _qkv(m=128, n=128))
    result, seen, originals, counts = _route(
        monkeypatch, "nvfp4_attention_sm120_quantize_qkv", (q, k, v), {}
    )
    assert counts["hit"] == 0 and not seen and result == "flashinfer" and len(originals) == 1


def _pad_for_quantize(q, k, v):
    pad = lambda x: torch.nn.functional.pad(x, (0, 0, 0, (-x.shape[2]) % 128))  # noqa: E731
    return pad(q), pad(k), pad(v).unflatten(2, (-1, 16))


def _as_flashinfer_returns(packed, per_block_mean):
    """The reference's outputs as FlashInfer returns them (the dispatcher's `result`s)."""
    q_fp4, k_fp4, v_fp4_t, q_scale, k_scale, v_scale_t, corr = packed
    corr = corr[:, :, ::128] if per_block_mean else corr[:, :, :1]
    v_fp4_t = v_fp4_t.view(torch.uint8).flatten(-2)
    return (
        q_fp4.view(torch.uint8),
        k_fp4.view(torch.uint8),
        v_fp4_t,
        q_scale,
        k_scale,
        v_scale_t,
        corr.contiguous(),
    )


# ---------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------


def test_quantize_reference_writes_the_kernels_layouts_one_element_at_a_time():
    # One head of each, d=64: q of 128 rows, k and v of 100 keys (padded to 128).
    q, k, v = (
        _bf16(1, 1, 128, 64, seed=3),
        _bf16(1, 1, 100, 64, seed=4),
        _bf16(1, 1, 100, 64, seed=5),
    )
    q_fp4, k_fp4, v_fp4_t, q_scale, k_scale, v_scale_t, _ = _reference(QNAME)(
        *_pad_for_quantize(q, k, v), 100, True
    )
    qc = (q.reshape(1, 1, 1, 128, 64) - q.reshape(1, 1, 1, 128, 64).mean(3, keepdim=True)).float()
    kc = (k - k.mean(dim=-2, keepdim=True)).float()
    kc = torch.nn.functional.pad(kc, (0, 0, 0, 28))
    vp = torch.nn.functional.pad(v.float(), (0, 0, 0, 28))
    cases = [
        (qc.reshape(128, 64), q_fp4, q_scale, lambda t: t),
        (kc.reshape(128, 64), k_fp4, k_scale, _key_of_row),
        (
            vp.reshape(128, 64).T.contiguous(),
            v_fp4_t.view(torch.uint8).flatten(-2),
            v_scale_t,
            lambda t: t,
        ),
    ]
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    for source, packed, scales, key in cases:
        rows, cols = source.shape
        order = torch.tensor([key(t) for t in range(rows)])
        blocks = source[order].reshape(rows, cols // 16, 16)
        sf = (blocks.abs().amax(-1) / 6.0).to(torch.float8_e4m3fn)
        # Each scale where the kernel writes it, one index at a time.
        where = [
            [_swizzled_offset(t, c, cols // 16) for c in range(cols // 16)] for t in range(rows)
        ]
        flat = scales.reshape(-1).view(torch.uint8)
        assert torch.equal(flat[torch.tensor(where)], sf.view(torch.uint8))
        inv = torch.where(sf.float() == 0, 0.0, 1.0 / sf.float())
        scaled = (blocks * inv.unsqueeze(-1)).reshape(rows, cols)
        # FlashInfer's own e2m1 helpers (its templates'), away from the ties its helper
        # breaks toward the smaller magnitude and the -0 it writes as +0.
        codes = fi_quantize._fp4_e2m1_quantize_block(scaled, None)
        expected = fi_quantize._pack_fp4_pairs(codes)
        got = packed.view(torch.uint8).reshape(rows, cols // 2)
        tie = (scaled.abs().unsqueeze(-1) == mids).any(-1) | (scaled == 0)
        tie = tie.reshape(rows, cols // 2, 2).any(-1)
        assert (~tie).float().mean() > 0.7 and torch.equal(got[~tie], expected[~tie])


@pytest.mark.parametrize("per_block_mean", [True, False])
def test_quantize_reference_corrects_with_the_mean_query_of_each_block(per_block_mean):
    # GQA of 2, 200 queries (two blocks, the second padded), 130 keys.
    q, k, v = _bf16(1, 2, 200, 64, seed=9), _bf16(1, 1, 130, 64, seed=10), _bf16(1, 1, 130, 64)
    padded = _pad_for_quantize(q, k, v)
    corr = _reference(QNAME)(*padded, 130, per_block_mean)[6]
    assert corr.shape == (1, 2, 256, 256)
    # Means in bfloat16 over the padded queries, as FlashInfer's Python takes them; the
    # keys less their mean over the 130 keys, zero past them.
    qp = padded[0]
    means = qp.reshape(1, 2, 2, 128, 64).mean(3) if per_block_mean else qp.mean(2, keepdim=True)
    kc = (k - k.mean(dim=-2, keepdim=True)).float().repeat_interleave(2, 1)
    expected = torch.einsum("bhgd,bhnd->bhgn", means.float(), kc)
    rows = corr[:, :, ::128]
    torch.testing.assert_close(rows[..., :130], expected.expand_as(rows[..., :130]))
    assert not corr[..., 130:].any()
    # Every row of a block has its block's correction.
    assert torch.equal(corr, rows.repeat_interleave(128, dim=2))


def test_fwd_reference_inverts_the_layouts_and_approximates_attention():
    # Quantize then attend, GQA of 2, per-block means; against plain attention of the
    # unquantized inputs, and against an exact key order (undoing nothing is far off).
    q, k, v = (
        _bf16(1, 2, 130, 64, seed=6),
        _bf16(1, 1, 200, 64, seed=7),
        _bf16(1, 1, 200, 64, seed=8),
    )
    packed = _reference(QNAME)(*_pad_for_quantize(q, k, v), 200, True)
    for causal in (False, True):
        q_fp4, k_fp4, v_fp4_t, q_scale, k_scale, v_scale_t, corr = packed
        v_fp4_t = v_fp4_t.view(torch.uint8).flatten(-2).view(torch.float4_e2m1fn_x2)
        args = (q_fp4, k_fp4, v_fp4_t, q_scale, k_scale, v_scale_t, corr[:, :, ::128])
        out, lse = _reference(FNAME)(*args, 0.125, causal, 200)
        logits = q.float() @ k.float().repeat_interleave(2, 1).transpose(-2, -1) * 0.125
        if causal:  # bottom-right over the padded lengths, 256 of each: the diagonal
            logits = logits.masked_fill(torch.ones(130, 200, dtype=torch.bool).triu(1), -math.inf)
        expected = logits.softmax(-1) @ v.float().repeat_interleave(2, 1)
        err = (out[:, :, :130].float() - expected).norm() / expected.norm()
        assert err < 0.3, err  # NVFP4 q, k, v and P
        # lse is of the centred logits: shifted by q . mean(k) per row.
        kmean = k.float().mean(2, keepdim=True).repeat_interleave(2, 1)
        shift = (q.float() @ kmean.transpose(-2, -1)).squeeze(-1) * 0.125
        lse_err = (lse[:, :, :130] - (torch.logsumexp(logits, -1) - shift)).abs().max()
        assert lse_err < 0.2, lse_err


def test_fwd_reference_quantizes_p_against_the_running_maximum_of_its_tiles():
    # q = k = 0, so the logits are the correction: c0 on the first 128 keys, c1 on the
    # next 128; v = 1 on the first tile, 2 on the second; sm_scale 1. The kernel visits the
    # last tile first: its p = 448 * 6 exactly, kept exactly whatever comes after.
    zeros = lambda *s: torch.zeros(*s, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)  # noqa: E731
    ones = torch.ones(1, 1, 128, 4).to(torch.float8_e4m3fn)
    v_codes = torch.cat([torch.full((1, 1, 64, 64), 0x22), torch.full((1, 1, 64, 64), 0x44)], -1)
    v_fp4_t = v_codes.to(torch.uint8).view(torch.float4_e2m1fn_x2)  # 1.0 then 2.0
    v_scale_t = torch.ones(1, 1, 64, 16).to(torch.float8_e4m3fn)
    for c0, c1 in ((3.0, 1.0), (1.0, 3.0)):
        corr = torch.cat([torch.full((1, 1, 1, 128), c0), torch.full((1, 1, 1, 128), c1)], -1)
        out, lse = _reference(FNAME)(
            zeros(1, 1, 128, 32), zeros(1, 1, 256, 32), v_fp4_t, ones, ones.repeat(1, 1, 2, 1),
            v_scale_t, corr, 1.0, False, 256,
        )  # fmt: skip
        w = math.exp(min(c0, c1) - max(c0, c1))
        if c0 > c1:
            # The last tile (v = 2) first, at p = 2688, then rescaled by w: exact.
            expected = (1.0 + 2.0 * w) / (1.0 + w)
        else:
            # The first tile comes second, under the last tile's larger maximum: its p =
            # 2688 w has the block scale e4m3(448 w), against which p / (448 w) = 6 exactly.
            scale = torch.tensor(448.0 * w).to(torch.float8_e4m3fn).float().item()
            expected = (2.0 + 6.0 * scale / 2688.0 * 1.0) / (1.0 + w)
            assert scale != 448.0 * w  # the case tells the two orders apart
        assert torch.allclose(out.float(), torch.tensor(expected), rtol=2**-8), (
            out[0, 0, 0, 0],
            expected,
        )
        assert torch.allclose(lse, torch.tensor(math.log(128 * (math.exp(c0) + math.exp(c1)))))
