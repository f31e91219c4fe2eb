"""The norm, activation and RoPE families of norm_*.fidef, activation_*.fidef, rope_apply.fidef
and rope_cache.fidef, held to the real FlashInfer 0.7.2 on the CPU.

Routing: FlashInfer's own functions are called with apply on and a solution that records
what it is given. A call with FlashInfer's defaults, and one with each parameter the
definition reads at another value, reach the solution with the values the definition
declares; a call the definition does not model (float16 tensors, another FP8 format, an
output buffer of another dtype) is refused, counted with its rule, and goes to FlashInfer
itself, whose kernels raise on this CPU.

References: each family's reference against FlashInfer's template references
(``flashinfer.trace.templates.rope``) and against a rotation written out pair by pair.
"""

from __future__ import annotations

import functools
import math
import warnings
from pathlib import Path

import pytest
import torch

from _shared import require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import flashinfer  # noqa: E402
import flashinfer.activation  # noqa: E402
import flashinfer.norm  # noqa: E402
import flashinfer.rope  # noqa: E402
from flashinfer.trace.templates import activation as fi_activation  # noqa: E402
from flashinfer.trace.templates import norm as fi_norm  # noqa: E402
from flashinfer.trace.templates import rope as fi_rope  # noqa: E402

import fibgen.runtime as rt  # noqa: E402
from fibgen.compiler import compile_paths  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FILES = ("rope_apply.fidef", "rope_cache.fidef", "rope.fidef", "activation_gated.fidef")
FILES += ("norm_fused.fidef", "norm_gated.fidef")
# What FlashInfer raises here: its kernels need a GPU; its CuTe DSL norms check first that
# the device is one they support.
ON_CPU = "FlashInfer requires GPUs|device must be a cuda device|CUDA|cuda|do not satisfy the"
FLASHINFER_ON_CPU = (RuntimeError, ValueError, AssertionError)
FP8_MAX = 448.0
pytestmark = pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning")


@functools.cache
def _module():
    result = compile_paths([str(ROOT / "definitions" / f) for f in FILES])
    assert result.ok, "the RoPE definitions do not compile"
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


def _bf16(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


def _close(a, b, atol=2e-2):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert (a.float() - b.float()).abs().max().item() <= atol


def _rel_close(a, b):
    # bfloat16 keeps 8 significant bits: within 2**-8 of the value, and a little absolute.
    assert a.shape == b.shape, (a.shape, b.shape)
    a, b = a.double(), b.double()
    assert ((a - b).abs() <= b.abs() * 2**-7 + 1e-3).all()


def _fp8_close(a, b):
    # One E4M3 step (3 mantissa bits) apart at most: the template rounds to bfloat16 before
    # the FP8 cast, the kernel (and our reference) does not.
    assert a.dtype == b.dtype == torch.float8_e4m3fn and a.shape == b.shape
    a, b = a.float(), b.float()
    assert ((a - b).abs() <= b.abs() / 8 + 2**-9).all()


def _cos_sin_cache(rows, rotary_dim, theta=1e4):
    inv = 1.0 / theta ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    angle = torch.arange(rows).float()[:, None] * inv
    return torch.cat([angle.cos(), angle.sin()], dim=-1)


def _rotate_pairwise(x, positions, inv_freq, rotary_dim, interleave):
    """RoPE written out one pair at a time, in float64: an independent computation."""
    out = x.double().clone()
    for t in range(x.shape[0]):
        for i in range(rotary_dim // 2):
            a, b = (2 * i, 2 * i + 1) if interleave else (i, i + rotary_dim // 2)
            angle = float(positions[t]) * float(inv_freq[i])
            c, s = math.cos(angle), math.sin(angle)
            xa, xb = x[t, :, a].double(), x[t, :, b].double()
            out[t, :, a], out[t, :, b] = xa * c - xb * s, xb * c + xa * s
    return out


# ---------------------------------------------------------------------------------------
# References against independent computations
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_ragged_rope_reference_is_flashinfers_template_and_rotates_each_pair(
    interleave, rotary_dim
):
    q, k = _bf16(9, 4, 64, seed=1), _bf16(9, 2, 64, seed=2)
    indptr, offsets = _i32([0, 4, 4, 9]), _i32([7, 100, 3000])
    args = (q, k, indptr, offsets, rotary_dim, interleave, 2.0, 5e5)
    for name in ("rope_h32_kv8_d128", "rope_inplace_h32_kv8_d128"):
        ours_q, ours_k = _reference(name)(*args)
        theirs_q, theirs_k = fi_rope._apply_rope_reference(*args)
        _close(ours_q, theirs_q), _close(ours_k, theirs_k)
    positions = [7, 8, 9, 10, 3000, 3001, 3002, 3003, 3004]
    inv = [5e5 ** (-2 * i / rotary_dim) / 2.0 for i in range(rotary_dim // 2)]
    _close(ours_q, _rotate_pairwise(q, positions, inv, rotary_dim, interleave))
    # Channels past rotary_dim pass through untouched.
    assert torch.equal(ours_k[..., rotary_dim:], k[..., rotary_dim:])


def test_pos_ids_rope_reference_is_flashinfers_template():
    q, k = _bf16(6, 4, 128, seed=3), _bf16(6, 1, 128, seed=4)
    pos_ids = _i32([0, 5, 5, 8191, 1, 77])
    for interleave in (False, True):
        args = (q, k, pos_ids, 96, interleave, 1.0, 1e6)
        for name in ("rope_pos_ids_h32_kv8_d128", "rope_pos_ids_inplace_h32_kv8_d128"):
            ours = _reference(name)(*args)
            theirs = fi_rope._apply_rope_pos_ids_reference(*args)
            _close(ours[0], theirs[0]), _close(ours[1], theirs[1])
    assert torch.equal(ours[0][0], q[0])  # position 0 is no rotation


@pytest.mark.parametrize(
    "factors", [(8.0, 1.0, 4.0, 8192), (32.0, 1.0, 4.0, 8192), (4.0, 2.0, 8.0, 2048)]
)
def test_llama31_references_are_flashinfers_template_across_its_three_bands(factors):
    # FlashInfer's template states the bands by wavelength (kept, stretched, blended); the
    # reference uses the kernel's clamp form. Positions up to 60k reach every band.
    scale, low, high, old = factors
    q, k = _bf16(5, 4, 128, seed=5), _bf16(5, 2, 128, seed=6)
    indptr, offsets = _i32([0, 2, 5]), _i32([60000, 9])
    args = (q, k, indptr, offsets, 128, False, scale, 5e5, low, high, old)
    for name in ("llama31_rope_h32_kv8_d128", "llama31_rope_inplace_h32_kv8_d128"):
        ours = _reference(name)(*args)
        theirs = fi_rope._apply_llama31_rope_reference(*args)
        _close(ours[0], theirs[0]), _close(ours[1], theirs[1])
    pos_ids = _i32([60000, 60001, 9, 10, 11])
    args = (q, k, pos_ids, 128, True, scale, 5e5, low, high, old)
    for name in ("llama31_rope_pos_ids_h32_kv8_d128", "llama31_rope_pos_ids_inplace_h32_kv8_d128"):
        ours = _reference(name)(*args)
        theirs = fi_rope._apply_llama31_rope_pos_ids_reference(*args)
        _close(ours[0], theirs[0]), _close(ours[1], theirs[1])
    # The scaling does change the result: the check above can fail.
    plain = _reference("rope_pos_ids_h32_kv8_d128")(q, k, pos_ids, 128, True, 1.0, 5e5)
    assert (plain[0].float() - ours[0].float()).abs().max() > 0.1


@pytest.mark.parametrize("is_neox", [True, False])
def test_cos_sin_cache_reference_is_flashinfers_template(is_neox):
    q, k = _bf16(5, 4, 128, seed=7), _bf16(5, 2, 128, seed=8)
    cache, positions = _cos_sin_cache(32, 64), torch.tensor([0, 31, 4, 4, 17])
    ours = _reference("rope_cos_sin_cache_d128")(q, k, cache, positions, is_neox)
    theirs = fi_rope._apply_rope_with_cos_sin_cache_reference(
        positions, q.flatten(1), k.flatten(1), 128, cache, is_neox
    )
    _close(ours[0].flatten(1), theirs[0]), _close(ours[1].flatten(1), theirs[1])
    inv = [1e4 ** (-2 * i / 64) for i in range(32)]
    _close(ours[0], _rotate_pairwise(q, positions, inv, 64, not is_neox))
    if is_neox:  # the in-place family of the dataset computes the same rotation
        ours_inplace = _reference("rope_with_cos_sin_cache_neox_style_d128_rd64")(
            q, k, cache, positions
        )
        assert torch.equal(ours_inplace[0], ours[0]) and torch.equal(ours_inplace[1], ours[1])


@pytest.mark.parametrize("is_neox", [True, False])
def test_rope_quantize_fp8_reference_is_flashinfers_template(is_neox):
    q_rope, k_rope = _bf16(6, 8, 64, seed=1) * 30, _bf16(6, 2, 64, seed=2) * 30
    q_nope, k_nope = _bf16(6, 8, 64, seed=3) * 30, _bf16(6, 2, 64, seed=4) * 30
    cache, pos = _cos_sin_cache(16, 64), torch.tensor([3, 0, 15, 7, 7, 1])
    args = (q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox, 0.5, 20.0)
    ours = _reference("rope_quantize_fp8_h8_kv2_rope64")(*args)
    theirs = fi_rope._rope_quantize_fp8_reference(*args[:7], quant_scale_q=0.5, quant_scale_kv=20.0)
    for a, b in zip(ours, theirs):
        _fp8_close(a, b)
    # quant_scale_kv = 20 pushes keys past E4M3's range: they saturate, never become NaN.
    assert ours[3].float().abs().max() == FP8_MAX and not ours[3].float().isnan().any()
    # A missing nope part is an empty one, as the rule makes it.
    empty = q_rope.new_empty(6, 8, 0), k_rope.new_empty(6, 2, 0)
    out = _reference("rope_quantize_fp8_h8_kv2_rope64")(q_rope, k_rope, *empty, *args[4:])
    assert out[2].shape == (6, 8, 0) and torch.equal(out[0].float(), ours[0].float())


def test_mla_rope_quantize_fp8_reference_is_flashinfers_template():
    q_rope, k_rope = _bf16(5, 16, 64, seed=1), _bf16(5, 64, seed=2)
    q_nope, k_nope = _bf16(5, 16, 512, seed=3), _bf16(5, 512, seed=4)
    cache, pos = _cos_sin_cache(8, 64), torch.tensor([1, 2, 3, 0, 7])
    args = (q_rope, k_rope, q_nope, k_nope, cache, pos, False, 2.0, 0.25)
    ours = _reference("mla_rope_quantize_fp8_h16_rope64")(*args)
    theirs = fi_rope._rope_quantize_fp8_reference(*args[:7], quant_scale_q=2.0, quant_scale_kv=0.25)
    assert ours[1].shape == (5, 64)
    for a, b in zip(ours, theirs):
        _fp8_close(a, b)


def test_append_reference_writes_rope_then_nope_at_each_tokens_page_and_slot():
    # Two sequences: pages [5, 2] and [0]; tokens at positions 17 and 3 of sequence 0 and 0
    # of sequence 1. FlashInfer's kernel stores [rope | nope] (its template: [nope | rope]).
    g = torch.Generator().manual_seed(0)
    q_rope, k_rope = _bf16(3, 8, 64, seed=1), _bf16(3, 2, 64, seed=2)
    q_nope, k_nope = _bf16(3, 8, 64, seed=3), _bf16(3, 2, 64, seed=4)
    v = _bf16(3, 2, 128, seed=5)
    cache, pos_ids = _cos_sin_cache(32, 64), torch.tensor([17, 3, 0])
    pages = torch.randn(6, 16, 2, 128, generator=g).to(torch.float8_e4m3fn)
    k_cache, v_cache = pages.clone(), pages.clone()
    kv_indices, kv_indptr = _i32([5, 2, 0]), _i32([0, 2, 3])
    batch_indices, positions = _i32([0, 0, 1]), _i32([17, 3, 0])
    run = _reference("rope_quantize_fp8_append_paged_kv_cache_h8_kv2_rope64_ps16")
    q_rope_out, q_nope_out, k_out, v_out = run(
        q_rope, k_rope, q_nope, k_nope, v, cache, pos_ids, k_cache, v_cache,
        kv_indices, kv_indptr, batch_indices, positions, True, 0.5, 2.0,
    )  # fmt: skip
    quant = _reference("rope_quantize_fp8_h8_kv2_rope64")(
        q_rope, k_rope, q_nope, k_nope, cache, pos_ids, True, 0.5, 2.0
    )
    assert torch.equal(q_rope_out.float(), quant[0].float())
    assert torch.equal(q_nope_out.float(), quant[2].float())
    key = torch.cat([quant[1].float(), quant[3].float()], dim=-1)
    value = (v.float() * 2.0).to(torch.float8_e4m3fn).float()
    for i, (page, slot) in enumerate([(2, 1), (5, 3), (0, 0)]):
        assert torch.equal(k_out[page, slot].float(), key[i])
        assert torch.equal(v_out[page, slot].float(), value[i])
    written = torch.zeros(6, 16, dtype=torch.bool)
    written[2, 1] = written[5, 3] = written[0, 0] = True
    assert torch.equal(k_out[~written].float(), pages[~written].float())  # the rest is kept
    assert torch.equal(k_cache.float(), pages.float())  # the inputs are not written

    # FlashInfer's template reference writes the same values, in [nope | rope] order.
    t_k, t_v = pages.clone(), pages.clone()
    theirs = fi_rope._rope_quantize_fp8_append_paged_kv_cache_reference(
        q_rope, k_rope, q_nope, k_nope, v, cache, pos_ids, (t_k, t_v), kv_indices, kv_indptr,
        batch_indices, positions, True, None, 0.5, 2.0, 16, "NHD",
    )  # fmt: skip
    _fp8_close(q_rope_out, theirs[0])
    _fp8_close(k_out[2, 1, :, 64:], t_k[2, 1, :, :64])
    _fp8_close(k_out[2, 1, :, :64], t_k[2, 1, :, 64:])
    assert torch.equal(v_out.float(), t_v.float())


# ---------------------------------------------------------------------------------------
# Routing of FlashInfer's functions
# ---------------------------------------------------------------------------------------


def _recorder(name, seen):
    """A solution of ``name`` that records its inputs and returns what the reference does."""

    def solution(**inputs):
        seen.append(inputs)
        return _reference(name)(**inputs)

    return solution


def _same(value, expected):
    if isinstance(expected, torch.Tensor):
        return isinstance(value, torch.Tensor) and torch.equal(value, expected)
    if isinstance(expected, float):
        return value == pytest.approx(expected)
    return value == expected


def _route(fn, name, args, cases, module="rope"):
    """Each case is (keyword overrides, expected): a dict of inputs the solution must see, or
    the name of the rule that refuses the call. Returns what each routed call returned."""
    seen: list = []
    returned: list = []
    path = f"flashinfer.{module}.{fn}"
    with rt.enable_apply({name: _recorder(name, seen)}):
        api = getattr(getattr(flashinfer, module), fn)  # the patched function
        for overrides, expected in cases:
            before = len(seen)
            given = dict(overrides)
            call_args = given.pop("__args__", args)
            if isinstance(expected, str):
                with pytest.raises(FLASHINFER_ON_CPU, match=ON_CPU):
                    api(*call_args, **given)
                assert len(seen) == before, overrides
            else:
                returned.append(api(*call_args, **given))
                assert len(seen) == before + 1, (overrides, rt.stats()[path])
                for key, value in expected.items():
                    assert _same(seen[-1][key], value), (overrides, key, seen[-1][key])
    counts = rt.stats()[path]
    refused = [e for _, e in cases if isinstance(e, str)]
    assert counts["hit"] == len(cases) - len(refused)
    assert counts.get("rules", {}) == {r: refused.count(r) for r in refused}, counts
    return returned


@pytest.mark.parametrize("fn", ["apply_rope", "apply_llama31_rope"])
def test_ragged_rope_routes_what_it_models_and_refuses_the_rest(fn):
    q, k = _bf16(7, 32, 128, seed=1), _bf16(7, 8, 128, seed=2)
    indptr, offsets = _i32([0, 3, 7]), _i32([10, 0])
    name = ("llama31_rope" if "llama31" in fn else "rope") + "_h32_kv8_d128"
    defaults = (8.0, 5e5, 1.0, 4.0, 8192) if "llama31" in fn else (1.0, 1e4)
    cases = [
        ({}, {"rotary_dim": 128, "interleave": False, "rope_scale": defaults[0]}),
        ({}, {"rope_theta": defaults[1], "indptr": indptr, "offsets": offsets}),
        ({"rotary_dim": 64, "interleave": True}, {"rotary_dim": 64, "interleave": True}),
        ({"rope_scale": 4.0, "rope_theta": 1e6}, {"rope_scale": 4.0, "rope_theta": 1e6}),
        # int64 index tensors are the definition's int32 ones.
        ({"__args__": (q, k, indptr.long(), offsets.long())}, {"indptr": indptr}),
        ({"__args__": (q.half(), k.half(), indptr, offsets)}, "tensor:q"),
    ]
    if "llama31" in fn:
        cases.append(({"low_freq_factor": 2.0, "old_context_len": 4096}, {"low_freq_factor": 2.0}))
    out = _route(fn, name, (q, k, indptr, offsets), cases)
    expected = _reference(name)(q, k, indptr, offsets, 128, False, *defaults)
    q_out, k_out = out[0]
    assert torch.equal(q_out, expected[0]) and torch.equal(k_out, expected[1])
    assert not torch.equal(q_out, q)  # a real rotation, not a pass-through


@pytest.mark.parametrize("fn", ["apply_rope_pos_ids_inplace", "apply_llama31_rope_pos_ids_inplace"])
def test_in_place_rope_rotates_q_and_k_where_they_lie(fn):
    q, k = _bf16(4, 32, 128, seed=1), _bf16(4, 8, 128, seed=2)
    pos_ids = torch.tensor([9, 0, 4000, 3])
    name = ("llama31_rope" if "llama31" in fn else "rope") + "_pos_ids_inplace_h32_kv8_d128"
    run = _reference(name)
    defaults = (8.0, 5e5, 1.0, 4.0, 8192) if "llama31" in fn else (1.0, 1e4)
    expected = run(q, k, pos_ids.int(), 128, False, *defaults)
    qq, kk = q.clone(), k.clone()
    cases = [({"__args__": (qq, kk, pos_ids)}, {"pos_ids": pos_ids.int(), "rotary_dim": 128})]
    cases.append(({"__args__": (q.half(), k.half(), pos_ids)}, "tensor:q"))
    out = _route(fn, name, (qq, kk, pos_ids), cases)
    assert out == [None]  # FlashInfer's in-place functions return nothing
    assert torch.equal(qq, expected[0]) and torch.equal(kk, expected[1])


def test_cos_sin_cache_routes_flattened_heads_and_both_pair_orders():
    q, k = _bf16(5, 4, 128, seed=1), _bf16(5, 2, 128, seed=2)
    cache, positions = _cos_sin_cache(16, 128), torch.tensor([0, 3, 15, 2, 2])
    args = (positions, q.flatten(1), k.flatten(1), 128, cache)
    cases = [
        ({}, {"q": q, "k": k, "is_neox": True}),
        ({"is_neox": False}, {"is_neox": False}),
        (
            {"__args__": (positions, q.flatten(1).half(), k.flatten(1).half(), 128, cache)},
            "tensor:q",
        ),
    ]
    out = _route("apply_rope_with_cos_sin_cache", "rope_cos_sin_cache_d128", args, cases)
    q_out, k_out = out[0]
    assert q_out.shape == (5, 512) and k_out.shape == (5, 256)  # as FlashInfer returns them
    theirs = fi_rope._apply_rope_with_cos_sin_cache_reference(*args, True)
    _close(q_out, theirs[0]), _close(k_out, theirs[1])


def test_rope_quantize_fp8_routes_what_it_models_and_refuses_the_rest():
    q_rope, k_rope = _bf16(4, 8, 64, seed=1), _bf16(4, 2, 64, seed=2)
    q_nope, k_nope = _bf16(4, 8, 64, seed=3), _bf16(4, 2, 64, seed=4)
    cache, pos = _cos_sin_cache(8, 64), torch.tensor([0, 7, 1, 2], dtype=torch.int32)
    args = (q_rope, k_rope, q_nope, k_nope, cache, pos)
    e5m2 = torch.empty(4, 8, 64, dtype=torch.float8_e5m2)
    cases = [
        ({}, {"is_neox": True, "quant_scale_q": 1.0, "quant_scale_kv": 1.0, "pos_ids": pos.long()}),
        ({"quant_scale_q": 0.5, "quant_scale_kv": 3.0, "is_neox": False}, {"quant_scale_kv": 3.0}),
        ({"enable_pdl": True, "backend": "triton"}, {"q_rope": q_rope}),
        ({"quantize_dtype": torch.float8_e4m3fn}, {"k_rope": k_rope}),
        (
            {"__args__": (q_rope, k_rope, None, None, cache, pos)},
            {"q_nope": torch.empty(4, 8, 0, dtype=torch.bfloat16)},
        ),
        ({"quantize_dtype": torch.float8_e5m2}, "quantize_dtype"),
        # A caller's buffer of another dtype is counted under its output (Note [output
        # buffers]).
        ({"q_rope_out": e5m2}, "tensor:q_rope_out"),
    ]
    out = _route("rope_quantize_fp8", "rope_quantize_fp8_h8_kv2_rope64", args, cases)
    expected = _reference("rope_quantize_fp8_h8_kv2_rope64")(*args, True, 1.0, 1.0)
    assert len(out[0]) == 4
    for a, b in zip(out[0], expected):
        assert a.dtype == torch.float8_e4m3fn and torch.equal(a.float(), b.float())


def test_rope_quantize_fp8_writes_into_the_callers_output_buffers():
    q_rope, k_rope = _bf16(4, 8, 64, seed=1), _bf16(4, 2, 64, seed=2)
    cache, pos = _cos_sin_cache(8, 64), torch.tensor([0, 7, 1, 2])
    q_out = torch.zeros(4, 8, 64, dtype=torch.float8_e4m3fn)
    name = "rope_quantize_fp8_h8_kv2_rope64"
    with rt.enable_apply({name: _recorder(name, [])}):
        returned = flashinfer.rope.rope_quantize_fp8(
            q_rope, k_rope, None, None, cache, pos, q_rope_out=q_out, quant_scale_q=2.0
        )
    empty = q_rope.new_empty(4, 8, 0), k_rope.new_empty(4, 2, 0)
    expected = _reference(name)(q_rope, k_rope, *empty, cache, pos, True, 2.0, 1.0)
    assert torch.equal(q_out.float(), expected[0].float()) and q_out.float().abs().sum() > 0
    assert returned[0] is q_out


def test_mla_rope_quantize_fp8_routes_the_latent_key_without_a_head_axis():
    q_rope, k_rope = _bf16(3, 16, 64, seed=1), _bf16(3, 64, seed=2)
    q_nope, k_nope = _bf16(3, 16, 512, seed=3), _bf16(3, 512, seed=4)
    cache, pos = _cos_sin_cache(8, 64), torch.tensor([5, 0, 2])
    args = (q_rope, k_rope, q_nope, k_nope, cache, pos)
    cases = [
        ({}, {"is_neox": True, "k_rope": k_rope, "quant_scale_q": 1.0}),
        ({"is_neox": False, "quant_scale_kv": 0.5, "enable_pdl": True}, {"is_neox": False}),
        ({"quantize_dtype": torch.float8_e5m2}, "quantize_dtype"),
        (
            {"__args__": (q_rope.half(), k_rope.half(), q_nope.half(), k_nope.half(), cache, pos)},
            "tensor:q_rope",
        ),
    ]
    _route("mla_rope_quantize_fp8", "mla_rope_quantize_fp8_h16_rope64", args, cases)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_quantize_append_writes_the_callers_pages_in_their_layout(layout):
    q_rope, k_rope = _bf16(3, 8, 64, seed=1), _bf16(3, 2, 64, seed=2)
    q_nope, k_nope = _bf16(3, 8, 64, seed=3), _bf16(3, 2, 64, seed=4)
    v = _bf16(3, 2, 128, seed=5)
    cache, pos_ids = _cos_sin_cache(32, 64), torch.tensor([17, 3, 0])
    k_nhd = torch.zeros(6, 16, 2, 128, dtype=torch.float8_e4m3fn)
    v_nhd = torch.zeros(6, 16, 2, 128, dtype=torch.float8_e4m3fn)
    kv_indices, kv_indptr = _i32([5, 2, 0]), _i32([0, 2, 3])
    batch_indices, positions = _i32([0, 0, 1]), _i32([17, 3, 0])
    run = _reference("rope_quantize_fp8_append_paged_kv_cache_h8_kv2_rope64_ps16")
    expected = run(
        q_rope, k_rope, q_nope, k_nope, v, cache, pos_ids, k_nhd, v_nhd,
        kv_indices, kv_indptr, batch_indices, positions, True, 1.0, 1.0,
    )  # fmt: skip
    pages = (
        (k_nhd, v_nhd)
        if layout == "NHD"
        else tuple(t.transpose(1, 2).contiguous() for t in (k_nhd, v_nhd))
    )
    name = "rope_quantize_fp8_append_paged_kv_cache_h8_kv2_rope64_ps16"
    seen: list = []
    with rt.enable_apply({name: _recorder(name, seen)}):
        q_out, q_nope_out = flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache(
            q_rope, k_rope, q_nope, k_nope, v, cache, pos_ids, pages, kv_indices, kv_indptr,
            batch_indices, positions, kv_layout=layout,
        )  # fmt: skip
        with pytest.raises(FLASHINFER_ON_CPU, match=ON_CPU):  # fp16 is not the definition's
            flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache(
                q_rope.half(), k_rope.half(), q_nope.half(), k_nope.half(), v.half(), cache,
                pos_ids, pages, kv_indices, kv_indptr, batch_indices, positions,
            )  # fmt: skip
    assert len(seen) == 1
    assert torch.equal(q_out.float(), expected[0].float())
    assert torch.equal(q_nope_out.float(), expected[1].float())
    k_pages, v_pages = pages if layout == "NHD" else (t.transpose(1, 2) for t in pages)
    assert torch.equal(k_pages.float(), expected[2].float())
    assert torch.equal(v_pages.float(), expected[3].float())
    assert k_pages.float().abs().sum() > 0  # the append did write


# ---------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------


def test_gelu_tanh_and_mul_reference_is_flashinfers_template_and_the_tanh_formula():
    x = _bf16(5, 2 * 6912, seed=1) * 3
    ours = _reference("gelu_tanh_and_mul_h6912_bf16")(x)
    _rel_close(ours, fi_activation._gelu_tanh_and_mul_reference(x.float()))
    gate, up = x.double().chunk(2, dim=-1)
    formula = 0.5 * gate * (1 + torch.tanh(0.7978845608028654 * (gate + 0.044715 * gate**3)))
    _rel_close(ours, formula * up)
    # Not the exact GELU: the approximations differ where the check can see it.
    erf = 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2)))
    assert (formula - erf).abs().max() > 1e-4


def test_gelu_tanh_and_mul_routes_both_dtypes_and_writes_out():
    x = _bf16(3, 2 * 6912, seed=2)
    out = torch.empty(3, 6912, dtype=torch.bfloat16)
    cases = [
        ({}, {"x": x}),
        ({"out": out, "enable_pdl": True}, {"x": x}),
    ]
    returned = _route(
        "gelu_tanh_and_mul", "gelu_tanh_and_mul_h6912_bf16", (x,), cases, "activation"
    )
    expected = _reference("gelu_tanh_and_mul_h6912_bf16")(x)
    assert torch.equal(returned[0], expected) and torch.equal(out, expected)
    assert returned[1] is out
    name = "gelu_tanh_and_mul_h6912_fp16"
    seen: list = []
    with rt.enable_apply({name: _recorder(name, seen)}):
        flashinfer.activation.gelu_tanh_and_mul(x.half())
    assert len(seen) == 1 and seen[0]["x"].dtype == torch.float16


# ---------------------------------------------------------------------------------------
# Norms
# ---------------------------------------------------------------------------------------


def _rms(x, eps):
    """RMSNorm without weight, in float64: an independent computation."""
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def test_gemma_fused_add_rmsnorm_reference_is_flashinfers_template():
    x, r, w = _bf16(4, 1152, seed=1), _bf16(4, 1152, seed=2), _bf16(1152, seed=3)
    out, residual = _reference("gemma_fused_add_rmsnorm_h1152")(x, r, w, 1e-6)
    _rel_close(out, fi_norm._gemma_fused_add_rmsnorm_reference(x, r, w))
    _rel_close(out, _rms(x.double() + r.double(), 1e-6) * (1 + w.double()))
    assert torch.equal(residual, (x.float() + r.float()).bfloat16())
    other, _ = _reference("gemma_fused_add_rmsnorm_h1152")(x * 1e-3, r * 1e-3, w, 1e-2)
    assert (other.float() - out.float()).abs().max() > 0.1  # epsilon is honoured


def test_gemma_fused_add_rmsnorm_writes_input_and_residual_in_place():
    x, r, w = _bf16(3, 1152, seed=1), _bf16(3, 1152, seed=2), _bf16(1152, seed=3)
    expected = _reference("gemma_fused_add_rmsnorm_h1152")(x, r, w, 1e-5)
    xx, rr = x.clone(), r.clone()
    cases = [
        ({"__args__": (xx, rr, w), "eps": 1e-5, "enable_pdl": True}, {"eps": 1e-5}),
        ({"__args__": (x.half(), r.half(), w.half())}, "tensor:hidden_states"),
    ]
    returned = _route(
        "gemma_fused_add_rmsnorm", "gemma_fused_add_rmsnorm_h1152", None, cases, "norm"
    )
    assert returned == [None]  # FlashInfer's in-place norms return nothing
    assert torch.equal(xx, expected[0]) and torch.equal(rr, expected[1])


def _fp8(x):
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("fused", [False, True])
def test_rmsnorm_quant_references_are_flashinfers_templates(fused):
    x, r, w = _bf16(4, 2048, seed=1), _bf16(4, 2048, seed=2), _bf16(2048, seed=3)
    scale = torch.tensor([0.01])  # small enough that some values saturate
    if fused:
        out, residual = _reference("fused_add_rmsnorm_quant_h2048")(x, r, w, scale, 1e-6)
        theirs, theirs_residual = fi_norm._fused_add_rmsnorm_quant_reference(x, r, w, scale)
        assert torch.equal(residual, theirs_residual)
        total = x.double() + r.double()
    else:
        out = _reference("rmsnorm_quant_h2048")(x, w, scale, 1e-6)
        theirs = fi_norm._rmsnorm_quant_reference(x, w, scale)
        total = x.double()
    _fp8_close(out, theirs)
    _fp8_close(out, _fp8(_rms(total, 1e-6) * w.double() / 0.01))
    assert out.float().abs().max() == FP8_MAX  # saturated, not NaN
    assert (out.float().abs() < FP8_MAX).float().mean() > 0.5


def test_rmsnorm_quant_routes_tensor_and_float_scales_and_refuses_e5m2():
    x, w = _bf16(3, 2048, seed=1), _bf16(2048, seed=2)
    out = torch.zeros(3, 2048, dtype=torch.float8_e4m3fn)
    scale = torch.tensor([0.5])
    cases = [
        ({}, {"scale": scale, "eps": 1e-6, "hidden_states": x}),
        ({"eps": 1e-5, "enable_pdl": True}, {"eps": 1e-5}),
        # The deprecated float scale reaches the solution as FlashInfer's one-element tensor.
        ({"__args__": (out, x, w, 0.5)}, {"scale": scale}),
        ({"__args__": (out.view(torch.float8_e5m2), x, w, scale)}, "tensor:out"),
        ({"__args__": (out, x.half(), w.half(), scale)}, "tensor:hidden_states"),
    ]
    returned = _route("rmsnorm_quant", "rmsnorm_quant_h2048", (out, x, w, scale), cases, "norm")
    assert returned == [None] * 3  # as FlashInfer's
    expected = _reference("rmsnorm_quant_h2048")(x, w, scale, 1e-6)
    assert torch.equal(out.float(), expected.float()) and out.float().abs().sum() > 0


def test_fused_add_rmsnorm_quant_writes_out_and_the_residual():
    x, r, w = _bf16(3, 2048, seed=1), _bf16(3, 2048, seed=2), _bf16(2048, seed=3)
    out = torch.zeros(3, 2048, dtype=torch.float8_e4m3fn)
    rr, scale = r.clone(), torch.tensor([2.0])
    expected = _reference("fused_add_rmsnorm_quant_h2048")(x, r, w, scale, 1e-5)
    cases = [
        ({"__args__": (out, x, rr, w, scale), "eps": 1e-5}, {"eps": 1e-5}),
        ({"__args__": (out.view(torch.float8_e5m2), x, r, w, scale)}, "tensor:out"),
    ]
    returned = _route(
        "fused_add_rmsnorm_quant", "fused_add_rmsnorm_quant_h2048", None, cases, "norm"
    )
    assert returned == [None]
    assert torch.equal(out.float(), expected[0].float()) and torch.equal(rr, expected[1])
    assert not torch.equal(rr, r)


def test_layernorm_quant_reference_is_flashinfers_template():
    x, w, b = _bf16(4, 768, seed=1) * 2 + 1, torch.randn(768), torch.randn(768)
    scale = torch.tensor([0.005])  # small enough that some values saturate
    out = _reference("layernorm_quant_h768")(x, w, b, scale, 1e-6)
    _fp8_close(out, fi_norm._layernorm_quant_reference(x, w, b, scale))
    xd = x.double()
    normed = (xd - xd.mean(-1, keepdim=True)) / torch.sqrt(
        xd.var(-1, unbiased=False, keepdim=True) + 1e-6
    )
    _fp8_close(out, _fp8((normed * w.double() + b.double()) / 0.005))
    assert out.float().abs().max() == FP8_MAX


def test_layernorm_quant_routes_and_writes_out():
    x, w, b = _bf16(3, 768, seed=1), torch.randn(768), torch.randn(768)
    out, scale = torch.zeros(3, 768, dtype=torch.float8_e4m3fn), torch.tensor([0.5])
    cases = [
        ({}, {"scale": scale, "eps": 1e-6, "weight": w, "bias": b}),
        ({"eps": 1e-5}, {"eps": 1e-5}),
        ({"__args__": (out, x, w, b, 0.5)}, {"scale": scale}),
        ({"__args__": (out.view(torch.float8_e5m2), x, w, b, scale)}, "tensor:out"),
        ({"__args__": (out, x, w.bfloat16(), b, scale)}, "tensor:weight"),
    ]
    returned = _route(
        "layernorm_quant", "layernorm_quant_h768", (out, x, w, b, scale), cases, "norm"
    )
    assert returned == [None] * 3
    expected = _reference("layernorm_quant_h768")(x, w, b, scale, 1e-6)
    assert torch.equal(out.float(), expected.float()) and out.float().abs().sum() > 0


def _f32(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_rmsnorm_sigmoid_gate_reference_is_flashinfers_template():
    x, gate = _bf16(3, 32, 64, seed=1), _bf16(3, 32, 64, seed=2)
    out = _reference("rmsnorm_sigmoid_gate_nh32_h64")(x, gate, 1e-5)
    assert torch.equal(out, fi_norm._rmsnorm_sigmoid_gate_reference(x, gate, 1e-5))
    _rel_close(out, _rms(x, 1e-5) * torch.sigmoid(gate.double()))


def test_rmsnorm_sigmoid_gate_routes_in_place_and_refuses_2d_rows():
    x, gate = _bf16(3, 32, 64, seed=1), _bf16(3, 32, 64, seed=2)
    xx = x.clone()
    expected = _reference("rmsnorm_sigmoid_gate_nh32_h64")(x, gate, 1e-6)
    cases = [
        ({"__args__": (xx, gate), "eps": 1e-6, "enable_pdl": False}, {"eps": 1e-6}),
        ({"__args__": (x.half(), gate.half())}, "tensor:x"),
    ]
    name = "rmsnorm_sigmoid_gate_nh32_h64"
    returned = _route("rmsnorm_sigmoid_gate", name, None, cases, "norm")
    assert returned == [None] and torch.equal(xx, expected)
    # 2-D rows are not modelled: no definition is a candidate, and FlashInfer serves them.
    with rt.enable_apply({name: _recorder(name, [])}):
        with pytest.raises(FLASHINFER_ON_CPU, match=ON_CPU):
            flashinfer.norm.rmsnorm_sigmoid_gate(x.flatten(0, 1), gate.flatten(0, 1))
        assert rt.stats()["flashinfer.norm.rmsnorm_sigmoid_gate"]["fallback_no_candidate"] == 1


@pytest.mark.parametrize("weighted", [True, False])
def test_gated_residual_rmsnorm_reference_is_flashinfers_template(weighted):
    branch, residual = _bf16(2, 8192, seed=1), _f32(2, 8192, seed=2)
    weight = _bf16(8192, seed=3) if weighted else None
    alpha, beta = _f32(8192, seed=4), _f32(8192, seed=5)
    args = (branch, residual, weight, alpha, beta, 1e-6, 0.5)
    out = _reference("gated_residual_rmsnorm_h8192")(*args)
    assert out.dtype == torch.float32
    assert torch.allclose(out, fi_norm._gated_residual_rmsnorm_reference(*args), atol=1e-5)
    values = branch.double() * ((weight.double() + 0.5) if weighted else 1.0)
    expected = alpha.double() * residual.double() + beta.double() * _rms(values, 1e-6)
    assert torch.allclose(out.double(), expected, atol=1e-4)


def test_gated_residual_rmsnorm_routes_with_and_without_a_weight():
    branch, residual = _bf16(2, 8192, seed=1), _f32(2, 8192, seed=2)
    weight, alpha, beta = _bf16(8192, seed=3), _f32(8192, seed=4), _f32(8192, seed=5)
    out = torch.zeros(2, 8192)
    cases = [
        ({}, {"weight": weight, "eps": 1e-6, "gain_center": 0.0}),
        ({"__args__": (branch, residual, None, alpha, beta)}, {"weight": None}),
        ({"eps": 1e-5, "gain_center": 1.0, "out": out, "enable_pdl": False}, {"gain_center": 1.0}),
        ({"__args__": (branch, residual.bfloat16(), weight, alpha, beta)}, "tensor:residual"),
    ]
    args = (branch, residual, weight, alpha, beta)
    returned = _route("gated_residual_rmsnorm", "gated_residual_rmsnorm_h8192", args, cases, "norm")
    run = _reference("gated_residual_rmsnorm_h8192")
    assert torch.equal(returned[0], run(*args, 1e-6, 0.0))
    assert torch.equal(returned[1], run(branch, residual, None, alpha, beta, 1e-6, 0.0))
    assert returned[2] is out and torch.equal(out, run(*args, 1e-5, 1.0))


@pytest.mark.parametrize("post_weighted", [True, False])
def test_gated_residual_next_rmsnorm_reference_is_flashinfers_template(post_weighted):
    branch, residual, next_weight = _bf16(2, 8192, seed=1), _f32(2, 8192, seed=2), _bf16(8192)
    alpha, beta = _f32(8192, seed=4), _f32(8192, seed=5)
    post_weight = _bf16(8192, seed=6) if post_weighted else None
    ours = _reference("gated_residual_next_rmsnorm_h8192")(
        branch, residual, next_weight, alpha, beta, post_weight, 1e-6, 1e-5, 0.5, 1.0
    )
    theirs = fi_norm._gated_residual_next_rmsnorm_reference(
        branch, residual, next_weight, alpha, beta, 1e-6, 1e-5, 0.5, post_weight, 1.0
    )
    assert torch.allclose(ours[0], theirs[0], atol=1e-5)
    assert ours[1].dtype == torch.bfloat16
    _rel_close(ours[1], theirs[1])
    # The FFN input is the catalogue's RMSNorm of the residual stream.
    _rel_close(ours[1], _rms(ours[0], 1e-5) * (next_weight.double() + 0.5))


def test_gated_residual_next_rmsnorm_routes_tensor_and_scalar_alpha():
    branch, residual, next_weight = _bf16(2, 8192, seed=1), _f32(2, 8192, seed=2), _bf16(8192)
    alpha, beta, post_weight = _f32(8192, seed=4), _f32(8192, seed=5), _bf16(8192, seed=6)
    residual_out, ffn_input = torch.zeros(2, 8192), torch.zeros(2, 8192, dtype=torch.bfloat16)
    cases = [
        ({}, {"alpha": alpha, "post_weight": None, "post_eps": 1e-6, "post_gain_center": 0.0}),
        # A float alpha reaches the solution as that gate on every channel.
        (
            {"__args__": (branch, residual, next_weight, 0.5, beta)},
            {"alpha": torch.full((8192,), 0.5)},
        ),
        ({"post_weight": post_weight, "post_gain_center": 1.0}, {"post_weight": post_weight}),
        (
            {"residual_out": residual_out, "ffn_input": ffn_input, "next_eps": 1e-5},
            {"next_eps": 1e-5},
        ),
        ({"__args__": (branch.half(), residual, next_weight, alpha, beta)}, "tensor:branch"),
    ]
    args = (branch, residual, next_weight, alpha, beta)
    name = "gated_residual_next_rmsnorm_h8192"
    returned = _route("gated_residual_next_rmsnorm", name, args, cases, "norm")
    run = _reference(name)
    expected = run(*args, None, 1e-6, 1e-6, 0.0, 0.0)
    assert torch.equal(returned[0][0], expected[0]) and torch.equal(returned[0][1], expected[1])
    assert returned[3][0] is residual_out and returned[3][1] is ffn_input
    assert torch.equal(ffn_input, run(*args, None, 1e-6, 1e-5, 0.0, 0.0)[1])


@pytest.mark.parametrize("head_size, rotary_dim", [(128, 128), (64, 64), (256, 256), (128, 64)])
def test_cos_sin_cache_in_place_routes_each_models_rotary_width(head_size, rotary_dim):
    q, k = _bf16(3, 4, head_size, seed=1), _bf16(3, 2, head_size, seed=2)
    cache, positions = _cos_sin_cache(8, rotary_dim), torch.tensor([0, 7, 3])
    name = f"rope_with_cos_sin_cache_neox_style_d{head_size}_rd{rotary_dim}"
    query, key = q.flatten(1).clone(), k.flatten(1).clone()
    cases = [
        ({"__args__": (positions, query, key, head_size, cache)}, {"cos_sin_cache": cache}),
        ({"is_neox": False}, "is_neox"),
    ]
    args = (positions, q.flatten(1), k.flatten(1), head_size, cache)
    _route("apply_rope_with_cos_sin_cache_inplace", name, args, cases)
    theirs = fi_rope._apply_rope_with_cos_sin_cache_reference(*args, True)
    _close(query, theirs[0]), _close(key, theirs[1])
    assert not torch.equal(query, q.flatten(1))


def test_fused_rmsnorm_silu_reference_is_flashinfers_template():
    x, w = _bf16(4, 128, seed=1) * 5 + 5, _bf16(128, seed=2).abs() + 0.5
    out = _reference("fused_rmsnorm_silu_h128")(x, w, 1e-6)
    assert torch.equal(out, fi_norm._fused_rmsnorm_silu_reference(x, w, 1e-6))
    normed = _rms(x, 1e-6) * w.double()
    _rel_close(out, normed / (1 + torch.exp(-normed)))


def test_fused_rmsnorm_silu_routes_bfloat16_output_and_refuses_fp8():
    x, w = _bf16(3, 128, seed=1), _bf16(128, seed=2)
    out = torch.zeros(3, 128, dtype=torch.bfloat16)
    cases = [
        ({}, {"eps": 1e-6, "hidden_states": x}),
        ({"eps": 1e-5, "out": out}, {"eps": 1e-5}),
        ({"out": torch.zeros(3, 128, dtype=torch.float8_e4m3fn)}, "tensor:output"),
        ({"__args__": (x, w.float())}, "tensor:weight"),
    ]
    returned = _route("fused_rmsnorm_silu", "fused_rmsnorm_silu_h128", (x, w), cases, "norm")
    run = _reference("fused_rmsnorm_silu_h128")
    assert torch.equal(returned[0], run(x, w, 1e-6))
    assert returned[1] is out and torch.equal(out, run(x, w, 1e-5))


# ---------------------------------------------------------------------------------------
# rmsnorm_fp4quant
# ---------------------------------------------------------------------------------------

FP4Q = "rmsnorm_fp4quant_h4096"
FP4Q_PATH = "flashinfer.cute_dsl.rmsnorm_fp4quant.rmsnorm_fp4quant"
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def test_rmsnorm_fp4quant_calls_are_routed_into_the_callers_buffer_and_layout():
    from fibgen.runtime import enable_apply

    x = _bf16(5, 4096, seed=21)
    w = (torch.rand(4096, generator=torch.Generator().manual_seed(4)) + 0.5).to(torch.bfloat16)
    gs, seen = torch.tensor([150.0]), []

    def solution(**inputs):
        seen.append(inputs)
        return _reference(FP4Q)(**inputs)

    y = torch.empty(5, 2048, dtype=torch.float4_e2m1fn_x2)

    def fn(*args, **kwargs):  # the patched API, looked up at each call
        return flashinfer.rmsnorm_fp4quant(*args, **kwargs)

    with enable_apply({FP4Q: solution}, strict=True):
        q, linear = fn(x, w, y_fp4=y, global_scale=gs)
        q2, swizzled = fn(x, w, global_scale=gs, is_sf_swizzled_layout=True, enable_pdl=True)
        q3, _ = fn(x, w)
    assert len(seen) == 3 and q is y and torch.equal(q.view(torch.uint8), q2.view(torch.uint8))
    # None stands for a global scale of 1.
    assert torch.equal(seen[2]["global_scale"], torch.ones(1)) and seen[0]["eps"] == 1e-6
    assert linear.dtype == swizzled.dtype == torch.float8_e4m3fn
    assert linear.shape == (5, 256) and swizzled.shape == (128 * 256,)
    r = torch.arange(5).unsqueeze(1)
    k = torch.arange(256).unsqueeze(0)
    index = k % 4 + (k // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
    assert torch.equal(swizzled.view(torch.uint8)[index], linear.view(torch.uint8))
    # Against FlashInfer's template reference (rmsnorm in float32, then absmax / 6 scales):
    # the kernel rounds x * weight to bf16 first, so scales and values agree up to that.
    theirs_q, theirs_sf = fi_norm._rmsnorm_fp4quant_reference(x, w, global_scale=gs)
    assert (linear.view(torch.uint8) == theirs_sf.view(torch.uint8)).float().mean() > 0.97
    table = torch.tensor(E2M1)
    b = q.view(torch.uint8).long()
    values = torch.stack([table[b & 15], table[b >> 4]], -1).flatten(-2)
    deq = values * linear.float().repeat_interleave(16, -1) / gs
    xf = x.float()
    exact = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    # NVFP4's error: within a quarter of each block's scale step of 1 (e2m1's 0.5 at most
    # half-way, 2 near 6), by block, plus the bf16 rounding of x * weight the kernel makes
    # first (4.99 steps may round to 5.01, hence to 6). Weights of seed 4 meet such a value.
    step = linear.float().repeat_interleave(16, -1) / gs
    assert ((deq - exact).abs() <= step + exact.abs() * 2**-8 + 1e-3).all()


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"block_size": 32}, "block_size"),
        ({"scale_format": "ue8m0"}, "scale_format"),
        ({"block_scale": torch.empty(5, 256, dtype=torch.float8_e4m3fn)}, "block_scale"),
    ],
)
def test_an_rmsnorm_fp4quant_call_the_definition_does_not_model_falls_back(kwargs, rule):
    from fibgen.runtime import enable_apply

    seen: list = []
    with enable_apply({FP4Q: lambda **i: seen.append(i)}):
        with pytest.raises(FLASHINFER_ON_CPU):
            flashinfer.rmsnorm_fp4quant(_bf16(5, 4096), _bf16(4096, seed=1), **kwargs)
    assert not seen
    (counted,) = rt.stats()[FP4Q_PATH]["rules"]
    assert rule in counted


# ---------------------------------------------------------------------------------------
# add_rmsnorm_fp4quant
# ---------------------------------------------------------------------------------------

ADD_FP4Q = "add_rmsnorm_fp4quant_h4096"
ADD_FP4Q_PATH = "flashinfer.cute_dsl.add_rmsnorm_fp4quant.add_rmsnorm_fp4quant"


def test_add_rmsnorm_fp4quant_updates_the_residual_and_quantizes_the_sum():
    from fibgen.runtime import enable_apply

    x, r0 = _bf16(5, 4096, seed=22), _bf16(5, 4096, seed=23)
    w = (torch.rand(4096, generator=torch.Generator().manual_seed(5)) + 0.5).to(torch.bfloat16)
    gs, seen = torch.tensor([150.0]), []

    def solution(**inputs):
        seen.append({k: v.clone() if torch.is_tensor(v) else v for k, v in inputs.items()})
        return _reference(ADD_FP4Q)(**inputs)

    y = torch.empty(5, 2048, dtype=torch.float4_e2m1fn_x2)
    r1, r2 = r0.clone(), r0.clone()
    with enable_apply({ADD_FP4Q: solution}, strict=True):
        q, linear = flashinfer.add_rmsnorm_fp4quant(x, r1, w, y_fp4=y, global_scale=gs)
        q2, swizzled = flashinfer.add_rmsnorm_fp4quant(
            x, r2, w, global_scale=gs, is_sf_swizzled_layout=True, enable_pdl=False
        )
    assert len(seen) == 2 and q is y and torch.equal(q.view(torch.uint8), q2.view(torch.uint8))
    # The solution is given the residual as the call held it; the sum is left in it after.
    assert torch.equal(seen[0]["residual"], r0) and seen[0]["eps"] == 1e-6
    h = x.float() + r0.float()
    assert torch.equal(r1, h.bfloat16()) and torch.equal(r2, r1)
    assert linear.shape == (5, 256) and swizzled.shape == (128 * 256,)
    r = torch.arange(5).unsqueeze(1)
    k = torch.arange(256).unsqueeze(0)
    index = k % 4 + (k // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
    assert torch.equal(swizzled.view(torch.uint8)[index], linear.view(torch.uint8))
    # The kernel normalizes bf16(h) with the statistics of the float32 h, in float32: the
    # dequantized values are within NVFP4's error (a quarter of a block's scale step of 1) of
    # that, and the scales are those of FlashInfer's template reference (float32 h) but
    # where bf16(h) moves a block's amax across an e4m3 step.
    exact = h.bfloat16().float() * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    table = torch.tensor(E2M1)
    b = q.view(torch.uint8).long()
    values = torch.stack([table[b & 15], table[b >> 4]], -1).flatten(-2)
    step = linear.float().repeat_interleave(16, -1) / gs
    assert ((values * step - exact).abs() <= step + 1e-6).all()
    sf_exact = (gs * exact.reshape(5, -1, 16).abs().amax(-1) / 6).to(torch.float8_e4m3fn)
    assert torch.equal(linear.view(torch.uint8), sf_exact.view(torch.uint8))
    _, theirs_sf = fi_norm._add_rmsnorm_fp4quant_reference(x, r0.clone(), w, global_scale=gs)
    assert (linear.view(torch.uint8) == theirs_sf.view(torch.uint8)).float().mean() > 0.97


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"block_size": 32}, "block_size"),
        ({"scale_format": "ue8m0"}, "scale_format"),
        ({"block_scale": torch.empty(5, 256, dtype=torch.float8_e4m3fn)}, "block_scale"),
        ({"output_both_sf_layouts": True}, "output_both_sf_layouts"),
        ({"y_out": torch.empty(5, 4096, dtype=torch.bfloat16)}, "y_out"),
    ],
)
def test_an_add_rmsnorm_fp4quant_call_the_definition_does_not_model_falls_back(kwargs, rule):
    from fibgen.runtime import enable_apply

    seen: list = []
    residual = _bf16(5, 4096, seed=2)
    before = residual.clone()
    with enable_apply({ADD_FP4Q: lambda **i: seen.append(i)}):
        with pytest.raises(FLASHINFER_ON_CPU):
            flashinfer.add_rmsnorm_fp4quant(_bf16(5, 4096), residual, _bf16(4096, seed=1), **kwargs)
    assert not seen and torch.equal(residual, before)
    (counted,) = rt.stats()[ADD_FP4Q_PATH]["rules"]
    assert rule in counted
