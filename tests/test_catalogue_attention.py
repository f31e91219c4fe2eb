"""The attention families of attention_single, attention_cascade, attention_batch,
attention_page and attention_block_sparse.fidef,
held to the real FlashInfer 0.7.2 on the CPU.

Routing: FlashInfer's own functions are called with apply on and a solution that records
what it is given. A call with FlashInfer's defaults, and one with each parameter the
definition reads at another value (a window, a soft cap, a scale, causal, an HND layout,
sinks), reach the solution with the values the definition declares; a call with a ruled
parameter at a value the definition does not model is refused, counted with its rule, and
goes to FlashInfer itself, whose kernels raise on this CPU. The wrappers' constructors and
plans need a GPU, so their plan and run are replaced on the real classes by stand-ins with
the real signatures that record the calls (``_recording_wrapper``); routing is then the same.

References: each family's reference against an independent computation of the same thing:
FlashInfer's template references (``flashinfer.trace.templates``) where they exist, dense
attention with an explicit mask, or the dataset's paged definitions of this catalogue.
"""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch

from _shared import require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import flashinfer  # noqa: E402
import flashinfer.cascade  # noqa: E402
import flashinfer.cudnn.decode  # noqa: E402
import flashinfer.cudnn.prefill  # noqa: E402
import flashinfer.decode  # noqa: E402
import flashinfer.page  # noqa: E402
import flashinfer.pod  # noqa: E402
import flashinfer.prefill  # noqa: E402
from flashinfer.trace.templates import attention as fi_attention  # noqa: E402
from flashinfer.trace.templates import cascade as fi_cascade  # noqa: E402
from flashinfer.trace.templates import page as fi_page  # noqa: E402

import _routable_calls as routable  # noqa: E402
import fibgen.runtime as rt  # noqa: E402
from fibgen.compiler import compile_paths  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# What FlashInfer raises here: its kernels, or (single_prefill's backend choice) its
# compute-capability query, which refuses a CPU device.
ON_CPU = "FlashInfer requires GPUs|device must be a cuda device"
FLASHINFER_ON_CPU = (RuntimeError, ValueError)
# Slow as a whole: attention calls through the real FlashInfer's API, and their references.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning"),
]


@functools.cache
def _module():
    files = [ROOT / "definitions" / f for f in ("attention_gqa.fidef", "attention_single.fidef")]
    files += [
        ROOT / "definitions" / f for f in ("attention_cascade.fidef", "attention_batch.fidef")
    ]
    files += [
        ROOT / "definitions" / f for f in ("attention_page.fidef", "attention_block_sparse.fidef")
    ]
    result = compile_paths([str(f) for f in files])
    assert result.ok, "the attention definitions do not compile"
    return result.module


@functools.cache
def _catalogue():
    return routable.Catalogue(_module())


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


def _bf16(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _close(a, b, atol=2e-2):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert (a.float() - b.float()).abs().max().item() <= atol


def _counts(path):
    return rt.stats()[path]


def _same(value, expected):
    if isinstance(expected, torch.Tensor):
        return isinstance(value, torch.Tensor) and torch.equal(value, expected)
    if isinstance(expected, float):
        return value == pytest.approx(expected)
    return value == expected


def _dense(q, k, v, *, sm_scale, causal=False, window_left=-1, cap=0.0, sinks=None):
    """Attention of q [m, h, d] as the last m of the n tokens of k, v [n, kv, d], one head
    at a time with an explicit mask: an independent computation of FlashInfer's masks.
    Returns the output and the base-2 lse (without sinks)."""
    m, h, _ = q.shape
    n, kv, _ = k.shape
    out = torch.zeros(m, h, v.shape[-1])
    lse = torch.full((m, h), -math.inf)
    for head in range(h):
        kh = head // (h // kv)
        for i in range(m):
            pos = n - m + i
            keys = [j for j in range(n) if not (causal and j > pos)]
            keys = [j for j in keys if window_left < 0 or j >= pos - window_left]
            if not keys:
                continue
            x = (k[keys, kh].float() @ q[i, head].float()) * sm_scale
            if cap > 0:
                x = cap * torch.tanh(x / cap)
            lse[i, head] = torch.logsumexp(x, 0) / math.log(2)
            if sinks is not None:
                x = torch.cat([x, sinks[head].float().reshape(1)])
            p = torch.softmax(x, 0)[: len(keys)]
            out[i, head] = p @ v[keys, kh].float()
    return out, lse


# ---------------------------------------------------------------------------------------
# References against independent computations
# ---------------------------------------------------------------------------------------


def test_single_decode_reference_is_flashinfers_template_and_masks_as_documented():
    q, k, v = _bf16(32, 128, seed=1), _bf16(9, 8, 128, seed=2), _bf16(9, 8, 128, seed=3)
    run = _reference("single_decode_h32_kv8_d128")
    ours = run(q, k, v, 0.07, -1, 0.0)
    _close(ours, fi_attention._single_decode_reference(q, k, v, sm_scale=0.07))
    for window, cap in ((3, 0.0), (-1, 5.0), (0, 2.0)):
        expected, _ = _dense(q[None], k, v, sm_scale=0.07, window_left=window, cap=cap)
        _close(run(q, k, v, 0.07, window, cap), expected[0])
    # The window and the cap change the result: the check above can fail.
    assert not torch.equal(run(q, k, v, 0.07, 3, 0.0), ours)
    assert not torch.equal(run(q, k, v, 0.07, -1, 0.5), ours)


@pytest.mark.parametrize("causal", [True, False])
def test_single_prefill_reference_is_flashinfers_template_and_masks_as_documented(causal):
    q, k, v = _bf16(4, 16, 64, seed=1), _bf16(11, 4, 64, seed=2), _bf16(11, 4, 64, seed=3)
    run = _reference("single_prefill_h32_kv8_d128")
    ours = run(q, k, v, causal, 0.1, -1, 0.0)
    _close(ours, fi_attention._single_prefill_reference(q, k, v, causal=causal, sm_scale=0.1))
    for window, cap in ((2, 0.0), (-1, 3.0), (5, 3.0)):
        expected, _ = _dense(q, k, v, sm_scale=0.1, causal=causal, window_left=window, cap=cap)
        _close(run(q, k, v, causal, 0.1, window, cap), expected)
    assert not torch.equal(run(q, k, v, not causal, 0.1, -1, 0.0), ours)


def test_single_prefill_reference_gives_zeros_to_a_query_that_sees_nothing():
    # More queries than keys, causal: the first query sits before the first key.
    q, k = _bf16(3, 8, 64, seed=1), _bf16(2, 8, 64, seed=2)
    out = _reference("single_prefill_h32_kv8_d128")(q, k, k, True, 0.1, -1, 0.0)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and out[1:].abs().sum() > 0


def test_merge_state_references_are_flashinfers_templates():
    v, s = _bf16(5, 8, 64, seed=1), torch.randn(5, 8) * 4
    v2, s2 = _bf16(5, 8, 64, seed=2), torch.randn(5, 8) * 4
    mask = torch.tensor([True, False, True, True, False])
    run = _reference("merge_state_in_place_h32_d128")
    for m in (None, mask):
        ours_v, ours_s = run(v, s, v2, s2, m)
        theirs_v, theirs_s = fi_cascade._merge_state_in_place_reference(v, s, v2, s2, m)
        _close(ours_v, theirs_v)
        assert torch.allclose(ours_s, theirs_s, atol=1e-5)
    assert torch.equal(run(v, s, v2, s2, mask)[0][1], v[1])  # a masked row is left alone
    vs, ss = _bf16(5, 3, 8, 64, seed=3), torch.randn(5, 3, 8) * 4
    ours_v, ours_s = _reference("merge_states_h32_d128")(vs, ss)
    theirs_v, theirs_s = fi_cascade._merge_states_reference(vs, ss)
    _close(ours_v, theirs_v)
    assert torch.allclose(ours_s, theirs_s, atol=1e-5)


def _pages(tokens, page_size, first_page):
    """kv indices of ``tokens`` laid into pages from ``first_page``, and its last page length."""
    n = -(-tokens // page_size)
    return torch.arange(first_page, first_page + n, dtype=torch.int32), tokens - (n - 1) * page_size


@pytest.mark.parametrize("cap", [0.0, 4.0])
def test_two_level_cascade_is_attention_over_the_shared_prefix_and_the_request(cap):
    # Two requests share a 21-token prefix (pages 0-2); each has its own tokens after it.
    # Cascade attention equals attention over prefix + own tokens, causal at the end.
    ps, kv, h, d = 8, 2, 8, 64
    k_cache, v_cache = _bf16(16, ps, kv, d, seed=1), _bf16(16, ps, kv, d, seed=2)
    shared_pages, shared_last = _pages(21, ps, 0)
    own = [(10, 3), (5, 2)]  # (own tokens, queries) per request
    indices, lasts, qo = [], [], [0]
    first = 3
    for tokens, queries in own:
        pages, last = _pages(tokens, ps, first)
        first += pages.numel()
        indices.append(pages), lasts.append(last), qo.append(qo[-1] + queries)
    q = _bf16(qo[-1], h, d, seed=3)
    i32 = functools.partial(torch.tensor, dtype=torch.int32)
    unique_indptr = i32([0, indices[0].numel(), indices[0].numel() + indices[1].numel()])
    out = _reference("multi_level_cascade_run_h32_kv8_d128_ps16")(
        q, k_cache, v_cache,
        i32([0, qo[-1]]), i32([0, shared_pages.numel()]), shared_pages, i32([shared_last]),
        i32(qo), unique_indptr, torch.cat(indices), i32(lasts),
        True, 0.1, cap,
    )  # fmt: skip
    flat_k, flat_v = k_cache.flatten(0, 1), v_cache.flatten(0, 1)
    prefix = list(range(21))
    for b, (tokens, _) in enumerate(own):
        start = 3 * ps + sum(-(-t // ps) for t, _ in own[:b]) * ps
        keys = prefix + list(range(start, start + tokens))
        expected, _ = _dense(
            q[qo[b] : qo[b + 1]], flat_k[keys], flat_v[keys], sm_scale=0.1, causal=True, cap=cap
        )
        _close(out[qo[b] : qo[b + 1]], expected)


def _paged_batch(seed=0, ps=16, kv=8, h=32, d=128, qo_lens=(3, 1, 5), kv_lens=(20, 7, 16)):
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // ps) for n in kv_lens]
    num_pages = sum(pages) + 3
    indices = torch.randperm(num_pages, generator=g)[: sum(pages)].to(torch.int32)
    i32 = functools.partial(torch.tensor, dtype=torch.int32)
    kv_indptr = i32([0, *torch.tensor(pages).cumsum(0).tolist()])
    qo_indptr = i32([0, *torch.tensor(qo_lens).cumsum(0).tolist()])
    last = i32([n - (p - 1) * ps for n, p in zip(kv_lens, pages)])
    k = torch.randn(num_pages, ps, kv, d, generator=g).to(torch.bfloat16)
    v = torch.randn(num_pages, ps, kv, d, generator=g).to(torch.bfloat16)
    q = torch.randn(int(qo_indptr[-1]), h, d, generator=g).to(torch.bfloat16)
    return {"q": q, "k": k, "v": v, "qo": qo_indptr, "kv": kv_indptr, "idx": indices}, {
        "last": last,
        "kv_lens": i32(list(kv_lens)),
    }


def _tokens(x, b, n):
    pages = x["idx"][x["kv"][b] : x["kv"][b + 1]].long()
    return x["k"][pages].flatten(0, 1)[:n], x["v"][pages].flatten(0, 1)[:n]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cap", [0.0, 6.0])
def test_batch_attention_reference_is_the_paged_prefill_with_causal_and_cap_as_inputs(causal, cap):
    x, lens = _paged_batch()
    run = _reference("batch_attention_run_h32_kv8_d128_ps16")
    args = (x["q"], x["k"], x["v"], x["qo"], x["kv"], x["idx"], lens["last"])
    out, lse = run(*args, causal, 0.1, cap)
    if causal and cap == 0.0:  # the dataset's contract, in attention_gqa.fidef
        o2, l2 = _reference("gqa_paged_prefill_causal_h32_kv8_d128_ps64")(*args, 0.1)
        _close(out, o2) and None
        assert torch.allclose(lse, l2, atol=1e-3)
    for b in range(3):
        n = int(lens["kv_lens"][b])
        k, v = _tokens(x, b, n)
        rows = slice(int(x["qo"][b]), int(x["qo"][b + 1]))
        expected, expected_lse = _dense(x["q"][rows], k, v, sm_scale=0.1, causal=causal, cap=cap)
        _close(out[rows], expected)
        assert torch.allclose(lse[rows], expected_lse, atol=1e-3)


def test_batch_attention_reference_agrees_with_flashinfers_template_on_its_case():
    # FlashInfer's template reference: one request, the whole cache, no mask, 1/sqrt(d).
    k, v, q = _bf16(3, 16, 2, 64, seed=1), _bf16(3, 16, 2, 64, seed=2), _bf16(5, 8, 64, seed=3)
    i32 = functools.partial(torch.tensor, dtype=torch.int32)
    out, lse = _reference("batch_attention_run_h32_kv8_d128_ps16")(
        q, k, v, i32([0, 5]), i32([0, 3]), i32([0, 1, 2]), i32([16]), False, 1 / 8, 0.0
    )
    theirs, theirs_lse = fi_attention._batch_attention_run_reference(q, (k, v))
    _close(out, theirs)
    assert torch.allclose(lse, theirs_lse, atol=1e-3)


def test_pod_reference_is_a_single_prefill_and_a_paged_decode():
    x, lens = _paged_batch(qo_lens=(1, 1, 1))
    q_p, k_p, v_p = _bf16(4, 32, 128, seed=5), _bf16(9, 8, 128, seed=6), _bf16(9, 8, 128, seed=7)
    out_p, out_d = _reference("pod_run_h32_kv8_d128_ps16")(
        q_p, k_p, v_p, x["q"], x["k"], x["v"], x["kv"], x["idx"], lens["last"],
        True, 0.08, -1, 0.1, -1,
    )  # fmt: skip
    _close(out_p, fi_attention._single_prefill_reference(q_p, k_p, v_p, causal=True, sm_scale=0.08))
    decode = _reference("gqa_paged_decode_h32_kv8_d128_ps64")
    expected, _ = decode(x["q"], x["k"], x["v"], x["kv"], x["idx"], lens["last"], 0.1)
    _close(out_d, expected)
    # The decode window counts back from each request's last token.
    _, out_w = _reference("pod_run_h32_kv8_d128_ps16")(
        q_p, k_p, v_p, x["q"], x["k"], x["v"], x["kv"], x["idx"], lens["last"],
        True, 0.08, -1, 0.1, 4,
    )  # fmt: skip
    for b in range(3):
        k, v = _tokens(x, b, int(lens["kv_lens"][b]))
        windowed, _ = _dense(x["q"][b : b + 1], k, v, sm_scale=0.1, window_left=4)
        _close(out_w[b : b + 1], windowed)


def test_batch_pod_reference_is_a_paged_prefill_and_a_paged_decode():
    xp, lp = _paged_batch(seed=1)
    xd, ld = _paged_batch(seed=2, qo_lens=(1, 1, 1), kv_lens=(9, 33, 2))
    out_p, out_d = _reference("batch_pod_run_h32_kv8_d128_ps16")(
        xp["q"], xp["k"], xp["v"], xp["qo"], xp["kv"], xp["idx"], lp["last"],
        xd["q"], xd["k"], xd["v"], xd["qo"], xd["kv"], xd["idx"], ld["last"],
        True, 0.1, -1,
    )  # fmt: skip
    prefill = _reference("gqa_paged_prefill_causal_h32_kv8_d128_ps64")
    expected_p, _ = prefill(
        xp["q"], xp["k"], xp["v"], xp["qo"], xp["kv"], xp["idx"], lp["last"], 0.1
    )
    _close(out_p, expected_p)
    decode = _reference("gqa_paged_decode_h32_kv8_d128_ps64")
    expected_d, _ = decode(xd["q"], xd["k"], xd["v"], xd["kv"], xd["idx"], ld["last"], 0.1)
    _close(out_d, expected_d)


@pytest.mark.parametrize("window_left", [-1, 5])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_cudnn_decode_reference_is_flashinfers_template(window_left, with_sinks):
    g = torch.Generator().manual_seed(0)
    ps, kv, h, d = 16, 2, 8, 64
    k = torch.randn(7, kv, ps, d, generator=g).to(torch.bfloat16)
    v = torch.randn(7, kv, ps, d, generator=g).to(torch.bfloat16)
    q = torch.randn(3, h, d, generator=g).to(torch.bfloat16)
    tables = torch.tensor([[4, 1], [0, 6], [2, 3]], dtype=torch.int32)
    lens = torch.tensor([20, 16, 3], dtype=torch.int32)
    sinks = torch.randn(h, generator=g) if with_sinks else None
    out, lse = _reference("cudnn_batch_decode_h64_kv8_d64_ps16")(
        q, k, v, 0.125, 32, lens, tables, window_left, sinks
    )
    theirs = fi_attention._cudnn_batch_decode_reference(
        q, k, v, 0.125, None, 32, block_tables=tables, actual_seq_lens_kv=lens,
        window_left=window_left, sinks=sinks,
    )  # fmt: skip
    _close(out, theirs)
    for b in range(3):
        keys = k[tables[b].long()].permute(0, 2, 1, 3).flatten(0, 1)[: int(lens[b])]
        vals = v[tables[b].long()].permute(0, 2, 1, 3).flatten(0, 1)[: int(lens[b])]
        _, expected_lse = _dense(q[b : b + 1], keys, vals, sm_scale=0.125, window_left=window_left)
        assert torch.allclose(lse[b], expected_lse[0], atol=1e-3)
    if with_sinks:  # a sink takes softmax mass: the output shrinks
        plain, _ = _reference("cudnn_batch_decode_h64_kv8_d64_ps16")(
            q, k, v, 0.125, 32, lens, tables, window_left, None
        )
        assert not torch.equal(plain, out)


# ---------------------------------------------------------------------------------------
# Routing of FlashInfer's functions
# ---------------------------------------------------------------------------------------


def _route(path, name, call, cases):
    """Each case is (keyword overrides, expected): a dict of inputs the solution must see,
    or the name of the rule that refuses the call, or (that name, the exception FlashInfer's
    own function raises where it fails before reaching a kernel). Returns the inputs seen
    per routed case."""
    seen: list = []
    args, kwargs = call
    with rt.enable_apply({name: _recorder(name, seen)}):
        for overrides, expected in cases:
            before = len(seen)
            given = {**kwargs, **overrides}
            call_args = given.pop("__args__", args)
            if isinstance(expected, dict):
                _resolve(path)(*call_args, **given)
                assert len(seen) == before + 1, (overrides, _counts(path))
                for key, value in expected.items():
                    assert _same(seen[-1][key], value), (overrides, key, seen[-1][key])
                continue
            if isinstance(expected, tuple):
                raised = pytest.raises(expected[1])
            else:
                raised = pytest.raises(FLASHINFER_ON_CPU, match=ON_CPU)
            with raised:
                _resolve(path)(*call_args, **given)
            assert len(seen) == before, overrides
    counts = _counts(path)
    refused = [e if isinstance(e, str) else e[0] for _, e in cases if not isinstance(e, dict)]
    assert counts["hit"] == len(cases) - len(refused)
    assert counts.get("rules", {}) == {r: refused.count(r) for r in refused}, counts
    return seen


def _resolve(path):
    obj = flashinfer
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def test_single_decode_routes_what_it_models_and_refuses_the_rest():
    q, k, v = _bf16(32, 128, seed=1), _bf16(6, 8, 128, seed=2), _bf16(6, 8, 128, seed=3)
    hnd = (q, k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    cases = [
        ({}, {"sm_scale": 1 / math.sqrt(128), "window_left": -1, "logits_soft_cap": 0.0}),
        ({"sm_scale": 0.05, "window_left": 127}, {"sm_scale": 0.05, "window_left": 127}),
        ({"logits_soft_cap": 50.0}, {"logits_soft_cap": 50.0}),
        ({"kv_layout": "HND", "__args__": hnd}, {"k": k, "v": v}),
        ({"use_tensor_cores": True, "rope_scale": 8.0, "rope_theta": 5e5}, {"k": k}),
        ({"return_lse": True}, "return_lse"),
        ({"pos_encoding_mode": "ROPE_LLAMA"}, "pos_encoding_mode"),
        ({"q_scale": 0.5}, "q_scale"),
        ({"k_scale": 0.5}, "k_scale"),
        ({"v_scale": 0.5}, "v_scale"),
        ({"__args__": (q.half(), k.half(), v.half())}, "tensor:q"),
    ]
    path = "flashinfer.decode.single_decode_with_kv_cache"
    _route(path, "single_decode_h32_kv8_d128", ((q, k, v), {}), cases)


def test_single_prefill_routes_what_it_models_and_refuses_the_rest():
    q, k, v = _bf16(3, 32, 128, seed=1), _bf16(7, 8, 128, seed=2), _bf16(7, 8, 128, seed=3)
    hnd = (q, k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    mask = torch.ones(3, 7, dtype=torch.bool)
    cases = [
        ({}, {"causal": False, "sm_scale": 1 / math.sqrt(128), "window_left": -1}),
        ({"causal": True, "window_left": 1023, "sm_scale": 168**-0.5}, {"causal": True}),
        ({"logits_soft_cap": 50.0, "window_left": 4095}, {"logits_soft_cap": 50.0}),
        ({"kv_layout": "HND", "__args__": hnd}, {"k": k, "v": v}),
        ({"backend": "fa3", "o_dtype": torch.bfloat16, "rope_theta": 5e5}, {"q": q}),
        ({"return_lse": True}, "return_lse"),
        ({"custom_mask": mask}, "custom_mask"),
        ({"packed_custom_mask": mask.flatten()}, "packed_custom_mask"),
        ({"use_fp16_qk_reduction": True}, "use_fp16_qk_reduction"),
        ({"pos_encoding_mode": "ALIBI"}, "pos_encoding_mode"),
        ({"o_dtype": torch.float16}, "o_dtype"),
        ({"scale_q": torch.ones(32)}, "scale_q"),
        ({"k_scale": 2.0}, "k_scale"),
        ({"kv_cache_sf": (torch.ones(1), torch.ones(1))}, "kv_cache_sf"),
    ]
    path = "flashinfer.prefill.single_prefill_with_kv_cache"
    _route(path, "single_prefill_h32_kv8_d128", ((q, k, v), {}), cases)


def test_merge_state_in_place_writes_into_v_and_s_and_honours_the_mask():
    v, s = _bf16(4, 32, 128, seed=1), torch.randn(4, 32)
    v2, s2 = _bf16(4, 32, 128, seed=2), torch.randn(4, 32)
    mask = torch.tensor([True, False, True, False])
    expected_v, expected_s = fi_cascade._merge_state_in_place_reference(v, s, v2, s2, mask)
    name = "merge_state_in_place_h32_d128"
    seen: list = []
    vv, ss = v.clone(), s.clone()
    with rt.enable_apply({name: _recorder(name, seen)}):
        assert flashinfer.cascade.merge_state_in_place(vv, ss, v2, s2, mask=mask) is None
        with pytest.raises(FLASHINFER_ON_CPU, match=ON_CPU):  # fp16 states are not the definition's
            flashinfer.cascade.merge_state_in_place(v.half(), s, v2.half(), s2)
    assert len(seen) == 1 and torch.equal(seen[0]["mask"], mask)
    _close(vv, expected_v)
    assert torch.allclose(ss, expected_s, atol=1e-5)
    assert torch.equal(vv[1], v[1])  # unmasked rows keep their values
    assert _counts("flashinfer.cascade.merge_state_in_place")["rules"] == {"tensor:v": 1}


def test_merge_states_routes_any_number_of_states():
    name = "merge_states_h32_d128"
    seen: list = []
    with rt.enable_apply({name: _recorder(name, seen)}):
        for states in (1, 2, 5):
            v, s = _bf16(3, states, 32, 128, seed=states), torch.randn(3, states, 32)
            out_v, out_s = flashinfer.cascade.merge_states(v, s)
            ref_v, ref_s = fi_cascade._merge_states_reference(v, s)
            _close(out_v, ref_v)
            assert torch.allclose(out_s, ref_s, atol=1e-5)
    assert len(seen) == 3


def _cudnn_call(window_left=-1, sinks=None, **overrides):
    g = torch.Generator().manual_seed(0)
    k = torch.randn(6, 8, 16, 64, generator=g).to(torch.bfloat16)
    v = torch.randn(6, 8, 16, 64, generator=g).to(torch.bfloat16)
    q = torch.randn(2, 64, 64, generator=g).to(torch.bfloat16)
    kwargs = {"max_sequence_kv": 32, "block_tables": torch.tensor([[3, 1], [0, 5]]).int()}
    kwargs |= {"actual_seq_lens_kv": torch.tensor([20, 9]).int().reshape(2, 1, 1, 1)}
    kwargs |= {"window_left": window_left, "sinks": sinks, **overrides}
    return (q, k, v, 0.125, torch.empty(8, dtype=torch.uint8)), kwargs


def test_cudnn_decode_routes_windows_sinks_and_lse_and_refuses_the_rest():
    args, kwargs = _cudnn_call()
    sinks = torch.randn(64)
    cases = [
        ({}, {"window_left": -1, "sinks": None, "scale": 0.125, "max_sequence_kv": 32}),
        ({"window_left": 127, "sinks": sinks}, {"window_left": 127, "sinks": sinks}),
        ({"return_lse": True, "is_cuda_graph_compatible": True}, {"actual_seq_lens_kv": None}),
        # FlashInfer's cubin path (no cudnn-frontend here) refuses more rows itself.
        ({"q_len_per_req": 2}, ("q_len_per_req", NotImplementedError)),
        # The tensor checks come before the rules: a missing table fails them first.
        ({"block_tables": None}, "unevaluable"),
        # FlashInfer's cubin path reads the lengths before it reaches a kernel.
        ({"actual_seq_lens_kv": None}, ("actual_seq_lens_kv", AttributeError)),
        ({"batch_offsets_q": torch.tensor([0, 4096]).int()}, "batch_offsets_q"),
        ({"batch_offsets_k": torch.tensor([0, 1]).int()}, "batch_offsets_k"),
    ]
    # Per-request KV lengths reach the solution flattened, whatever their shape here.
    cases[2] = (cases[2][0], {"actual_seq_lens_kv": torch.tensor([20, 9]).int()})
    path = "flashinfer.cudnn.decode.cudnn_batch_decode_with_kv_cache"
    _route(path, "cudnn_batch_decode_h64_kv8_d64_ps16", (args, kwargs), cases)


def test_cudnn_decode_returns_output_and_lse_as_flashinfer_does():
    args, kwargs = _cudnn_call(window_left=5, sinks=torch.randn(64))
    name = "cudnn_batch_decode_h64_kv8_d64_ps16"
    out, lse = torch.empty(2, 64, 64, dtype=torch.bfloat16), torch.empty(2, 64)
    with rt.enable_apply({name: _recorder(name, [])}):
        plain = flashinfer.cudnn.decode.cudnn_batch_decode_with_kv_cache(*args, **kwargs)
        pair = flashinfer.cudnn.decode.cudnn_batch_decode_with_kv_cache(
            *args, **kwargs, return_lse=True, out=out, lse=lse
        )
    assert isinstance(plain, torch.Tensor) and plain.shape == (2, 64, 64)
    assert pair[0] is out and pair[1] is lse
    assert torch.equal(out, plain) and torch.isfinite(lse).all()


# ---------------------------------------------------------------------------------------
# Routing of FlashInfer's wrappers, their plan and run standing in for the GPU's
# ---------------------------------------------------------------------------------------


def _recording_wrapper(monkeypatch, cls, stamp):
    """``cls`` with plan and run replaced by recorders under the real signatures; plan
    assigns the attribute FlashInfer's plan assigns (Note [plan state]). An instance needs
    no constructor: it is made with ``object.__new__`` and given ``_kv_layout``."""
    calls: list = []

    def plan(self, *args, **kwargs):
        calls.append("plan")
        if stamp == "_pos_encoding_mode":
            self._pos_encoding_mode = kwargs.get("pos_encoding_mode", "NONE")
        elif stamp is not None:
            setattr(self, stamp, object())

    def run(self, *args, **kwargs):
        calls.append("run")
        return "flashinfer"

    for attr, body in (("plan", plan), ("run", run)):
        real = getattr(cls, attr)
        monkeypatch.setattr(cls, attr, functools.wraps(real)(body))
    if "begin_forward" in vars(cls):
        monkeypatch.setattr(cls, "begin_forward", cls.plan)
    return calls


def _route_wrapper(monkeypatch, cls, stamp, name, build, cases, layout="NHD"):
    """Each case: (plan overrides, run overrides, expected), as for ``_route``; the call
    comes from ``build`` (an every-parameter call of ``_routable_attention``)."""
    calls = _recording_wrapper(monkeypatch, cls, stamp)
    call = build(_catalogue())
    plan_args, plan_kwargs = call.plan
    seen: list = []
    path = f"{cls.__module__}.{cls.__qualname__}.run".replace("attention._core", "attention")
    with rt.enable_apply({name: _recorder(name, seen)}):
        for plan_over, run_over, expected in cases:
            wrapper = object.__new__(cls)
            wrapper._kv_layout = layout
            p_args = plan_over.pop("__args__", plan_args)
            r_args = run_over.pop("__args__", call.args)
            wrapper.plan(*p_args, **{**plan_kwargs, **plan_over})
            before = len(seen)
            result = wrapper.run(*r_args, **{**call.kwargs, **run_over})
            if isinstance(expected, str):
                assert result == "flashinfer" and len(seen) == before, (plan_over, run_over)
            else:
                assert len(seen) == before + 1, (plan_over, run_over, _counts(path))
                for key, value in expected.items():
                    assert _same(seen[-1][key], value), (key, seen[-1][key], value)
    counts = _counts(path)
    refused = [e for *_, e in cases if isinstance(e, str)]
    assert counts["hit"] == len(cases) - len(refused)
    assert counts.get("rules", {}) == {r: refused.count(r) for r in refused}, counts
    assert calls.count("run") == len(refused)
    return seen


def test_batch_attention_routes_causal_scale_and_cap_and_refuses_the_rest(monkeypatch):
    from flashinfer.attention import BatchAttention

    call = _routable_attention_call("flashinfer.attention.BatchAttention.run")
    last = call.plan[0][2]  # kv_indices; the last page lengths come from kv_len_arr
    cases = [
        ({}, {}, {"causal": True, "sm_scale": 0.1, "logits_soft_cap": 30.0}),
        (
            {"causal": False, "sm_scale": None, "logits_soft_cap": None},
            {"logits_soft_cap": 0.0},
            {"causal": False, "sm_scale": 1 / math.sqrt(128), "logits_soft_cap": 0.0},
        ),
        ({}, {"out": None, "lse": None, "profiler_buffer": None}, {"kv_indices": last}),
        (
            {"logits_soft_cap": None},
            {},
            "logits_soft_cap,plan.logits_soft_cap",
        ),  # run caps, plan not
        ({"use_profiler": True}, {}, "plan.use_profiler"),
        ({"q_data_type": torch.float16}, {}, "plan.q_data_type"),
        ({}, {"k_scale": torch.ones(1)}, "k_scale"),
        ({}, {"v_scale": torch.ones(1)}, "v_scale"),
        ({}, {"kv_cache_sf": torch.ones(1)}, "kv_cache_sf"),
    ]
    name = "batch_attention_run_h32_kv8_d128_ps16"
    seen = _route_wrapper(monkeypatch, BatchAttention, "_plan_info", name, _build(call), cases)
    # kv_len_arr in, each request's last page length out.
    x, _ = _catalogue().inputs(name, len_indptr=3, total_q=5, num_pages=32)
    assert torch.equal(seen[0]["kv_last_page_len"], x["kv_last_page_len"])


def test_batch_attention_reads_an_hnd_cache_as_nhd(monkeypatch):
    from flashinfer.attention import BatchAttention

    call = _routable_attention_call("flashinfer.attention.BatchAttention.run")
    q, (k, v) = call.args
    hnd = (q, (k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()))
    cases = [({}, {"__args__": hnd}, {"k_cache": k, "v_cache": v})]
    _route_wrapper(
        monkeypatch, BatchAttention, "_plan_info", "batch_attention_run_h32_kv8_d128_ps16",
        _build(call), cases, layout="HND",
    )  # fmt: skip


def test_pod_routes_both_sides_and_refuses_what_it_does_not_model(monkeypatch):
    call = _routable_attention_call("flashinfer.pod.PODWithPagedKVCacheWrapper.run")
    q_p, k_p, v_p = call.args[:3]
    hnd = (q_p, k_p.transpose(0, 1).contiguous(), v_p.transpose(0, 1).contiguous(), *call.args[3:])
    cases = [
        ({}, {}, {"causal_p": True, "sm_scale_p": 0.2, "window_left_p": 3, "window_left_d": 7}),
        (
            {"window_left": -1, "sm_scale": None},
            {"causal_p": False, "sm_scale_p": None, "window_left_p": -1},
            {"causal_p": False, "sm_scale_p": 1 / math.sqrt(128), "sm_scale_d": 1 / math.sqrt(128)},
        ),
        ({}, {"kv_layout_p": "HND", "__args__": hnd}, {"k_p": k_p, "v_p": v_p}),
        ({}, {"custom_mask_p": torch.ones(2, 5, dtype=torch.bool)}, "custom_mask_p"),
        ({}, {"pos_encoding_mode_p": "ROPE_LLAMA"}, "pos_encoding_mode_p"),
        ({}, {"use_fp16_qk_reduction": True}, "use_fp16_qk_reduction"),
        ({}, {"q_scale": 0.5}, "q_scale"),
        ({}, {"v_scale": 0.5}, "v_scale"),
        ({"pos_encoding_mode": "ALIBI"}, {}, "plan.pos_encoding_mode"),
        ({"q_data_type": torch.float16}, {}, "plan.q_data_type"),
    ]
    _route_wrapper(
        monkeypatch, flashinfer.pod.PODWithPagedKVCacheWrapper, "_pos_encoding_mode",
        "pod_run_h32_kv8_d128_ps16", _build(call), cases,
    )  # fmt: skip


def test_batch_pod_routes_both_sides_and_refuses_what_it_does_not_model(monkeypatch):
    call = _routable_attention_call("flashinfer.pod.BatchPODWithPagedKVCacheWrapper.run")
    cases = [
        ({}, {}, {"causal_p": True, "sm_scale": 0.1, "window_left": 7}),
        ({"window_left": -1, "sm_scale": None}, {"causal_p": False}, {"window_left": -1}),
        ({}, {"return_lse": True}, "return_lse"),
        ({}, {"packed_custom_mask_p": torch.ones(4, dtype=torch.uint8)}, "packed_custom_mask_p"),
        ({}, {"k_scale": 0.5}, "k_scale"),
        ({}, {"use_fp16_qk_reduction": True}, "use_fp16_qk_reduction"),
        ({"kv_data_type": torch.float8_e4m3fn}, {}, "plan.kv_data_type"),
    ]
    _route_wrapper(
        monkeypatch, flashinfer.pod.BatchPODWithPagedKVCacheWrapper, "_pos_encoding_mode",
        "batch_pod_run_h32_kv8_d128_ps16", _build(call), cases,
    )  # fmt: skip


def test_cascade_routes_two_levels_and_refuses_three(monkeypatch):
    call = _routable_attention_call("flashinfer.cascade.MultiLevelCascadeAttentionWrapper.run")
    lists = call.plan[0]
    three = tuple([*lst, lst[-1]] for lst in lists[:4]) + lists[4:]
    cases = [
        ({}, {}, {"causal": True, "sm_scale": 0.1, "logits_soft_cap": 30.0}),
        (
            {"causal": False, "sm_scale": None, "logits_soft_cap": None},
            {},
            {"causal": False, "sm_scale": 1 / math.sqrt(128), "logits_soft_cap": 0.0},
        ),
        ({}, {}, {"shared_kv_indices": lists[2][0], "unique_kv_indices": lists[2][1]}),
        ({"__args__": three}, {}, "plan.qo_indptr_arr"),
        ({"window_left": 127}, {}, "plan.window_left"),
        ({"use_fp16_qk_reduction": True}, {}, "plan.use_fp16_qk_reduction"),
        ({"q_data_type": "float16"}, {}, "plan.q_data_type"),
    ]
    _route_wrapper(
        monkeypatch, flashinfer.cascade.MultiLevelCascadeAttentionWrapper, None,
        "multi_level_cascade_run_h32_kv8_d128_ps16", _build(call), cases,
    )  # fmt: skip


def _routable_attention_call(path):
    return routable.ROUTABLE[path](_catalogue())


def _build(call):
    return lambda catalogue: call


# ---------------------------------------------------------------------------------------
# MLA page append
# ---------------------------------------------------------------------------------------


def _mla_append_call(seed=0):
    x, _ = _catalogue().inputs(
        "append_paged_mla_kv_cache_ckv512_kpe64", seed=seed, nnz_kv=5, batch_size=2,
        num_pages=6, page_size=4, num_kv_indices=4,
    )  # fmt: skip
    return x


def test_mla_append_reference_is_flashinfers_template_and_writes_only_the_named_slots():
    x = _mla_append_call()
    # Two tokens of request 1 in its second page, and one written twice: the later wins.
    x["batch_indices"] = torch.tensor([0, 1, 1, 1, 0], dtype=torch.int32)
    x["positions"] = torch.tensor([2, 5, 6, 5, 0], dtype=torch.int32)
    x["kv_indices"] = torch.tensor([4, 0, 3, 5], dtype=torch.int32)
    x["kv_indptr"] = torch.tensor([0, 1, 4], dtype=torch.int32)
    ckv, kpe = _reference("append_paged_mla_kv_cache_ckv512_kpe64")(**x)
    theirs_ckv, theirs_kpe = fi_page._append_paged_mla_kv_cache_reference(
        **{**x, "ckv_cache": x["ckv_cache"].clone(), "kpe_cache": x["kpe_cache"].clone()}
    )
    assert torch.equal(ckv, theirs_ckv) and torch.equal(kpe, theirs_kpe)
    # Independently: request 1's position 5 is slot 1 of its second page (page 3).
    assert torch.equal(ckv[3, 1], x["append_ckv"][3]) and torch.equal(kpe[3, 1], x["append_kpe"][3])
    assert torch.equal(ckv[3, 2], x["append_ckv"][2]) and torch.equal(ckv[4, 2], x["append_ckv"][0])
    assert torch.equal(ckv[4, 0], x["append_ckv"][4])
    written = {(3, 1), (3, 2), (4, 2), (4, 0)}
    for page in range(6):
        for slot in range(4):
            if (page, slot) not in written:
                assert torch.equal(ckv[page, slot], x["ckv_cache"][page, slot])
                assert torch.equal(kpe[page, slot], x["kpe_cache"][page, slot])


def test_mla_append_routes_in_place_and_refuses_a_missing_cache_or_another_dtype():
    x = _mla_append_call(seed=1)
    expected = _reference("append_paged_mla_kv_cache_ckv512_kpe64")(**x)
    order = ["append_ckv", "append_kpe", "batch_indices", "positions", "ckv_cache", "kpe_cache"]
    order += ["kv_indices", "kv_indptr", "kv_last_page_len"]
    args = tuple(x[k] for k in order)
    half = (x["append_ckv"].half(), x["append_kpe"].half(), *args[2:4])
    half += (x["ckv_cache"].half(), x["kpe_cache"].half(), *args[6:])
    cases = [
        ({}, {"ckv_cache": x["ckv_cache"], "kv_last_page_len": x["kv_last_page_len"]}),
        ({"__args__": (*args[:4], None, *args[5:])}, "unevaluable"),
        ({"__args__": half}, "tensor:append_ckv"),
    ]
    path = "flashinfer.page.append_paged_mla_kv_cache"
    _route(path, "append_paged_mla_kv_cache_ckv512_kpe64", (args, {}), cases)
    # The routed call wrote the caches in place, as FlashInfer's kernel does.
    assert torch.equal(x["ckv_cache"], expected[0]) and torch.equal(x["kpe_cache"], expected[1])


# ---------------------------------------------------------------------------------------
# NVFP4 page appends
# ---------------------------------------------------------------------------------------

_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _e2m1_codes(x):
    """Independently: the nearest E2M1 magnitude to each x, ties to the even code, with x's
    sign bit; what FlashInfer's threshold chain computes."""
    dist = (x.abs().unsqueeze(-1) - _E2M1).abs()
    nearest = dist == dist.min(dim=-1, keepdim=True).values
    even = torch.arange(8) % 2 == 0
    code = torch.where(
        (nearest & even).any(-1), (nearest & even).int().argmax(-1), nearest.int().argmax(-1)
    )
    return code | torch.signbit(x).int() << 3


def _unpack(packed):
    b = packed.view(torch.uint8).int()
    return torch.stack((b & 15, b >> 4), dim=-1).flatten(-2)


def _nvfp4_rows(append_key, scale, sf):
    """The codes FlashInfer's kernel writes for rows of 16-blocks with scales sf: it
    multiplies by the reciprocal of sf * scale (a value that divides to a tie may not)."""
    blocks = append_key.float().reshape(*append_key.shape[:-1], -1, 16)
    scaled = blocks * (1.0 / (sf.float() * scale)).unsqueeze(-1)
    return _e2m1_codes(scaled).flatten(-2).int()


def test_nvfp4_append_rounds_the_kernels_ties_and_writes_only_the_named_slots():
    name = "nvfp4_quantize_append_paged_kv_cache_kv8_d64_ps16"
    x, _ = _catalogue().inputs(name, nnz=3, batch_size=2, num_pages=5, num_kv_indices=4)
    x["batch_indices"] = torch.tensor([0, 1, 1], dtype=torch.int32)
    x["positions"] = torch.tensor([3, 17, 2], dtype=torch.int32)
    x["kv_indices"] = torch.tensor([4, 0, 2, 1], dtype=torch.int32)
    x["kv_indptr"] = torch.tensor([0, 1, 4], dtype=torch.int32)
    x["k_scale"], x["v_scale"] = 1.0, 0.5
    # Token 0, head 0, block 0: amax 6 gives the scale 1 exactly, then every rounding tie.
    ties = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0, -0.25, -0.3, 0.0, -6.0, 4.9, 0.7]
    x["append_key"][0, 0, :16] = torch.tensor([*ties, 1.0]).to(torch.bfloat16)
    x["append_key"][0, 0, 16:32] = 0.0  # an all-zero block: scale 0, codes 0
    k, v, ks, vs = _reference(name)(**x)
    codes = _unpack(k[4, 3, 0])
    expected = [7, 0, 2, 2, 4, 4, 6, 6, 8, 8, 9, 0, 15, 6, 1, 2]
    assert codes[:16].tolist() == expected
    assert codes[16:32].tolist() == [0] * 16 and ks[4, 3, 0, 1].float().item() == 0.0
    assert ks[4, 3, 0, 0].float().item() == 1.0
    # Every block: sf = e4m3(amax / (6 * scale)), values the nearest codes of x / (sf * scale).
    for i, (page, slot) in enumerate(((4, 3), (2, 1), (0, 2))):
        for cache, scales, rows, scale in (
            (k, ks, x["append_key"], 1.0),
            (v, vs, x["append_value"], 0.5),
        ):
            amax = rows[i].float().reshape(8, -1, 16).abs().amax(-1)
            sf = (amax / (6 * scale)).to(torch.float8_e4m3fn)
            assert torch.equal(scales[page, slot].view(torch.uint8), sf.view(torch.uint8))
            ok = sf.float() > 0
            want = torch.where(ok.repeat_interleave(16, -1), _nvfp4_rows(rows[i], scale, sf), 0)
            assert torch.equal(_unpack(cache[page, slot]), want)
    written = {(4, 3), (2, 1), (0, 2)}
    for page in range(5):
        for slot in range(16):
            if (page, slot) not in written:
                assert torch.equal(
                    k[page, slot].view(torch.uint8), x["k_cache"][page, slot].view(torch.uint8)
                )
                assert torch.equal(
                    vs[page, slot].view(torch.uint8),
                    x["v_scale_cache"][page, slot].view(torch.uint8),
                )


def _bytes_of(t):
    return t.view(torch.uint8)


def test_nvfp4_append_routes_either_layout_in_place_and_refuses_what_flashinfer_does():
    name = "nvfp4_quantize_append_paged_kv_cache_kv8_d64_ps16"
    x, _ = _catalogue().inputs(name, seed=2, nnz=3, batch_size=2, num_pages=4, num_kv_indices=3)
    expected = [_bytes_of(t) for t in _reference(name)(**x)]
    meta = (x["kv_indices"], x["kv_indptr"], x["kv_last_page_len"])
    head = (x["append_key"], x["append_value"], x["batch_indices"], x["positions"])
    k, v = _bytes_of(x["k_cache"]).clone(), _bytes_of(x["v_cache"]).clone()
    ks, vs = x["k_scale_cache"].clone(), x["v_scale_cache"].clone()
    # HND, stacked: [pages, 2, heads, page_size, dim].
    stacked = torch.stack((k, v), 1).transpose(2, 3).contiguous()
    stacked_sf = torch.stack((ks, vs), 1).transpose(2, 3).contiguous()
    args = (*head, (k, v), (ks, vs), *meta, x["k_scale"], x["v_scale"])
    hnd = (*head, stacked, stacked_sf, *meta, x["k_scale"], x["v_scale"])
    half = (x["append_key"].half(), x["append_value"].half(), *args[2:])
    cases = [
        ({}, {"k_scale": x["k_scale"], "kv_last_page_len": x["kv_last_page_len"]}),
        ({"__args__": hnd, "kv_layout": "HND"}, {"v_scale": x["v_scale"]}),
        ({"__args__": half}, "tensor:append_key"),
        ({"__args__": (*args[:9], 0.0, 1.0)}, ("k_scale", ValueError)),
        ({"__args__": (*args[:9], 1.0, math.nan)}, ("v_scale", ValueError)),
        ({"kv_layout": "XYZ"}, ("paged_kv_cache", KeyError)),
    ]
    path = "flashinfer.page.nvfp4_quantize_append_paged_kv_cache"
    _route(path, name, (args, {"kv_layout": "NHD"}), cases)
    # Both routed calls wrote their caches in place, as FlashInfer's kernel does.
    assert all(torch.equal(a, b) for a, b in zip((k, v, _bytes_of(ks), _bytes_of(vs)), expected))
    nhd = stacked.transpose(2, 3)
    assert torch.equal(nhd[:, 0], expected[0]) and torch.equal(nhd[:, 1], expected[1])
    assert torch.equal(_bytes_of(stacked_sf.transpose(2, 3)[:, 1]), expected[3])


def test_nvfp4_append_by_slot_skips_negative_slots_and_padding_rows():
    name = "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping_kv8_d64_ps16"
    x, _ = _catalogue().inputs(name, seed=3, nnz=4, num_pages=2)
    x["slot_mapping"] = torch.tensor([17, -1, 0, 32], dtype=torch.int32)  # 32: past the cache
    k, v, ks, vs = _reference(name)(**x)
    run = _reference("nvfp4_quantize_append_paged_kv_cache_kv8_d64_ps16")
    # The same rows appended by (sequence, position) over pages [1, 0] land alike.
    by_pos = {**{n: x[n] for n in ("append_key", "append_value", "k_cache", "v_cache")}}
    by_pos |= {"k_scale_cache": x["k_scale_cache"], "v_scale_cache": x["v_scale_cache"]}
    by_pos |= {"k_scale": x["k_scale"].item(), "v_scale": x["v_scale"].item()}
    by_pos["append_key"] = x["append_key"][[0, 2]]
    by_pos["append_value"] = x["append_value"][[0, 2]]
    by_pos |= {"batch_indices": torch.tensor([0, 1], dtype=torch.int32)}
    by_pos |= {"positions": torch.tensor([1, 0], dtype=torch.int32)}
    by_pos |= {"kv_indices": torch.tensor([1, 0], dtype=torch.int32)}
    by_pos |= {"kv_indptr": torch.tensor([0, 1, 2], dtype=torch.int32)}
    by_pos["kv_last_page_len"] = torch.tensor([2, 1], dtype=torch.int32)
    theirs = run(**by_pos)
    for ours, other in zip((k, v, ks, vs), theirs):
        assert torch.equal(_bytes_of(ours), _bytes_of(other))
    # Routed: rows past the slots are padding the solution does not see, and a float scale
    # becomes the one-element tensor FlashInfer makes of it.
    pad = _bf16(1, 8, 64, seed=9)
    args = (torch.cat((x["append_key"], pad)), torch.cat((x["append_value"], pad)))
    args += (x["slot_mapping"],)
    caches = (_bytes_of(x["k_cache"]).clone(), _bytes_of(x["v_cache"]).clone())
    sfs = (x["k_scale_cache"].clone(), x["v_scale_cache"].clone())
    args += (caches, sfs, x["k_scale"], x["v_scale"].item())
    wide = (*args[:5], x["k_scale"].double(), x["v_scale"])
    cases = [
        ({}, {"k_scale": x["k_scale"], "v_scale": x["v_scale"], "append_key": x["append_key"]}),
        ({"__args__": (*args[:2], x["slot_mapping"].long(), *args[3:])}, "tensor:slot_mapping"),
        ({"__args__": (args[0][:3], *args[1:])}, ("tensor:append_value", ValueError)),
        ({"__args__": wide}, ("tensor:k_scale", ValueError)),
        ({"__args__": (*args[:5], -x["k_scale"], 1.0)}, ("k_scale", ValueError)),
    ]
    path = "flashinfer.page.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping"
    _route(path, name, (args, {}), cases)
    assert torch.equal(caches[0], _bytes_of(k)) and torch.equal(_bytes_of(sfs[1]), _bytes_of(vs))


def test_nvfp4_mla_append_takes_exact_reciprocals_and_keeps_the_rope_part_in_fp8():
    name = "nvfp4_quantize_append_paged_mla_kv_cache_ckv512_kpe64"
    x, _ = _catalogue().inputs(
        name, seed=4, nnz_kv=3, batch_size=2, num_pages=6, page_size=4, num_kv_indices=4
    )  # fmt: skip
    x["batch_indices"] = torch.tensor([0, 1, 1], dtype=torch.int32)
    x["positions"] = torch.tensor([2, 5, 5], dtype=torch.int32)  # the last one wins
    x["kv_indices"] = torch.tensor([4, 0, 3, 5], dtype=torch.int32)
    x["kv_indptr"] = torch.tensor([0, 1, 4], dtype=torch.int32)
    x["ckv_scale"], x["kpe_scale"] = 0.75, 0.1
    x["append_kpe"][2, :2] = torch.tensor([1e4, -1e4]).to(torch.bfloat16)  # saturates
    ckv, sf, kpe = _reference(name)(**x)
    for i, (page, slot) in ((0, (4, 2)), (2, (3, 1))):
        rows = x["append_ckv"][i].float().reshape(-1, 16)
        inv6 = torch.tensor(1.0) / (6 * torch.tensor(0.75))
        want_sf = (rows.abs().amax(-1) * inv6).to(torch.float8_e4m3fn)
        assert torch.equal(_bytes_of(sf[page, slot]), _bytes_of(want_sf))
        assert torch.equal(_unpack(ckv[page, slot]), _nvfp4_rows(x["append_ckv"][i], 0.75, want_sf))
        rope = (x["append_kpe"][i].float() * (1 / torch.tensor(0.1))).clamp(-448, 448)
        assert torch.equal(_bytes_of(kpe[page, slot]), _bytes_of(rope.to(torch.float8_e4m3fn)))
    assert kpe[3, 1, :2].float().tolist() == [448.0, -448.0]
    # Dequantized, the cache holds the rows to within NVFP4's step.
    grid = _E2M1[_unpack(ckv[4, 2]) & 7] * torch.where(_unpack(ckv[4, 2]) >= 8, -1.0, 1.0)
    back = grid.reshape(-1, 16) * sf[4, 2].float().unsqueeze(-1) * 0.75
    rows = x["append_ckv"][0].float().reshape(-1, 16)
    assert ((back - rows).abs() <= rows.abs().amax(-1, keepdim=True) / 6 * 1.01).all()
    untouched = [(p, s) for p in range(6) for s in range(4) if (p, s) not in ((4, 2), (3, 1))]
    assert all(
        torch.equal(_bytes_of(ckv[p, s]), _bytes_of(x["ckv_cache"][p, s])) for p, s in untouched
    )
    # Routed in place; a scale out of float32's normal range is FlashInfer's to refuse.
    order = ["append_ckv", "append_kpe", "batch_indices", "positions", "ckv_cache"]
    order += ["ckv_sf_cache", "kpe_cache", "kv_indices", "kv_indptr", "kv_last_page_len"]
    args = [x[k].clone() for k in order]
    args[4] = _bytes_of(args[4])
    args = (*args, 0.75, 0.1)
    cases = [
        ({}, {"ckv_scale": 0.75, "kpe_scale": 0.1}),
        ({"__args__": (*args[:10], 1e-40, 0.1)}, ("ckv_scale", ValueError)),
        ({"__args__": (*args[:10], 0.75, -1.0)}, ("kpe_scale", ValueError)),
        (
            {"__args__": (*args[:6], args[6].view(torch.uint8), *args[7:])},
            ("tensor:kpe_cache", ValueError),
        ),
    ]
    path = "flashinfer.page.nvfp4_quantize_append_paged_mla_kv_cache"
    _route(path, name, (args, {}), cases)
    assert torch.equal(args[4], _bytes_of(ckv)) and torch.equal(_bytes_of(args[5]), _bytes_of(sf))
    assert torch.equal(_bytes_of(args[6]), _bytes_of(kpe))


def test_v41_fp4_pack_lays_out_data_rows_then_scale_rows_and_poisons_non_finite_groups():
    name = "dsv41_fp4_quantize_pack_sparse_mla_cache_ps64"
    x, _ = _catalogue().inputs(name, num_pages=2)
    latent = x["latent_kv"]
    # Page 1, slot 3: group 0 has amax 6 (scale 1) and every rounding tie; group 1 an
    # infinity, group 2 a NaN; group 3 is tiny (its scale clamps at 2^-9).
    ties = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0, -0.25, -0.3, 0.0, -6.0, 5.5, 0.7, 1.0]
    latent[1, 3, :16] = torch.tensor(ties).to(torch.bfloat16)
    latent[1, 3, 20], latent[1, 3, 40] = math.inf, math.nan
    latent[1, 3, 48:64] = 1e-4
    out = _reference(name)(latent_kv=latent).view(torch.uint8)
    page = out[1].reshape(-1)
    data, scales = page[: 64 * 256].reshape(64, 256), page[64 * 256 :].reshape(64, 32)
    # Ties go to the even code.
    assert _unpack(data[3, :8]).tolist() == [7, 0, 2, 2, 4, 4, 6, 6, 8, 8, 9, 0, 15, 7, 1, 2]
    assert scales[3, 0].item() == 0x38  # E4M3 1.0
    assert scales[3, 1].item() == scales[3, 2].item() == 0x7F and data[3, 8:24].eq(0).all()
    assert scales[3, 3].item() == 0x01  # 2^-9, the smallest E4M3 subnormal
    # Every group: scale e4m3(amax / 6), codes the nearest of x / scale.
    rows = latent[0].float().reshape(64, 32, 16)
    want = (rows.abs().amax(-1) / 6).clamp(2**-9, 448).to(torch.float8_e4m3fn)
    assert torch.equal(out[0].reshape(-1)[64 * 256 :].reshape(64, 32), want.view(torch.uint8))
    codes = _e2m1_codes(rows / want.float().unsqueeze(-1)).reshape(64, 512).int()
    assert torch.equal(_unpack(out[0].reshape(-1)[: 64 * 256].reshape(64, 256)), codes)


def test_v41_fp4_pack_routes_every_input_layout_and_returns_flashinfers_shape():
    import flashinfer.mla._sparse_mla_sm120._api as sm120

    name = "dsv41_fp4_quantize_pack_sparse_mla_cache_ps64"
    x, _ = _catalogue().inputs(name, seed=5, num_pages=2)
    latent = x["latent_kv"]
    expected = _reference(name)(latent_kv=latent).view(torch.uint8).reshape(2, 64, 288)
    path = "flashinfer.mla._sparse_mla_sm120._api.dsv41_fp4_quantize_pack_sparse_mla_cache"
    with rt.enable_apply({name: _reference(name)}):
        for given, layout, shape in (
            (latent, "HND", (2, 1, 64, 288)),
            (latent.unsqueeze(1), "NHD", (2, 64, 1, 288)),
            (latent.unsqueeze(2), "HND", (2, 1, 64, 288)),
        ):
            cache = sm120.dsv41_fp4_quantize_pack_sparse_mla_cache(given, kv_layout=layout)
            assert cache.dtype == torch.uint8 and tuple(cache.shape) == shape
            assert torch.equal(cache.reshape(2, 64, 288), expected)
        # FlashInfer refuses these before its kernel, with its own message.
        for given, layout, rule in (
            (latent, "XYZ", "kv_layout"),
            (latent[0], "HND", "tensor:latent_kv"),
            (torch.cat((latent, latent), -1)[..., :512], "HND", "latent_kv"),  # strided
        ):
            before = _counts(path).get("rules", {}).get(rule, 0)
            with pytest.raises((ValueError, RuntimeError)):
                sm120.dsv41_fp4_quantize_pack_sparse_mla_cache(given, kv_layout=layout)
            assert _counts(path)["rules"][rule] == before + 1, (rule, _counts(path))
    counts = _counts(path)
    assert counts["hit"] == 3, counts
    assert counts["rules"] == {"kv_layout": 1, "tensor:latent_kv": 1, "latent_kv": 1}, counts


def test_v41_fp4_append_writes_the_first_row_of_each_slot_in_place_of_a_strided_cache():
    import flashinfer.mla._sparse_mla_sm120._api as sm120

    name = "dsv41_fp4_quantize_append_sparse_mla_cache_ps64"
    x, _ = _catalogue().inputs(name, seed=6, num_tokens=5, num_pages=2)
    # Slot 70 twice (the first row wins), a negative slot and one past the cache.
    x["slot_mapping"] = torch.tensor([70, 3, -1, 70, 128], dtype=torch.int32)
    out = _reference(name)(**x).view(torch.uint8)
    # Independently: the rows packed as whole pages, then the two written slots copied over.
    pack = _reference("dsv41_fp4_quantize_pack_sparse_mla_cache_ps64")
    rows = torch.zeros(2, 64, 512, dtype=torch.bfloat16)
    rows[1, 6], rows[0, 3] = x["latent_kv"][0], x["latent_kv"][1]
    packed = pack(latent_kv=rows).view(torch.uint8).reshape(2, -1)
    want = x["cache"].view(torch.uint8).reshape(2, -1).clone()
    for page, entry in ((1, 6), (0, 3)):
        for lo, n in ((entry * 256, 256), (64 * 256 + entry * 32, 32)):
            want[page, lo : lo + n] = packed[page, lo : lo + n]
    assert torch.equal(out.reshape(2, -1), want)
    # Routed into a page-strided 2-D view of a larger allocation, and into the NHD form.
    path = "flashinfer.mla._sparse_mla_sm120._api.dsv41_fp4_quantize_append_sparse_mla_cache"
    block = torch.zeros(2, 64 * 288 + 512, dtype=torch.uint8)
    block[:, : 64 * 288] = x["cache"].view(torch.uint8).reshape(2, -1)
    flat = block[:, : 64 * 288]
    nhd = x["cache"].view(torch.uint8).clone().unsqueeze(2)
    with rt.enable_apply({name: _reference(name)}):
        sm120.dsv41_fp4_quantize_append_sparse_mla_cache(x["latent_kv"], x["slot_mapping"], flat)
        sm120.dsv41_fp4_quantize_append_sparse_mla_cache(x["latent_kv"], x["slot_mapping"], nhd)
        # FlashInfer refuses these before its kernel, with its own message.
        for latent, slots, cache in (
            (x["latent_kv"], x["slot_mapping"], nhd.view(torch.int8)),
            (x["latent_kv"], x["slot_mapping"].long(), nhd),
        ):
            with pytest.raises((ValueError, RuntimeError)):
                sm120.dsv41_fp4_quantize_append_sparse_mla_cache(latent, slots, cache)
    assert torch.equal(flat.reshape(2, -1), want) and block[:, 64 * 288 :].eq(0).all()
    assert torch.equal(nhd.reshape(2, -1), want)
    counts = _counts(path)
    assert counts["hit"] == 2, counts
    # The int8 cache, left flat, gives no page size: no key, FlashInfer's call.
    assert counts["rules"] == {"key": 1, "tensor:slot_mapping": 1}, counts


def test_v41_fp8_pack_and_append_use_power_of_two_group_scales_and_flashinfers_layout():
    import flashinfer.mla._sparse_mla_sm120._api as sm120

    pack = _reference("dsv41_fp8_quantize_pack_sparse_mla_cache_ps64")
    x, _ = _catalogue().inputs("dsv41_fp8_quantize_pack_sparse_mla_cache_ps64", num_pages=1)
    latent = x["latent_kv"]
    latent[0, 5, 32:64] = 0.0  # amax floored at 1e-4: the smallest scale, 2^-13
    latent[0, 5, 64:67] = torch.tensor([math.inf, -1.0, 2.0])  # an infinite group
    latent[0, 5, 100] = math.nan  # a NaN group
    latent[0, 5, 128:160] = 448.0 * 4  # amax / 448 = 4 exactly: scale 2^2, values 448
    out = pack(latent_kv=latent).view(torch.uint8).reshape(-1)
    data, scales = out[: 64 * 512].reshape(64, 512), out[64 * 512 :].reshape(64, 16)
    assert scales[5, 1:5].tolist() == [127 - 13, 0xFF, 0xFF, 127 + 2]
    assert data[5, 64:67].tolist() == [0x7F, 0x80, 0x00] and data[5, 96:128].eq(0x7F).all()
    assert data[5, 128:160].eq(0x7E).all()  # E4M3 448
    # Independently, on the other rows: scale 2^ceil(log2(max(amax / 448, 1e-4))).
    rows = latent[0, :5].double().reshape(5, 16, 32)
    k = torch.ceil(torch.log2((rows.abs().amax(-1) / 448).clamp(min=1e-4))).int()
    assert torch.equal(scales[:5].int(), k + 127)
    want = (rows / torch.pow(2.0, k).unsqueeze(-1).double()).float().to(torch.float8_e4m3fn)
    assert torch.equal(data[:5], want.view(torch.uint8).reshape(5, 512))
    # The append writes those bytes for the first row of each valid slot, in place.
    name = "dsv41_fp8_quantize_append_sparse_mla_cache_ps64"
    a, _ = _catalogue().inputs(name, seed=7, num_tokens=4, num_pages=1)
    a["latent_kv"] = latent[0, [5, 2, 9, 2]].contiguous()
    a["slot_mapping"] = torch.tensor([5, 2, -3, 2], dtype=torch.int32)
    before = a["cache"].view(torch.uint8).reshape(-1).clone()
    cache = a["cache"].view(torch.uint8).unsqueeze(1)  # HND
    packer = "dsv41_fp8_quantize_pack_sparse_mla_cache_ps64"
    with rt.enable_apply({name: _reference(name), packer: pack}):
        sm120.dsv41_fp8_quantize_append_sparse_mla_cache(
            a["latent_kv"], a["slot_mapping"], cache
        )  # fmt: skip
        packed = sm120.dsv41_fp8_quantize_pack_sparse_mla_cache(latent, kv_layout="NHD")
    assert tuple(packed.shape) == (1, 64, 1, 528) and torch.equal(packed.reshape(-1), out)
    after = cache.reshape(-1)
    for slot in (5, 2):
        for lo, n in ((slot * 512, 512), (64 * 512 + slot * 16, 16)):
            assert torch.equal(after[lo : lo + n], out[lo : lo + n])
    untouched = torch.ones(64 * 528, dtype=torch.bool)
    for slot in (5, 2):
        untouched[slot * 512 : slot * 512 + 512] = False
        untouched[64 * 512 + slot * 16 : 64 * 512 + slot * 16 + 16] = False
    assert torch.equal(after[untouched], before[untouched])
    path = "flashinfer.mla._sparse_mla_sm120._api.dsv41_fp8_quantize_append_sparse_mla_cache"
    assert _counts(path)["hit"] == 1


# ---------------------------------------------------------------------------------------
# Block-sparse attention
# ---------------------------------------------------------------------------------------


def _bsr_dense(q, k, v, indptr, indices, R, C, sm_scale, cap):
    """FlashInfer's docstring example: the BSR matrix expanded to each row's key list, then
    dense attention over those keys, one row and head at a time."""
    m, h, _ = q.shape
    group = h // k.shape[1]
    out, lse = torch.zeros(m, h, v.shape[-1]), torch.full((m, h), -math.inf)
    for i in range(m):
        r = i // R
        blocks = indices[int(indptr[r]) : int(indptr[r + 1])].tolist()
        keys = sorted(j for b in blocks for j in range(b * C, (b + 1) * C))
        if not keys:
            continue
        for head in range(h):
            x = (k[keys, head // group].float() @ q[i, head].float()) * sm_scale
            if cap > 0:
                x = cap * torch.tanh(x / cap)
            lse[i, head] = torch.logsumexp(x, 0) / math.log(2)
            out[i, head] = torch.softmax(x, 0) @ v[keys, head // group].float()
    return out, lse


@pytest.mark.parametrize("cap", [0.0, 5.0])
def test_block_sparse_reference_is_dense_attention_over_the_listed_blocks(cap):
    q, k, v = _bf16(10, 4, 64, seed=1), _bf16(12, 2, 64, seed=2), _bf16(12, 2, 64, seed=3)
    # R=4, C=3: 3 block rows (the last one partial: rows 8-9), 4 column blocks; block row
    # 1 lists nothing, block row 2 lists blocks out of order.
    i32 = functools.partial(torch.tensor, dtype=torch.int32)
    indptr, indices = i32([0, 2, 2, 5]), i32([0, 3, 3, 1, 2])
    out, lse = _reference("block_sparse_run_h32_kv8_d128")(q, k, v, indptr, indices, 4, 3, 0.2, cap)
    expected, expected_lse = _bsr_dense(q, k, v, indptr, indices, 4, 3, 0.2, cap)
    _close(out, expected)
    assert torch.allclose(lse, expected_lse, atol=1e-3)
    assert torch.equal(out[4:8], torch.zeros_like(out[4:8])) and torch.isinf(lse[4:8]).all()
    # With every block listed it is FlashInfer's single prefill without a mask.
    full = _reference("block_sparse_run_h32_kv8_d128")(
        q, k, v, i32([0, 4, 8, 12]), i32([0, 1, 2, 3] * 3), 4, 3, 0.2, 0.0
    )
    _close(full[0], fi_attention._single_prefill_reference(q, k, v, causal=False, sm_scale=0.2))


def test_block_sparse_routes_what_it_models_and_refuses_the_rest(monkeypatch):
    from flashinfer.sparse import BlockSparseAttentionWrapper

    call = _routable_attention_call("flashinfer.sparse.BlockSparseAttentionWrapper.run")
    indptr, indices = call.plan[0][:2]
    q = call.args[0]
    cases = [
        ({}, {}, {"sm_scale": 0.1, "logits_soft_cap": 30.0, "R": 16, "C": 8, "indptr": indptr}),
        (
            {"sm_scale": None, "logits_soft_cap": None},
            {"return_lse": False, "enable_pdl": None},
            {"sm_scale": 1 / math.sqrt(128), "logits_soft_cap": 0.0, "indices": indices},
        ),
        ({"causal": True}, {}, "plan.causal"),
        ({"mask": torch.ones(3, 16, 8, dtype=torch.bool)}, {}, "plan.mask"),
        ({"packed_mask": torch.ones(48, dtype=torch.uint8)}, {}, "plan.packed_mask"),
        ({"pos_encoding_mode": "ROPE_LLAMA"}, {}, "plan.pos_encoding_mode"),
        ({"use_fp16_qk_reduction": True}, {}, "plan.use_fp16_qk_reduction"),
        ({"block_mask": torch.ones(32, 2, 2, dtype=torch.bool)}, {}, "plan.block_mask"),
        ({"kv_splits": "auto"}, {}, "plan.kv_splits"),
        ({"q_data_type": "float16"}, {}, "plan.q_data_type"),
        ({"o_data_type": torch.float16}, {}, "plan.o_data_type"),
        ({}, {"scale_q": torch.ones(1)}, "scale_q"),
        ({"__args__": (indptr, indices, 16, 16, 8, 8, 32, 8, 128)}, {}, "plan.M,q"),
        ({}, {"__args__": (q.half(), *[t.half() for t in call.args[1:]])}, "tensor:q"),
    ]
    seen = _route_wrapper(
        monkeypatch, BlockSparseAttentionWrapper, "_pos_encoding_mode",
        "block_sparse_run_h32_kv8_d128", _build(call), cases,
    )  # fmt: skip
    assert torch.equal(seen[0]["q"], q)


def _var_bsr_dense(q, k, v, mask, rows, cols, sm_scale, cap):
    """The variable blocks expanded to each (head, query)'s key list, as FlashInfer's plan
    expands them, then dense attention over those keys."""
    h, m, _ = q.shape
    group = h // k.shape[0]
    row_of = [r for r, n in enumerate(rows.tolist()) for _ in range(n)]
    starts = [0, *torch.as_tensor(cols).cumsum(0).tolist()]
    out = torch.zeros(h, m, v.shape[-1])
    for head in range(h):
        kv = head // group
        for i in range(m):
            selected = mask[kv, row_of[i]].nonzero().flatten().tolist()
            keys = [j for c in selected for j in range(starts[c], starts[c + 1])]
            if not keys:
                continue
            x = (k[kv, keys].float() @ q[head, i].float()) * sm_scale
            if cap > 0:
                x = cap * torch.tanh(x / cap)
            out[head, i] = torch.softmax(x, 0) @ v[kv, keys].float()
    return out


@pytest.mark.parametrize("cap", [0.0, 5.0])
def test_var_block_sparse_reference_is_dense_attention_over_each_heads_blocks(cap):
    q, k, v = _bf16(4, 7, 64, seed=1), _bf16(2, 9, 64, seed=2), _bf16(2, 9, 64, seed=3)
    # Rows in blocks of 2, 0, 5; keys in blocks of 4, 1, 4; KV head 1 has its own mask, and
    # its row block 0 sees nothing.
    mask = torch.tensor(
        [[[1, 0, 1], [0, 0, 0], [0, 1, 1]], [[0, 0, 0], [1, 1, 1], [1, 0, 0]]], dtype=torch.bool
    )
    rows, cols = torch.tensor([2, 0, 5]), torch.tensor([4, 1, 4])
    i32 = functools.partial(torch.tensor, dtype=torch.int32)
    out = _reference("var_block_sparse_run_h32_kv8_d128")(
        q, k, v, mask, i32([0, 2, 2, 7]), i32([0, 4, 5, 9]), 0.2, cap
    )
    _close(out, _var_bsr_dense(q, k, v, mask, rows, cols, 0.2, cap))
    assert torch.equal(out[2:, :2], torch.zeros_like(out[2:, :2]))  # KV head 1, row block 0
    assert out[:2, :2].abs().sum() > 0


def test_var_block_sparse_routes_offsets_from_block_sizes_and_refuses_the_rest(monkeypatch):
    from flashinfer.sparse import VariableBlockSparseAttentionWrapper

    call = _routable_attention_call("flashinfer.sparse.VariableBlockSparseAttentionWrapper.run")
    mask, rows, cols = call.plan[0][:3]
    per_head = rows.clone()
    per_head[1] = torch.tensor([3, 2, 1], dtype=torch.int32)
    i32 = functools.partial(torch.tensor, dtype=torch.int32)
    cases = [
        (
            {},
            {},
            {"row_indptr": i32([0, 1, 3, 6]), "col_indptr": i32([0, 3, 4, 6]), "sm_scale": 0.1},
        ),
        (
            {"sm_scale": None, "logits_soft_cap": None},
            {"enable_pdl": None},
            {"sm_scale": 1 / math.sqrt(128), "logits_soft_cap": 0.0, "block_mask_map": mask},
        ),
        ({"causal": True}, {}, "plan.causal"),
        ({"pos_encoding_mode": "ROPE_LLAMA"}, {}, "plan.pos_encoding_mode"),
        ({"use_fp16_qk_reduction": True}, {}, "plan.use_fp16_qk_reduction"),
        ({"q_data_type": "float16"}, {}, "plan.q_data_type"),
        ({"__args__": (mask, per_head, cols, 32, 8, 128)}, {}, "plan.block_row_sz"),
        ({}, {"return_lse": True}, "return_lse"),
        ({}, {"out": torch.empty(1)}, "out"),
    ]
    seen = _route_wrapper(
        monkeypatch, VariableBlockSparseAttentionWrapper, "_pos_encoding_mode",
        "var_block_sparse_run_h32_kv8_d128", _build(call), cases,
    )  # fmt: skip
    # The routed result is the docstring example's: dense attention under the expanded mask.
    q, k, v = call.args
    expected = _var_bsr_dense(q, k, v, mask, rows[0], cols[0].tolist(), 0.1, 30.0)
    _close(_reference("var_block_sparse_run_h32_kv8_d128")(**seen[0]), expected)


# ---------------------------------------------------------------------------------------
# cuDNN paged prefill
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_cudnn_prefill_reference_is_flashinfers_template_and_dense_attention(causal):
    g = torch.Generator().manual_seed(0)
    ps, kv, h, d = 4, 2, 8, 64
    k = torch.randn(9, kv, ps, d, generator=g).to(torch.bfloat16)
    v = torch.randn(9, kv, ps, d, generator=g).to(torch.bfloat16)
    lens_q, lens_kv = torch.tensor([3, 1, 4], dtype=torch.int32), torch.tensor([10, 5, 2])
    q = torch.randn(8, h, d, generator=g).to(torch.bfloat16)
    tables = torch.tensor([[4, 1, 7], [0, 6, 2], [3, 5, 8]], dtype=torch.int32)
    indptr = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    out = _reference("cudnn_batch_prefill_h32_kv8_d128_ps16")(
        q, k, v, 0.125, 4, 12, indptr, lens_kv.int(), tables, causal
    )
    theirs, _ = fi_attention._cudnn_batch_prefill_reference(
        q, k, v, 0.125, None, 4, 12, lens_q, lens_kv, causal, False, block_tables=tables
    )
    _close(out, theirs)
    for b in range(2):  # the requests with at least as many keys as queries
        keys = k[tables[b].long()].permute(0, 2, 1, 3).flatten(0, 1)[: int(lens_kv[b])]
        vals = v[tables[b].long()].permute(0, 2, 1, 3).flatten(0, 1)[: int(lens_kv[b])]
        rows = slice(int(indptr[b]), int(indptr[b + 1]))
        expected, _ = _dense(q[rows], keys, vals, sm_scale=0.125, causal=causal)
        _close(out[rows], expected)
    if causal:  # request 2 has 4 queries and 2 keys: its first query sees key 0 alone
        _close(out[4], v[3, :, 0].repeat_interleave(h // kv, dim=0))


def _cudnn_prefill_call():
    call = _routable_attention_call("flashinfer.cudnn.prefill.cudnn_batch_prefill_with_kv_cache")
    return call.args, dict(call.kwargs)


def test_cudnn_prefill_routes_packed_offsets_and_refuses_the_rest():
    args, kwargs = _cudnn_prefill_call()
    indptr = kwargs["batch_offsets_q"]
    q = args[0]
    elements = indptr * q.shape[1] * q.shape[2]
    moved = indptr.clone()
    moved[1] += 1
    # Without cudnn-frontend (as here) FlashInfer's cubin path takes the refused calls, and
    # it asserts return_lse before it reaches a kernel.
    cubin = AssertionError
    cases = [
        ({}, {"qo_indptr": indptr, "causal": True, "scale": 0.1}),
        (
            {"batch_offsets_q": None, "batch_offsets_o": None, "causal": False},
            {"qo_indptr": indptr, "causal": False},
        ),
        (
            {
                "batch_offsets_units": "elements",
                "batch_offsets_q": elements,
                "batch_offsets_o": elements,
            },
            {"q": q},
        ),
        (
            {"batch_offsets_q": moved},
            ("batch_offsets_q,actual_seq_lens_q,batch_offsets_units,q", cubin),
        ),
        (
            {"batch_offsets_q": elements},
            ("batch_offsets_q,actual_seq_lens_q,batch_offsets_units,q", cubin),
        ),
        ({"return_lse": True}, ("return_lse", NotImplementedError)),
        # A caller's `out` is written and returned first (Note [output buffers]); one of
        # another dtype is FlashInfer's.
        ({"out": torch.empty_like(q)}, {"q": q}),
        ({"out": torch.empty_like(q).half()}, ("tensor:output", cubin)),
        ({"q_scale": torch.ones(1, 1, 1, 1)}, ("q_scale", cubin)),
        ({"o_data_type": torch.float16}, ("o_data_type", cubin)),
        ({"batch_offsets_stats": indptr}, ("batch_offsets_stats", cubin)),
    ]
    path = "flashinfer.cudnn.prefill.cudnn_batch_prefill_with_kv_cache"
    _route(path, "cudnn_batch_prefill_h32_kv8_d128_ps16", (args, kwargs), cases)


def test_cudnn_prefill_returns_output_and_no_lse_as_flashinfer_does():
    args, kwargs = _cudnn_prefill_call()
    name = "cudnn_batch_prefill_h32_kv8_d128_ps16"
    with rt.enable_apply({name: _recorder(name, [])}):
        result = flashinfer.cudnn.prefill.cudnn_batch_prefill_with_kv_cache(*args, **kwargs)
    assert isinstance(result, tuple) and len(result) == 2 and result[1] is None
    assert result[0].shape == args[0].shape and result[0].dtype == torch.bfloat16
