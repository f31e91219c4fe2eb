"""flashinfer-bench's correctness rule, as fibgen.runtime.checking.compare implements it."""

import math

import pytest
import torch

from fibgen.runtime.checking.compare import compare, compare_outputs, default_tolerance


def test_identical_tensors_match():
    x = torch.randn(4, 8)
    r = compare(x, x.clone())
    assert r.ok and r.max_abs_err == 0 and r.matched_ratio == 1.0 and r.num_mismatched == 0


def test_element_fails_only_when_both_errors_exceed():
    expected = torch.tensor([100.0, 0.001], dtype=torch.float32)
    # 100 -> 100.5: abs 0.5 > atol but rel 0.005 <= rtol; 0.001 -> 0.0015: rel 0.5 but abs small.
    actual = torch.tensor([100.5, 0.0015])
    assert compare(actual, expected, atol=1e-2, rtol=1e-2).ok
    r = compare(torch.tensor([101.5, 0.001]), expected, atol=1e-2, rtol=1e-2)
    assert not r.ok and r.num_mismatched == 1 and r.matched_ratio == 0.5
    assert math.isclose(r.max_abs_err, 1.5)
    assert "1 of 2 elements" in r.reason


def test_matched_ratio_allows_some_failures():
    expected = torch.zeros(10)
    actual = expected.clone()
    actual[0] = 1.0
    assert not compare(actual, expected).ok
    assert compare(actual, expected, matched=0.9).ok
    assert not compare(actual, expected, matched=0.95).ok


def test_default_tolerances_per_dtype():
    assert default_tolerance(torch.bfloat16) == (1e-2, 1e-2)
    assert default_tolerance(torch.float16) == (1e-2, 1e-2)
    assert default_tolerance(torch.float32)[0] < 1e-2
    assert default_tolerance(torch.int32) == (0.0, 0.0)
    assert default_tolerance("float8_e4m3fn")[0] > 1e-2
    e = torch.ones(3, dtype=torch.bfloat16)
    assert compare(e + 0.0078125, e).ok  # one bf16 step at 1.0 is within 1e-2
    e32 = torch.ones(3)
    assert not compare(e32 + 1e-3, e32).ok


def test_integers_are_exact():
    e = torch.tensor([1, 2, 3], dtype=torch.int32)
    assert compare(e.clone(), e).ok
    r = compare(torch.tensor([1, 2, 4], dtype=torch.int32), e, atol=10, rtol=10)
    assert not r.ok and r.max_abs_err == 1


def test_nan_and_inf():
    e = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    assert compare(e.clone(), e).ok
    r = compare(torch.tensor([0.0, float("inf"), -float("inf"), 1.0]), e)
    assert not r.ok and r.num_mismatched == 1 and r.max_abs_err == float("inf")
    r = compare(torch.tensor([float("nan"), -float("inf"), -float("inf"), 1.0]), e)
    assert not r.ok and r.num_mismatched == 1
    r = compare(torch.tensor([float("nan"), float("inf"), -float("inf"), float("nan")]), e)
    assert not r.ok and r.num_mismatched == 1


def test_shape_and_dtype_mismatch_fail_with_reason():
    e = torch.zeros(2, 3)
    r = compare(torch.zeros(3, 2), e)
    assert not r.ok and "shape [3, 2] != expected [2, 3]" in r.reason
    r = compare(torch.zeros(2, 3, dtype=torch.float16), e)
    assert not r.ok and "dtype" in r.reason
    assert compare(torch.zeros(2, 3, dtype=torch.float16), e, check_dtype=False).ok


def test_empty_and_low_bit():
    assert compare(torch.zeros(0, 4), torch.zeros(0, 4)).ok
    e = torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn)
    assert compare(e.clone(), e).ok
    if hasattr(torch, "float4_e2m1fn_x2"):
        b = torch.tensor([0x22, 0x13], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        assert compare(b.clone(), b).ok
        other = torch.tensor([0x22, 0x14], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        assert not compare(other, b).ok


def test_compare_outputs_by_name():
    out = (torch.ones(2), torch.zeros(2))
    res = compare_outputs(out, (torch.ones(2), torch.ones(2)), ["output", "lse"])
    assert res["output"].ok and not res["lse"].ok
    assert "FAILED" in str(res["lse"]) and "max_abs_err" in str(res["output"])
    with pytest.raises(ValueError, match="got 1 outputs, expected 2"):
        compare_outputs(torch.ones(2), out)


# ---------------------------------------------------------------------------------------
# Samplers: draws in rounds, within a time budget (Note [judging samplers])

SAMPLER = {"name": "top_k_sampling_from_probs_v256", "op_type": "sampling"}


def _top_k_inputs(rows: int = 4, vocab: int = 256) -> dict:
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(rows, vocab, generator=gen)
    return {"probs": probs / probs.sum(-1, keepdim=True), "top_k": torch.full((rows,), 48)}


def _top_k_reference(inputs: dict) -> torch.Tensor:
    probs, k = inputs["probs"], int(inputs["top_k"][0])
    vals, idx = probs.sort(-1, descending=True)
    vals[:, k:] = 0
    return idx.gather(-1, torch.multinomial(vals, 1)).squeeze(-1)


def _gumbel(inputs: dict) -> torch.Tensor:
    # Correct, and draws otherwise than the reference.
    probs, k = inputs["probs"], int(inputs["top_k"][0])
    vals, idx = probs.sort(-1, descending=True)
    logp = vals.log()
    logp[:, k:] = float("-inf")
    g = -torch.empty_like(logp).exponential_().log()
    return idx.gather(-1, (logp + g).argmax(-1, keepdim=True)).squeeze(-1)


def _top_token(inputs: dict) -> torch.Tensor:
    return inputs["probs"].argmax(-1)


def test_a_correct_sampler_passes_at_the_first_round_of_draws():
    from fibgen.runtime.checking.compare import SAMPLING_MIN_DRAWS, compare_sampling

    result = compare_sampling(_gumbel, _top_k_reference, _top_k_inputs(), SAMPLER)
    # 48 tokens a row need several thousand draws for a tight figure; the pass is clear sooner.
    assert result.ok and result.draws == SAMPLING_MIN_DRAWS < result.needed, result


def test_a_sampler_far_off_fails_at_the_first_round_of_draws():
    from fibgen.runtime.checking.compare import SAMPLING_MIN_DRAWS, compare_sampling

    # Always the top token: inside the top-k set, so only the distribution gives it away.
    result = compare_sampling(_top_token, _top_k_reference, _top_k_inputs(), SAMPLER)
    assert not result.ok and not result.timed_out and result.draws == SAMPLING_MIN_DRAWS
    assert result.reason.startswith("total variation distance")


def test_draws_that_do_not_fit_the_budget_leave_the_sampler_undecided(monkeypatch):
    import fibgen.runtime.checking.compare as compare_module
    from fibgen.runtime.checking.compare import SAMPLING_MIN_DRAWS, compare_sampling

    # A clock that only the reference moves: each of its calls takes 50 ms.
    now, calls = [0.0], {"reference": 0, "solution": 0}
    monkeypatch.setattr(compare_module, "_clock", lambda: now[0])

    def slow(inputs):
        calls["reference"] += 1
        now[0] += 0.05
        return _top_k_reference(inputs)

    def solution(inputs):
        calls["solution"] += 1
        return _gumbel(inputs)

    result = compare_sampling(solution, slow, _top_k_inputs(), SAMPLER, budget_s=0.06)
    # The reference's first round (one batched call) is made; the solution's would overrun,
    # so only its trial calls (one draw per row each) are made, and none of its rounds.
    assert calls == {"reference": 1, "solution": 100}
    assert result.timed_out and not result.ok and result.needed > result.draws
    assert result.reason.startswith("not judged within 0.06 s: 1000 draws per row of the reference")
    # The reference's round and the solution's, at the reference's speed, per 1000 draws.
    assert result.seconds_needed == pytest.approx(0.1 * result.needed / SAMPLING_MIN_DRAWS)


# ---------------------------------------------------------------------------------------
# Which definitions are samplers, and what their rows draw from (Note [judging samplers])


def test_a_sampler_is_recognised_by_its_op_type_and_its_output():
    from fibgen.runtime.checking.compare import is_sampling

    def definition(op_type, inputs, outputs):
        return {"op_type": op_type, "inputs": dict.fromkeys(inputs), "outputs": outputs}

    assert is_sampling(definition("sampling", ["probs", "top_k"], {"samples": {}}))
    assert is_sampling(definition("sampling", ["logits"], {"samples": {}}))
    chain = {"accepted_token_ids": {}, "accepted_token_num": {}}
    assert is_sampling(definition("sampling", ["draft_probs"], chain))
    # FlashInfer files deterministic helpers under op_type "sampling" too.
    assert not is_sampling(definition("sampling", ["probs", "top_p"], {"renormalized": {}}))
    assert not is_sampling(definition("sampling", ["input", "lengths"], {"indices": {}}))
    assert not is_sampling(definition("rmsnorm", ["probs"], {"samples": {}}))


def _softmax_sampler(inputs: dict) -> torch.Tensor:
    return torch.multinomial(torch.softmax(inputs["logits"], -1), 1).squeeze(-1)


@pytest.mark.slow
def test_a_sampler_from_logits_draws_from_their_softmax():
    from fibgen.runtime.checking.compare import compare_sampling

    logits = torch.randn(4, 32, generator=torch.Generator().manual_seed(1)) * 2
    definition = {"name": "sampling_from_logits_v32", "op_type": "sampling"}
    inputs = {"logits": logits}
    assert compare_sampling(_softmax_sampler, _softmax_sampler, inputs, definition).ok
    greedy = compare_sampling(
        lambda i: i["logits"].argmax(-1), _softmax_sampler, inputs, definition
    )
    assert not greedy.ok and greedy.reason.startswith("total variation distance")


@pytest.mark.slow
def test_a_min_p_sampler_draws_only_above_its_threshold():
    from fibgen.runtime.checking.compare import compare_sampling

    probs = torch.softmax(torch.randn(4, 32, generator=torch.Generator().manual_seed(2)) * 2, -1)
    inputs = {"probs": probs, "min_p": torch.full((4,), 0.2)}

    def min_p(i):
        kept = torch.where(
            i["probs"] >= i["probs"].max(-1, keepdim=True).values * 0.2, i["probs"], 0
        )
        return torch.multinomial(kept, 1).squeeze(-1)

    definition = {"name": "min_p_sampling_v32", "op_type": "sampling"}
    assert compare_sampling(min_p, min_p, inputs, definition).ok
    # Unfiltered draws land outside the min-p set: caught by the first check.
    plain = compare_sampling(
        lambda i: torch.multinomial(i["probs"], 1).squeeze(-1), min_p, inputs, definition
    )
    assert not plain.ok and "outside its valid min_p set" in plain.reason


def _chain(inputs: dict, accept_all: bool = False) -> torch.Tensor:
    # Speculative sampling of a chain: accept draft i with min(1, target / draft), then draw
    # the correction (or the bonus token); -1 after it.
    draft, ids, target = inputs["draft_probs"], inputs["draft_token_ids"], inputs["target_probs"]
    batch, steps = ids.shape
    out = torch.full((batch, steps + 1), -1, dtype=torch.int32)
    for b in range(batch):
        pos = steps
        for i in range(steps):
            tok = int(ids[b, i])
            if accept_all or torch.rand(()) * draft[b, i, tok] < target[b, i, tok]:
                out[b, i] = tok
            else:
                pos = i
                break
        weights = target[b, pos] - (draft[b, pos] if pos < steps else 0)
        out[b, pos] = int(torch.multinomial(weights.clamp(min=0), 1))
    return out


@pytest.mark.slow
def test_a_sampler_of_several_positions_is_judged_position_by_position():
    from fibgen.runtime.checking.compare import compare_sampling

    gen = torch.Generator().manual_seed(3)
    draft = torch.softmax(torch.randn(2, 2, 8, generator=gen), -1)
    target = torch.softmax(torch.randn(2, 3, 8, generator=gen), -1)
    ids = torch.multinomial(draft.reshape(-1, 8), 1, generator=gen).reshape(2, 2).int()
    inputs = {"draft_probs": draft, "draft_token_ids": ids, "target_probs": target}
    definition = {"name": "chain_speculative_sampling_v8", "op_type": "sampling"}
    assert compare_sampling(_chain, _chain, inputs, definition).ok
    # Accepting every draft token emits the wrong tokens at every position.
    wrong = compare_sampling(lambda i: _chain(i, accept_all=True), _chain, inputs, definition)
    assert not wrong.ok and wrong.reason.startswith("total variation distance")
    # A position outside the vocabulary (and not -1) is an invalid draw.
    bad = compare_sampling(lambda i: _chain(i).clamp(min=0) + 8, _chain, inputs, definition)
    assert not bad.ok and "outside the vocabulary" in bad.reason
