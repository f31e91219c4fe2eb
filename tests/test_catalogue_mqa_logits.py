"""The paged MQA logits families of ``attention_dsa.fidef`` against the real FlashInfer.

FlashInfer 0.7.2.post1 is installed; its kernels need a Blackwell GPU, so its functions are
never run here. The real function is replaced by a recorder with its signature before apply is
enabled, and each check calls the patched API: a call with FlashInfer's defaults is routed with
the logits as wide as its ``max_seq_len`` argument (a `var scalar` axis), each ruled parameter
at another value is refused with its rule counted, and the reference agrees with the reference
of FlashInfer's own trace template.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch
from _shared import catalogue_module, require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _mqa_logits_calls as calls  # noqa: E402
import _routable_calls as routable  # noqa: E402
import fibgen.runtime as rt  # noqa: E402
from fibgen.runtime.routing import patching  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning")

FP8 = "flashinfer.attn_scores.attn_scores.fp8_paged_mqa_logits"
FP4 = "flashinfer.attn_scores.attn_scores.fp4_paged_mqa_logits"


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


def _route(monkeypatch, path: str, name: str, args: tuple, kwargs: dict):
    """Call the patched API with a solution for ``name`` that runs the reference; returns
    (result, the inputs the solution saw, the calls FlashInfer's function got, counts)."""
    owner, attr = patching._locate(path)
    real = getattr(owner, attr)
    originals: list = []

    def original(*a, **k):
        originals.append(inspect.signature(real).bind(*a, **k).arguments)
        return "flashinfer"

    original.__signature__ = inspect.signature(real)  # type: ignore[attr-defined]
    monkeypatch.setattr(owner, attr, original)
    seen: list = []

    def solution(**inputs):
        seen.append(inputs)
        return _reference(name)(**inputs)

    rt.enable_apply({name: solution})
    result = getattr(owner, attr)(*args, **kwargs)
    counts = rt.stats()[path]
    rt.disable_apply()
    return result, seen, originals, counts


def test_fp8_logits_are_as_wide_as_max_seq_len(monkeypatch):
    # 100 columns: not a multiple of the 64-token block, and wider than every seq_lens entry.
    args, x, _ = calls.fp8_case(_catalogue(), max_seq_len=100)
    result, seen, originals, counts = _route(monkeypatch, FP8, calls.FP8_NAME, args, {})
    assert counts["hit"] == 1 and not originals, counts
    (inputs,) = seen
    assert inputs["max_seq_len"] == 100 and inputs["kv_fused"].dtype == torch.int8
    assert result.shape == (4, 100) and result.dtype == torch.float32
    # Row b * next_n + t sees positions up to seq_lens[b] - next_n + t, and -inf after.
    for row in range(4):
        limit = int(x["seq_lens"][row // 2]) - 2 + row % 2
        assert torch.isfinite(result[row, : limit + 1]).all()
        assert torch.isneginf(result[row, limit + 1 :]).all()


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("output_dtype", torch.float16),
        ("epi_dtype", torch.float16),
        ("acc_dtype", torch.float16),
        ("out", torch.zeros(4, 128)),
    ],
)
def test_fp8_ruled_parameters_are_refused_at_other_values(monkeypatch, param, value):
    args, _, _ = calls.fp8_case(_catalogue())
    result, seen, originals, counts = _route(monkeypatch, FP8, calls.FP8_NAME, args, {param: value})
    assert counts["hit"] == 0 and not seen and counts["rules"] == {param: 1}, counts
    assert result == "flashinfer" and len(originals) == 1


def test_fp8_reference_agrees_with_flashinfers_template():
    from flashinfer.trace.templates.attn_scores import _fp8_paged_mqa_logits_reference

    args, x, _ = calls.fp8_case(_catalogue(), seed=3, max_seq_len=130)
    ours = _reference(calls.FP8_NAME)(**x)
    theirs = _fp8_paged_mqa_logits_reference(*args)
    assert ours.shape == theirs.shape == (4, 130)
    assert torch.equal(torch.isneginf(ours), torch.isneginf(theirs))
    finite = torch.isfinite(theirs)
    assert finite.any()
    torch.testing.assert_close(ours[finite], theirs[finite], rtol=1e-5, atol=1e-4)


def test_fp4_logits_are_bfloat16_and_as_wide_as_max_seq_len(monkeypatch):
    args, x, _ = calls.fp4_case(_catalogue(), max_seq_len=70)
    result, seen, originals, counts = _route(monkeypatch, FP4, calls.FP4_NAME, args, {})
    assert counts["hit"] == 1 and not originals, counts
    (inputs,) = seen
    assert inputs["max_seq_len"] == 70 and inputs["kv_fused"].dtype == torch.int8
    assert result.shape == (4, 70) and result.dtype == torch.bfloat16
    for row in range(4):
        limit = int(x["seq_lens"][row // 2]) - 2 + row % 2
        assert torch.isfinite(result[row, : limit + 1]).all()
        assert torch.isneginf(result[row, limit + 1 :]).all()


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("sf_vec_size", 16),
        ("output_dtype", torch.float32),
        ("epi_dtype", torch.bfloat16),
        ("is_kv_sf_interleaved", True),
        ("out", torch.zeros(4, 128, dtype=torch.bfloat16)),
    ],
)
def test_fp4_ruled_parameters_are_refused_at_other_values(monkeypatch, param, value):
    args, _, _ = calls.fp4_case(_catalogue())
    result, seen, originals, counts = _route(monkeypatch, FP4, calls.FP4_NAME, args, {param: value})
    assert counts["hit"] == 0 and not seen and counts["rules"] == {param: 1}, counts
    assert result == "flashinfer" and len(originals) == 1


def test_fp4_reference_agrees_with_flashinfers_template_on_its_own_quantizer():
    # Inputs made as FlashInfer's template makes them: bfloat16 values cast to MXFP4 by its
    # per-token quantizer, so that the scales are what a real caller passes.
    from flashinfer.trace.templates import attn_scores as t

    torch.manual_seed(0)
    batch, next_n, heads, dim, block = 2, 2, 64, 128, 64
    seq_lens = torch.tensor([70, 5], dtype=torch.int32)
    tables, num_blocks = t._make_paged_block_table(seq_lens, block, "cpu")
    codes, sf = t._per_token_cast_to_fp4(torch.randn(batch * next_n * heads, dim), gran_k=32)
    q = codes.view(torch.uint8).view(batch, next_n, heads, dim // 2)
    q_sf = sf.view(torch.int32).view(batch, next_n, heads)
    kv, _ = t._pack_kv_cache_fp4(torch.randn(num_blocks, block, 1, dim))
    weights = torch.randn(batch * next_n, heads)
    args = (q, q_sf, kv, weights, tables, seq_lens, 90)
    theirs = t._fp4_paged_mqa_logits_reference(*args)
    ours = _reference(calls.FP4_NAME)(
        q.view(torch.float4_e2m1fn_x2), q_sf, kv.view(torch.int8), *args[3:]
    )
    assert ours.shape == theirs.shape == (4, 90) and ours.dtype == theirs.dtype
    assert torch.equal(torch.isneginf(ours), torch.isneginf(theirs))
    finite = torch.isfinite(theirs)
    assert finite.sum() == 70 + 69 + 5 + 4
    torch.testing.assert_close(ours[finite].float(), theirs[finite].float(), rtol=1e-2, atol=1e-2)


def test_fp4_inputs_carry_ue8m0_scales_in_a_finite_range():
    # `ue8m0_packed()` and `mxfp4_paged_with_scales()`: scale bytes are exponents 120..130.
    _, x, axes = calls.fp4_case(_catalogue())
    q_bytes = x["q_sf"].view(torch.uint8)
    raw = x["kv_fused"].view(torch.uint8).reshape(axes["num_blocks"], -1)
    kv_bytes = raw[:, 64 * 64 :]
    for scale_bytes in (q_bytes, kv_bytes):
        assert scale_bytes.numel() and scale_bytes.min() >= 120 and scale_bytes.max() <= 130
    assert kv_bytes.numel() == axes["num_blocks"] * 64 * 4
    assert len(set(q_bytes.flatten().tolist())) > 1  # not one value everywhere


# ---------------------------------------------------------------------------------------
# msa_proxy_score (attention_msa.fidef): max_k_tiles sizes the output
# ---------------------------------------------------------------------------------------

PROXY = "flashinfer.msa_ops.proxy_score.msa_proxy_score"


def test_msa_proxy_without_max_k_tiles_gets_flashinfers_default_width(monkeypatch):
    import _attn_b_calls as b

    args, x, _ = b.msa_proxy_case(_catalogue())
    result, seen, originals, counts = _route(monkeypatch, PROXY, b.PROXY_NAME, args, {})
    assert counts["hit"] == 1 and not originals, counts
    lengths = (x["cu_seqlens_k"][1:] - x["cu_seqlens_k"][:-1]).tolist()
    tiles = max((n + 127) // 128 for n in lengths)
    (inputs,) = seen
    assert inputs["max_k_tiles"] == tiles and inputs["causal"] is True
    assert result.shape == (4, tiles, x["q"].shape[0]) and result.dtype == torch.float32


def test_msa_proxy_writes_a_callers_output_as_wide_as_max_k_tiles(monkeypatch):
    import _attn_b_calls as b

    args, x, axes = b.msa_proxy_case(_catalogue(), max_k_tiles=5)
    output = torch.zeros(4, 5, axes["total_q"])
    kwargs = {"max_k_tiles": 5, "output": output, "causal": False}
    result, seen, _, counts = _route(monkeypatch, PROXY, b.PROXY_NAME, args, kwargs)
    assert counts["hit"] == 1 and result is output, counts
    assert seen[0]["max_k_tiles"] == 5 and seen[0]["causal"] is False
    assert torch.isneginf(output[:, 2:]).all()  # no sequence has more than 200 keys


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("page_table", torch.zeros(2, 4, dtype=torch.int32)),
        ("seqused_k", torch.ones(2, dtype=torch.int32)),
        ("reduce_heads", True),
        ("q_offset", 3),
    ],
)
def test_msa_proxy_ruled_parameters_are_refused_at_other_values(monkeypatch, param, value):
    import _attn_b_calls as b

    args, _, _ = b.msa_proxy_case(_catalogue())
    result, seen, originals, counts = _route(monkeypatch, PROXY, b.PROXY_NAME, args, {param: value})
    assert counts["hit"] == 0 and not seen and counts["rules"] == {param: 1}, counts
    assert result == "flashinfer" and len(originals) == 1


@pytest.mark.parametrize("param", ["max_seqlen_q", "max_k_tiles"])
def test_msa_proxy_leaves_a_grid_smaller_than_the_batch_to_flashinfer(monkeypatch, param):
    # FlashInfer sizes its grid by max_seqlen_q and leaves the rows past it unwritten; its
    # split-K loop runs past a max_k_tiles below the longest sequence's blocks.
    import _attn_b_calls as b

    args, x, _ = b.msa_proxy_case(_catalogue())
    assert b._longest(x["cu_seqlens_q"]) > 1
    assert b._longest(x["cu_seqlens_k"]) > 128
    result, seen, originals, counts = _route(monkeypatch, PROXY, b.PROXY_NAME, args, {param: 1})
    assert counts["hit"] == 0 and not seen and len(originals) == 1, counts
    (rule,) = counts["rules"]
    assert param in rule.split(","), counts


@pytest.mark.parametrize("causal", [True, False])
def test_msa_proxy_reference_agrees_with_flashinfers_template(causal):
    from flashinfer.trace.templates.msa import _msa_proxy_score_reference

    torch.manual_seed(0)
    # Two sequences over several 128-token blocks; the second has more queries than one block.
    cu_q = torch.tensor([0, 3, 140], dtype=torch.int32)
    cu_k = torch.tensor([0, 300, 600], dtype=torch.int32)
    q, k = torch.randn(140, 4, 128).bfloat16(), torch.randn(600, 2, 128).bfloat16()
    theirs = _msa_proxy_score_reference(q, k, cu_q, cu_k, causal=causal)
    ours = _reference("msa_proxy_score_h4_kv4_d128")(q, k, cu_q, cu_k, causal, 3)
    assert ours.shape == theirs.shape == (4, 3, 140)
    assert torch.equal(torch.isneginf(ours), torch.isneginf(theirs))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-3)
    # A wider output is -inf past the blocks; a narrower one keeps the first blocks.
    wide = _reference("msa_proxy_score_h4_kv4_d128")(q, k, cu_q, cu_k, causal, 5)
    assert torch.equal(wide[:, :3], ours) and torch.isneginf(wide[:, 3:]).all()


PROXY_FP4 = "flashinfer.msa_ops.proxy_score.msa_proxy_score_fp4"


def test_msa_proxy_fp4_is_routed_with_flashinfers_uint8_bytes(monkeypatch):
    import _attn_b_calls as b

    args, x, _ = b.msa_proxy_fp4_case(_catalogue())
    result, seen, originals, counts = _route(monkeypatch, PROXY_FP4, b.PROXY_FP4_NAME, args, {})
    assert counts["hit"] == 1 and not originals, counts
    (inputs,) = seen
    assert inputs["q_scale"].dtype == torch.float8_e4m3fn
    lengths = (x["cu_seqlens_k"][1:] - x["cu_seqlens_k"][:-1]).tolist()
    tiles = max((n + 127) // 128 for n in lengths)
    assert inputs["max_k_tiles"] == tiles and result.shape == (4, tiles, x["q_fp4"].shape[0])


@pytest.mark.parametrize(
    ("param", "value"),
    [("page_table", torch.zeros(2, 4, dtype=torch.int32)), ("reduce_heads", True)],
)
def test_msa_proxy_fp4_ruled_parameters_are_refused_at_other_values(monkeypatch, param, value):
    import _attn_b_calls as b

    args, _, _ = b.msa_proxy_fp4_case(_catalogue())
    result, seen, originals, counts = _route(
        monkeypatch, PROXY_FP4, b.PROXY_FP4_NAME, args, {param: value}
    )
    assert counts["hit"] == 0 and not seen and counts["rules"] == {param: 1}, counts
    assert result == "flashinfer" and len(originals) == 1


def test_msa_proxy_fp4_reference_agrees_with_flashinfers_template():
    import _attn_b_calls as b
    from flashinfer.trace.templates.msa import _msa_proxy_score_fp4_reference

    # 160 rows of Q scales: two row tiles of the 128x4 layout.
    args, x, _ = b.msa_proxy_fp4_case(_catalogue(), seed=2, max_k_tiles=2, total_q=40)
    assert x["q_scale"].numel() == 2 * 1024
    theirs = _msa_proxy_score_fp4_reference(*args, causal=True)
    ours = _reference(b.PROXY_FP4_NAME)(**x)
    k_lengths = (x["cu_seqlens_k"][1:] - x["cu_seqlens_k"][:-1]).tolist()
    assert ours.shape[1] == 2 and theirs.shape[1] == max((n + 127) // 128 for n in k_lengths)
    width = min(2, theirs.shape[1])
    assert torch.equal(torch.isneginf(ours[:, :width]), torch.isneginf(theirs[:, :width]))
    finite = torch.isfinite(theirs[:, :width])
    assert finite.any()
    torch.testing.assert_close(ours[:, :width][finite], theirs[:, :width][finite])
