"""The sampling and top-k families of sampling_samplers.fidef and sampling_transforms.fidef,
held to the real FlashInfer 0.7.2 on the CPU.

Routing: FlashInfer's own functions are called with apply on and a solution that records
what it is given. A call with FlashInfer's defaults, and one with a parameter the definition
reads at another value (a scalar threshold, a missing temperature, row starts), reach the
solution with the values the definition declares; a call with a ruled parameter at a value
the definition does not model is refused, counted with its rule, and goes to FlashInfer
itself, whose kernels raise on this CPU.

References: the deterministic families against FlashInfer's template references
(``flashinfer.trace.templates``), the top-k selections as sets per row (FlashInfer's order
is unspecified, Note [top-k order]); the samplers by the distribution of many draws against
the distribution their filters leave, computed with FlashInfer's template filters.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

from _shared import require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import flashinfer  # noqa: E402
import flashinfer.sampling  # noqa: E402
import flashinfer.topk  # noqa: E402
import flashinfer.topk_varlen.topk_varlen  # noqa: E402
from flashinfer.trace.templates import sampling as fi_sampling  # noqa: E402
from flashinfer.trace.templates import topk as fi_topk  # noqa: E402

import _routable_calls as routable  # noqa: E402
import fibgen.runtime as rt  # noqa: E402
from fibgen.compiler import compile_paths  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# What FlashInfer raises here: its JIT's architecture check, or its device checks.
FLASHINFER_ON_CPU = (RuntimeError, ValueError)
# Slow as a whole: sampling calls through the real FlashInfer's API, judged by their draws.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning"),
]


@functools.cache
def _module():
    files = ("sampling.fidef", "sampling_samplers.fidef", "sampling_transforms.fidef")
    result = compile_paths([str(ROOT / "definitions" / f) for f in files])
    assert result.ok, "the sampling definitions do not compile"
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


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------------------

V = 128256


def _probs(rows=3, seed=0):
    return torch.softmax(torch.randn(rows, V, generator=_gen(seed)) * 3, dim=-1)


def _logits(rows=3, seed=0):
    return torch.randn(rows, V, generator=_gen(seed)) * 2


def test_samplers_with_defaults_and_scalar_thresholds_are_routed():
    probs, logits, seen = _probs(), _logits(), []
    fs = flashinfer.sampling
    mapping = {
        name: _recorder(name, seen)
        for name in (
            "sampling_from_probs_v128256",
            "sampling_from_logits_v128256",
            "min_p_sampling_v128256",
            "top_k_top_p_sampling_from_logits_v128256",
        )
    }
    with rt.enable_apply(mapping, strict=True):
        a = fs.sampling_from_probs(probs)
        b = fs.sampling_from_logits(logits, deterministic=False, check_nan=True)
        c = fs.min_p_sampling_from_probs(probs, 0.2)
        d = fs.top_k_top_p_sampling_from_logits(logits, 1, 0.9)
        e = fs.top_k_top_p_sampling_from_logits(
            logits, torch.tensor([1, 1, 1]), torch.tensor([0.9, 0.5, 0.0])
        )
    for out in (a, b, c, d, e):
        assert out.dtype == torch.int32 and out.shape == (3,)
    # A scalar threshold reaches the solution as one value per row.
    assert torch.equal(seen[2]["min_p"], torch.full((3,), 0.2))
    assert seen[3]["top_k"].dtype == torch.int32 and torch.equal(seen[3]["top_k"], torch.ones(3))
    # top_k=1 keeps the largest logit only: every draw is the argmax.
    assert torch.equal(d.long(), logits.argmax(-1)) and torch.equal(e.long(), logits.argmax(-1))
    assert torch.equal(seen[1]["logits"], logits)


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"seed": 7}, "seed"),
        ({"offset": 3}, "offset"),
        ({"generator": torch.Generator()}, "generator"),
        ({"indices": torch.tensor([0, 1], dtype=torch.int32)}, "indices"),
        ({"return_valid": True}, "return_valid"),
    ],
)
def test_a_sampler_call_the_definition_does_not_model_falls_back(kwargs, rule):
    seen: list = []
    with rt.enable_apply({"sampling_from_probs_v128256": _recorder("x", seen)}):
        with pytest.raises(FLASHINFER_ON_CPU):
            flashinfer.sampling.sampling_from_probs(_probs(), **kwargs)
    assert not seen
    assert rt.stats()["flashinfer.sampling.sampling_from_probs"]["rules"] == {rule: 1}


def test_the_joint_filter_order_falls_back():
    seen: list = []
    name = "top_k_top_p_sampling_from_logits_v128256"
    with rt.enable_apply({name: _recorder(name, seen)}):
        with pytest.raises(FLASHINFER_ON_CPU):
            flashinfer.sampling.top_k_top_p_sampling_from_logits(
                _logits(), 5, 0.9, filter_apply_order="joint"
            )
    assert not seen
    path = "flashinfer.sampling.top_k_top_p_sampling_from_logits"
    assert rt.stats()[path]["rules"] == {"filter_apply_order": 1}


def test_transforms_are_routed_and_return_what_the_definition_computes():
    logits, probs, seen = _logits(), _probs(), []
    names = ["softmax", "top_p_renorm_probs", "top_k_renorm_probs", "top_k_mask_logits"]
    mapping = {f"{n}_v128256": _recorder(f"{n}_v128256", seen) for n in names}
    fs = flashinfer.sampling
    with rt.enable_apply(mapping, strict=True):
        plain = fs.softmax(logits)
        warm = fs.softmax(logits, 0.5, enable_pdl=True)
        top_p = fs.top_p_renorm_probs(probs, 0.5, is_deterministic=True)
        top_k = fs.top_k_renorm_probs(probs, 4)
        masked = fs.top_k_mask_logits(logits, torch.tensor([1, 2, 3]))
    # A missing temperature is 1, a number is every row's.
    assert torch.equal(seen[0]["temperature"], torch.ones(3))
    assert torch.equal(seen[1]["temperature"], torch.full((3,), 0.5))
    assert torch.allclose(plain, torch.softmax(logits, -1), atol=1e-6)
    assert torch.allclose(warm, torch.softmax(logits / 0.5, -1), atol=1e-6)
    assert torch.equal((top_k > 0).sum(-1), torch.full((3,), 4))
    assert torch.allclose(top_p.sum(-1), torch.ones(3), atol=1e-5)
    assert torch.equal(torch.isfinite(masked).sum(-1), torch.tensor([1, 2, 3]))


def _ragged_call(**extra):
    x = torch.randn(3, 3000, generator=_gen(1))
    offsets = torch.tensor([0, 100, 5000], dtype=torch.int32)
    lengths = torch.tensor([2500, 10, 0], dtype=torch.int32)
    return x, offsets, lengths, extra


def test_top_k_selections_are_routed_with_their_row_starts():
    name = "top_k_ragged_transform_k2048"
    x, offsets, lengths, _ = _ragged_call()
    starts = torch.tensor([400, 7, 0], dtype=torch.int32)
    seen: list = []
    with rt.enable_apply({name: _recorder(name, seen)}, strict=True):
        plain = flashinfer.topk.top_k_ragged_transform(x, offsets, lengths, 2048)
        tied = flashinfer.topk.top_k_ragged_transform(
            x, offsets, lengths, 2048, tie_break=1, row_starts=starts
        )
    assert seen[0]["row_starts"] is None and torch.equal(seen[1]["row_starts"], starts)
    assert torch.equal(plain[1, :10], torch.arange(100, 110, dtype=torch.int32))
    assert (plain[1, 10:] == -1).all() and (plain[2] == -1).all()
    # Row 0 ranks another window with row starts: another selection.
    assert not torch.equal(plain[0], tied[0])


def test_a_top_k_selection_the_definition_does_not_model_falls_back():
    name = "top_k_ragged_transform_k2048"
    x, offsets, lengths, _ = _ragged_call()
    seen: list = []
    with rt.enable_apply({name: _recorder(name, seen)}):
        fn = flashinfer.topk.top_k_ragged_transform  # the patched function
        with pytest.raises(FLASHINFER_ON_CPU):
            fn(x, offsets, lengths, 2048, tie_break=2)  # the larger of tied positions
        with pytest.raises(FLASHINFER_ON_CPU):
            fn(x, offsets, lengths, 1024)  # a k no instance has
    assert not seen
    counts = rt.stats()["flashinfer.topk.top_k_ragged_transform"]
    assert counts["rules"] == {"tie_break": 1} and counts["fallback_no_candidate"] == 1


def test_top_k_varlen_returns_flashinfers_pair_and_refuses_what_it_does_not_model():
    name = "top_k_varlen_n8192_k512"
    logits = torch.randn(2, 8192, generator=_gen(2))
    seq_lens = torch.tensor([8192, 300], dtype=torch.int32)
    seen: list = []
    with rt.enable_apply({name: _recorder(name, seen)}):
        fn = flashinfer.topk_varlen.topk_varlen.top_k_varlen  # the patched function
        indices, values = fn(logits, seq_lens, 512)
        with pytest.raises(FLASHINFER_ON_CPU):
            fn(logits, seq_lens, 512, next_n=2)
    assert values is None and indices.shape == (2, 512) and len(seen) == 1
    assert torch.equal(indices[1, :300], torch.arange(300, dtype=torch.int32))
    path = "flashinfer.topk_varlen.topk_varlen.top_k_varlen"
    assert rt.stats()[path]["rules"] == {"next_n": 1}


def test_chain_speculative_sampling_returns_flashinfers_triple():
    name = "chain_speculative_sampling_v128256"
    x, _ = _catalogue().inputs(name, batch_size=2, num_speculative=3)
    seen: list = []
    with rt.enable_apply({name: _recorder(name, seen)}, strict=True):
        ids, accepted, emitted = flashinfer.sampling.chain_speculative_sampling(
            x["draft_probs"], x["draft_token_ids"], x["target_probs"]
        )
    assert ids.shape == (2, 4) and ids.dtype == torch.int32
    assert accepted.shape == emitted.shape == (2,)
    with rt.enable_apply({name: _recorder(name, seen)}):
        with pytest.raises(FLASHINFER_ON_CPU):
            flashinfer.sampling.chain_speculative_sampling(
                x["draft_probs"],
                x["draft_token_ids"],
                x["target_probs"],
                maybe_output_accepted_token_num=torch.zeros(2, dtype=torch.int32),
            )
    assert len(seen) == 1
    path = "flashinfer.sampling.chain_speculative_sampling"
    assert rt.stats()[path]["rules"] == {"maybe_output_accepted_token_num": 1}


# ---------------------------------------------------------------------------------------
# Deterministic references against FlashInfer's template references
# ---------------------------------------------------------------------------------------


def test_softmax_reference_is_flashinfers_template():
    logits, t = _logits(seed=3), torch.tensor([0.5, 1.0, 1.7])
    ours = _reference("softmax_v128256")(logits, t)
    assert torch.allclose(ours, fi_sampling._softmax_reference(logits, t), atol=1e-7)
    assert not torch.allclose(ours, _reference("softmax_v128256")(logits, torch.ones(3)))


def test_renorm_and_mask_references_are_flashinfers_templates():
    probs, logits = _probs(seed=4), _logits(seed=5)
    top_p = torch.tensor([0.3, 0.6, 0.9])
    ours = _reference("top_p_renorm_probs_v128256")(probs, top_p)
    assert torch.allclose(ours, fi_sampling._top_p_renorm_probs_reference(probs, top_p), atol=1e-6)
    k = torch.full((3,), 7, dtype=torch.int32)
    ours = _reference("top_k_renorm_probs_v128256")(probs, k)
    assert torch.allclose(ours, fi_sampling._top_k_renorm_probs_reference(probs, k), atol=1e-6)
    ours = _reference("top_k_mask_logits_v128256")(logits, k)
    assert torch.equal(ours, fi_sampling._top_k_mask_logits_reference(logits, k))
    # Per-row k, which the template (it takes the largest k of all rows) does not model:
    # each row keeps exactly its own k.
    ours = _reference("top_k_mask_logits_v128256")(logits, torch.tensor([1, 5, 9]))
    assert torch.equal(torch.isfinite(ours).sum(-1), torch.tensor([1, 5, 9]))


def test_renorm_references_keep_ties_at_the_pivot():
    # FlashInfer's kernels keep every probability at least the pivot (sampling.cuh): with
    # k=2, or p=0.5, the pivot is 0.2 and all three tokens tied at it stay.
    probs = torch.zeros(1, V)
    probs[0, :4] = torch.tensor([0.4, 0.2, 0.2, 0.2])
    k_out = _reference("top_k_renorm_probs_v128256")(probs, torch.tensor([2]))
    assert torch.allclose(k_out, probs)
    p_out = _reference("top_p_renorm_probs_v128256")(probs, torch.tensor([0.5]))
    assert torch.allclose(p_out, probs)
    # Without ties the filter cuts: the check above can fail.
    probs[0, :4] = torch.tensor([0.4, 0.3, 0.2, 0.1])
    k_out = _reference("top_k_renorm_probs_v128256")(probs, torch.tensor([2]))
    assert torch.allclose(k_out[0, :4], torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))


def _as_sets(t):
    return [set(row[row >= 0].tolist()) for row in t]


def test_top_k_ragged_and_page_table_references_select_as_flashinfers_templates():
    x, offsets, lengths, _ = _ragged_call()
    ours = _reference("top_k_ragged_transform_k2048")(x, offsets, lengths, None)
    theirs = fi_sampling._top_k_ragged_transform_reference(x, offsets, lengths, 2048)
    # The template pads with 0 where FlashInfer's kernel (its docstring) pads with -1.
    for i, n in enumerate(lengths.tolist()):
        kk = min(n, 2048)
        assert set(ours[i, :kk].tolist()) == set(theirs[i, :kk].tolist())
        assert (ours[i, kk:] == -1).all()
        assert torch.equal(ours[i, :kk], ours[i, :kk].sort().values)
    table = torch.randint(0, 100000, (3, 3000), generator=_gen(6), dtype=torch.int32)
    to_batch = torch.tensor([2, 0, 1], dtype=torch.int32)
    starts = torch.tensor([3, 0, 0], dtype=torch.int32)
    for ps, table_starts in ((1, None), (64, torch.tensor([0, 1, 2], dtype=torch.int32))):
        run = _reference(f"top_k_page_table_transform_k2048_ps{ps}")
        rs = starts if ps == 64 else None
        ours = run(x, table, lengths, to_batch, rs, table_starts)
        theirs = fi_sampling._top_k_page_table_transform_reference(
            x, table, lengths, 2048, to_batch, row_starts=rs,
            page_table_row_starts=table_starts, page_size=ps,
        )  # fmt: skip
        assert _as_sets(ours) == _as_sets(theirs)


def test_top_k_varlen_reference_selects_as_flashinfers_template():
    logits = torch.randn(3, 8192, generator=_gen(7))
    seq_lens = torch.tensor([8192, 600, 17], dtype=torch.int32)
    ours = _reference("top_k_varlen_n8192_k512")(logits, seq_lens)
    theirs = fi_topk._top_k_varlen_reference(logits, seq_lens, 512)
    assert _as_sets(ours) == _as_sets(theirs)
    assert (ours[2, 17:] == -1).all()


# ---------------------------------------------------------------------------------------
# Samplers by the distribution of their draws
# ---------------------------------------------------------------------------------------

DRAWS = 20000


def _frequencies(run, rows, vocab, *inputs):
    """Empirical distribution of ``run``'s draws over DRAWS copies of each of ``rows`` rows."""
    torch.manual_seed(0)
    copies = [x.repeat_interleave(DRAWS, dim=0) for x in inputs]
    samples = run(*copies).long().view(rows, DRAWS)
    return torch.nn.functional.one_hot(samples, vocab).float().mean(1)


def _close_distributions(freq, expected):
    # The standard error of a frequency is at most 0.5 / sqrt(DRAWS) = 0.0035.
    assert (freq - expected).abs().max().item() < 0.02, (freq, expected)
    assert (freq[expected == 0] == 0).all(), "a filtered token was drawn"


def test_sampling_from_probs_and_logits_draw_their_distributions():
    logits = torch.randn(2, 8, generator=_gen(8))
    probs = torch.softmax(logits, -1)
    f = _frequencies(_reference("sampling_from_probs_v128256"), 2, 8, probs)
    _close_distributions(f, probs)
    f = _frequencies(_reference("sampling_from_logits_v128256"), 2, 8, logits)
    _close_distributions(f, probs)


def test_min_p_sampling_draws_the_kept_tokens_in_proportion():
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04], [0.2, 0.2, 0.2, 0.2, 0.2]])
    min_p = torch.tensor([0.15, 0.9])
    # FlashInfer's template filter (it then takes the argmax; the kernel draws).
    kept = torch.where(probs >= probs.max(-1, keepdim=True).values * min_p[:, None], probs, 0)
    expected = kept / kept.sum(-1, keepdim=True)
    assert fi_sampling._min_p_sampling_reference(probs, min_p)[0] == 0
    f = _frequencies(_reference("min_p_sampling_v128256"), 2, 5, probs, min_p)
    _close_distributions(f, expected)


def test_top_k_top_p_sampling_from_logits_draws_what_flashinfers_filters_leave():
    logits = torch.randn(3, 12, generator=_gen(9)) * 2
    top_k = torch.tensor([3, 12, 5], dtype=torch.int32)
    top_p = torch.tensor([0.8, 0.5, 1.0])
    # The template's filters, one row at a time (the template's top-k takes the largest k
    # of all rows).
    expected = torch.cat(
        [
            fi_sampling._top_p_renorm_probs_reference(
                torch.softmax(fi_sampling._top_k_mask_logits_reference(logits[i : i + 1], int(k)), -1),
                float(p),
            )
            for i, (k, p) in enumerate(zip(top_k, top_p))
        ]
    )  # fmt: skip
    run = _reference("top_k_top_p_sampling_from_logits_v128256")
    f = _frequencies(run, 3, 12, logits, top_k, top_p)
    _close_distributions(f, expected)
    # p <= 0 is greedy.
    greedy = run(logits, top_k, torch.zeros(3))
    assert torch.equal(greedy.long(), logits.argmax(-1))


def test_chain_speculative_sampling_emits_the_target_distribution():
    # Speculative sampling's guarantee: each emitted token is distributed as the target.
    draft = torch.softmax(torch.randn(1, 1, 6, generator=_gen(10)) * 2, -1)
    target = torch.softmax(torch.randn(1, 2, 6, generator=_gen(11)) * 2, -1)
    rows = 4000
    torch.manual_seed(1)
    tokens = torch.multinomial(draft[0, 0], rows, replacement=True).to(torch.int32)[:, None]
    run = _reference("chain_speculative_sampling_v128256")
    ids, accepted, emitted = run(draft.expand(rows, -1, -1), tokens, target.expand(rows, -1, -1))
    firsts = torch.nn.functional.one_hot(ids[:, 0].long(), 6).float().mean(0)
    assert (firsts - target[0, 0]).abs().max() < 0.04
    # A draft token is accepted with probability sum_x min(draft(x), target(x)).
    acceptance = torch.minimum(draft[0, 0], target[0, 0]).sum().item()
    assert abs(emitted.float().mean().item() - acceptance) < 0.04
    # Emitted drafts, then the drawn token, then -1.
    for row, n in zip(ids, emitted.tolist()):
        assert (row[: n + 1] >= 0).all() and (row[n + 1 :] == -1).all()
    assert (accepted >= emitted).all()
    # FlashInfer's template accepts exactly where target >= draft: a draft token the target
    # prefers is always accepted.
    best = int((target[0, 0] / draft[0, 0]).argmax())
    token = torch.tensor([[best]], dtype=torch.int32)
    assert int(run(draft, token, target)[0][0, 0]) == best
    assert (
        int(fi_sampling._chain_speculative_sampling_reference(draft, token, target)[0, 0]) == best
    )
