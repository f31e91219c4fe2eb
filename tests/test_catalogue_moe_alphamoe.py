"""AlphaMoE's fused MoE families (moe_alphamoe.fidef) against the real FlashInfer.

FlashInfer's AlphaMoE kernels need an SM100 GPU, so its functions are never run here: as in
``test_catalogue_moe.py`` the real function is replaced by a recorder with its signature, a
call is routed or refused with its rule counted, and the references are held to a
token-by-token computation from the conventional weights, laid out by FlashInfer's own
``alphamoe_interleave_gated_weights`` and planned as ``moe_align_block_size`` plans.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from _shared import require_module, strided

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _routable_moe_alpha as calls
from test_catalogue_gemm import (
    _catalogue,
    _hit,
    _off,  # noqa: F401  (the autouse fixture that turns apply off)
    _recorder,
    _reference,
    _refused,
    _route,
)

import fibgen.runtime as rt
from fibgen.runtime.routing import patching

pytestmark = pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning")


def align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple:
    """vLLM's moe_align_block_size: positions grouped by expert, padded with the sentinel."""
    sentinel = topk_ids.numel()
    flat = topk_ids.flatten()
    ids, experts = [], []
    for e in range(num_experts):
        pos = (flat == e).nonzero().flatten().tolist()
        if not pos:
            continue
        pad = -len(pos) % block_m
        ids += pos + [sentinel] * pad
        experts += [e] * ((len(pos) + pad) // block_m)
    extent = torch.tensor([len(ids)], dtype=torch.int32)
    return torch.tensor(ids, dtype=torch.int32), torch.tensor(experts, dtype=torch.int32), extent


def routes(tokens: int, top_k: int, num_experts: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(tokens)])
    return ids, torch.rand(tokens, top_k, generator=g)


# ---------------------------------------------------------------------------------------
# alphamoe_fp8_block_scale_aligned_moe
# ---------------------------------------------------------------------------------------

FP8 = "flashinfer.fused_moe.alphamoe_fp8_block_scale_aligned_moe"


def test_fp8_aligned_is_routed_and_accumulates_into_out(monkeypatch):
    call = calls.alphamoe_fp8_aligned(_catalogue())
    out = call.kwargs["out"]
    start = out.clone()
    outcome = _route(monkeypatch, FP8, call.name, call.args, call.kwargs)
    seen = _hit(outcome)
    # The kernel adds into the caller's out and returns it.
    assert outcome.result is out and seen["out"] is out
    expected = _reference(call.name)(**{**seen, "out": start})
    assert torch.equal(out, expected)
    assert not torch.equal(out, start)


def test_fp8_aligned_without_out_starts_from_zero(monkeypatch):
    call = calls.alphamoe_fp8_aligned(_catalogue())
    kwargs = {k: v for k, v in call.kwargs.items() if k not in ("out", "block_m")}
    outcome = _route(monkeypatch, FP8, call.name, call.args, kwargs)
    seen = _hit(outcome)
    # A zeroed out is made, accumulated into and returned.
    assert outcome.result is seen["out"]
    assert outcome.result.dtype == torch.bfloat16 and outcome.result.shape == (5, 256)
    zero = torch.zeros(5, 256, dtype=torch.bfloat16)
    assert torch.equal(outcome.result, _reference(call.name)(**{**seen, "out": zero}))


def test_fp8_aligned_without_out_returns_the_same_tensor_compiled_as_eager(monkeypatch):
    # The compiled dispatcher returns what the `default` rule made for out=None, as the
    # eager one does (the generated op's written argument is that tensor, not the None).
    dynamo = pytest.importorskip("torch._dynamo")
    call = calls.alphamoe_fp8_aligned(_catalogue())
    kwargs = {k: v for k, v in call.kwargs.items() if k not in ("out", "block_m")}
    owner, attr = patching._locate(FP8)
    originals: list = []
    monkeypatch.setattr(owner, attr, _recorder(getattr(owner, attr), originals))
    ref = _reference(call.name)
    rt.enable_apply({call.name: lambda **inputs: ref(**inputs)})

    def moe(*args):
        return getattr(owner, attr)(*args, **kwargs)

    eager = moe(*call.args)
    dynamo.reset()
    try:
        compiled = torch.compile(moe, backend="eager", fullgraph=True)(*call.args)
    finally:
        dynamo.reset()
    assert isinstance(eager, torch.Tensor) and isinstance(compiled, torch.Tensor)
    assert eager.shape == (5, 256) and torch.equal(compiled, eager)
    assert rt.stats()[FP8]["hit"] == 2 and not originals


def test_fp8_aligned_with_another_block_m_falls_back(monkeypatch):
    call = calls.alphamoe_fp8_aligned(_catalogue())
    outcome = _route(monkeypatch, FP8, call.name, call.args, call.kwargs | {"block_m": 16})
    _refused(outcome, "block_m")


def _fp8_case(seed: int = 0, tokens: int = 5, I: int = 128, K: int = 2) -> dict:  # noqa: E741
    """Conventional [gate; up] FP8 weights, FlashInfer's interleave of them, a real plan."""
    from flashinfer.fused_moe import alphamoe_interleave_gated_weights

    E, H = 8, 256
    g = torch.Generator().manual_seed(seed)
    fp8 = torch.float8_e4m3fn
    w1 = (torch.randn(E, 2 * I, H, generator=g) * 0.5).to(fp8)
    s1 = torch.rand(E, 2 * I // 128, H // 128, generator=g) + 0.5
    w2 = (torch.randn(E, H, I, generator=g) * 0.5).to(fp8)
    s2 = torch.rand(E, H // 128, I // 128, generator=g) + 0.5
    x = (torch.randn(tokens, H, generator=g) * 2).to(fp8)
    xs = torch.rand(tokens, H // 128, generator=g) * 0.05
    topk_ids, topk_w = routes(tokens, K, E, seed)
    sorted_ids, expert_ids, extent = align(topk_ids, E, 8)
    w1_dev, s1_dev = inspect.unwrap(alphamoe_interleave_gated_weights)(w1, s1)
    return dict(
        natural=(w1, s1), topk_ids=topk_ids, x=x, xs=xs, w2=w2, s2=s2, topk_w=topk_w,
        args=dict(
            hidden_states=x, hidden_states_scale=xs, gemm1_weights=w1_dev,
            gemm1_weights_scale=s1_dev, gemm2_weights=w2, gemm2_weights_scale=s2,
            sorted_token_ids=sorted_ids, expert_ids=expert_ids,
            num_tokens_post_padded=extent, topk_weights=topk_w, routed_scaling_factor=2.5,
            out=torch.zeros(tokens, H, dtype=torch.bfloat16),
        ),
    )  # fmt: skip


def _fp8_by_token(case: dict) -> torch.Tensor:
    """Token by token, route by route, from the conventional weights."""
    w1, s1 = case["natural"]

    def deq(w, s):
        return w.float() * s.repeat_interleave(128, -2).repeat_interleave(128, -1)

    x = case["x"].float() * case["xs"].repeat_interleave(128, -1)
    out = torch.zeros(x.shape)
    for t in range(x.shape[0]):
        for r, e in enumerate(case["topk_ids"][t].tolist()):
            h = deq(w1[e], s1[e]) @ x[t]
            act = F.silu(h[:128]) * h[128:]  # one 128-feature group: I = 128
            scale = act.abs().max() / 448
            act = (act / scale).to(torch.float8_e4m3fn).float() * scale
            y = deq(case["w2"][e], case["s2"][e]) @ act
            out[t] += y * case["topk_w"][t, r] * 2.5
    return out


def _fp8_parts(case: dict) -> torch.Tensor:
    """Each CTA's part, token by token: [tokens, routes x blocks of 128 features, hidden],
    scaled and rounded to bfloat16 as the kernel writes it (Note [AlphaMoE FP8
    accumulation])."""
    w1, s1 = case["natural"]

    def deq(w, s):
        return w.float() * s.repeat_interleave(128, -2).repeat_interleave(128, -1)

    x = case["x"].float() * case["xs"].repeat_interleave(128, -1)
    ids = case["topk_ids"]
    inter = case["w2"].shape[-1]
    parts = []
    for t in range(x.shape[0]):
        row = []
        for r, e in enumerate(ids[t].tolist()):
            h = deq(w1[e], s1[e]) @ x[t]
            act = (F.silu(h[:inter]) * h[inter:]).reshape(-1, 128)
            scale = act.abs().amax(-1, keepdim=True) / 448
            act = ((act / scale).to(torch.float8_e4m3fn).float() * scale).reshape(-1)
            w2 = deq(case["w2"][e], case["s2"][e])
            for c in range(0, inter, 128):
                part = w2[:, c : c + 128] @ act[c : c + 128] * case["topk_w"][t, r] * 2.5
                row.append(part.to(torch.bfloat16).float())
        parts.append(torch.stack(row))
    return torch.stack(parts)


def test_fp8_reference_is_the_expectation_of_the_kernels_bfloat16_adds():
    # Note [AlphaMoE FP8 accumulation]: 8 routes of 16 blocks, the 128 parts an element of a
    # DeepSeek-V3 call. The reference sums the rounded parts in float32; the kernel adds them
    # into out in bfloat16, in an order of its own, which no reference can follow.
    from fibgen.runtime.checking.compare import compare

    case = _fp8_case(seed=2, tokens=8, I=2048, K=8)
    parts = _fp8_parts(case)
    ref = _reference(calls.ALPHAMOE_FP8)(**case["args"])
    # Within one bfloat16 step of the parts' float32 sum (the order of its float32 adds).
    torch.testing.assert_close(ref.float(), parts.sum(1), atol=0, rtol=2**-7)
    g = torch.Generator().manual_seed(0)
    order = torch.argsort(torch.rand(parts.shape, generator=g), dim=1)
    kernel = torch.zeros(parts.shape[0], parts.shape[2], dtype=torch.bfloat16)
    for i in range(parts.shape[1]):
        kernel = (kernel.float() + parts.gather(1, order[:, i : i + 1]).squeeze(1)).bfloat16()
    tol = _catalogue().families["alphamoe_fp8_block_scale_aligned_moe"].tolerance
    result = compare(kernel, ref, atol=tol.atol, rtol=tol.rtol, matched=tol.matched)
    assert result.ok, result
    # bfloat16's default tolerance fails a run of the kernel, as it would FlashInfer's own.
    assert not compare(kernel, ref).ok


def test_fp8_reference_is_the_moe_of_the_plan():
    case = _fp8_case()
    got = _reference(calls.ALPHAMOE_FP8)(**case["args"])
    torch.testing.assert_close(got.float(), _fp8_by_token(case), atol=2e-2, rtol=1e-2)


def test_fp8_reference_skips_sentinels_and_subtiles_past_the_extent():
    case = _fp8_case(seed=1)
    a = case["args"]
    ref = _reference(calls.ALPHAMOE_FP8)
    full = ref(**a)
    # Entries past the valid extent, in whole subtiles of 8, are never read.
    n = a["expert_ids"].numel() * 8
    extended = dict(a)
    extended["sorted_token_ids"] = torch.cat(
        [a["sorted_token_ids"], torch.zeros(16, dtype=torch.int32)]
    )
    extended["expert_ids"] = torch.cat([a["expert_ids"], torch.tensor([3, 5], dtype=torch.int32)])
    assert torch.equal(ref(**extended), full)
    # An extent inside a subtile still runs the whole subtile; one before it drops it.
    first = dict(a, num_tokens_post_padded=torch.tensor([1], dtype=torch.int32))
    head = dict(a, sorted_token_ids=torch.where(torch.arange(n) < 8, a["sorted_token_ids"], 10))
    assert torch.equal(ref(**first), ref(**head))
    assert not ref(**dict(a, num_tokens_post_padded=torch.tensor([0], dtype=torch.int32))).any()
    # The plan is read as given: a position twice adds its contribution twice.
    seeded = dict(a, out=full)
    assert torch.allclose(ref(**seeded).float(), 2 * full.float(), atol=6e-2, rtol=2e-2)


# ---------------------------------------------------------------------------------------
# alphamoe_nvfp4_aligned_moe
# ---------------------------------------------------------------------------------------

NVFP4 = "flashinfer.fused_moe.alphamoe_nvfp4_aligned_moe"


def test_nvfp4_aligned_is_routed_into_out_and_returns_none(monkeypatch):
    call = calls.alphamoe_nvfp4_aligned(_catalogue())
    out = call.args[13]
    start = out.clone()
    outcome = _route(monkeypatch, NVFP4, call.name, call.args, call.kwargs)
    seen = _hit(outcome)
    assert outcome.result is None and seen["out"] is out
    # The definition reads the packed bytes as E2M1 pairs; the prepared panels are not read.
    assert seen["hidden_states"].dtype == torch.float4_e2m1fn_x2
    assert "w1_scale_prepared" not in seen
    assert torch.equal(out, _reference(call.name)(**{**seen, "out": start}))
    assert not torch.equal(out, start)


def test_nvfp4_aligned_with_another_block_m_falls_back(monkeypatch):
    call = calls.alphamoe_nvfp4_aligned(_catalogue())
    outcome = _route(monkeypatch, NVFP4, call.name, call.args, call.kwargs | {"block_m": 32})
    _refused(outcome, "block_m")


def _e2m1(code: int) -> float:
    """One E2M1 code, from its bits: sign, two exponent bits, one mantissa bit."""
    sign = -1.0 if code & 8 else 1.0
    exp, man = (code >> 1) & 3, code & 1
    return sign * (man * 0.5 if exp == 0 else 2.0 ** (exp - 1) * (1 + man / 2))


GRID = torch.tensor([_e2m1(c) for c in range(8)])


def _nvfp4_by_token(a: dict) -> torch.Tensor:
    """Token by token, route by route: bit-decoded values, a grid search for the requant."""
    table = torch.tensor([_e2m1(c) for c in range(16)])

    def deq(packed, scale):
        b = packed.view(torch.uint8).long()
        v = torch.stack([table[b % 16], table[b // 16]], -1).flatten(-2)
        return v * scale.float().repeat_interleave(16, -1)

    def nvfp4(v):
        out = torch.empty_like(v)
        for g in range(0, v.numel(), 16):
            block = v[g : g + 16]
            s = (block.abs().max() / 6).clamp(min=1e-8).to(torch.float8_e4m3fn).float()
            s = s if s > 0 else torch.tensor(1.0)
            dist = ((block.abs() / s).clamp(max=6)[:, None] - GRID[None]).abs()
            best = dist.min(-1, keepdim=True).values
            # Ties go to the even code.
            code = torch.where(dist == best, torch.arange(8) % 2 * 8 + torch.arange(8), 99).argmin(
                -1
            )
            out[g : g + 16] = torch.sign(block) * GRID[code] * s
        return out

    x = deq(a["hidden_states"], a["hidden_states_scale"])
    M, K = a["topk_weights"].shape
    acc = a["out"].float().clone()
    sorted_ids, experts = a["sorted_token_ids"].tolist(), a["expert_ids"].tolist()
    for i, p in enumerate(sorted_ids[: int(a["num_tokens_post_padded"][0])]):
        if p >= M * K:
            continue
        e, t = experts[i // 8], p // K
        w13 = deq(a["gemm1_weights"][e], a["gemm1_weights_scale"][e])
        h = w13 @ x[t]
        half = h.shape[0] // 2
        act = F.silu(h[:half] * a["output1_scale_gate_scalar"][e]) * (
            h[half:] * a["output1_scale_scalar"][e]
        )
        y = deq(a["gemm2_weights"][e], a["gemm2_weights_scale"][e]) @ nvfp4(act)
        acc[t] += y * a["output2_scale_scalar"][e] * a["topk_weights"][t, p % K] * 2.5
    return acc


def test_nvfp4_reference_is_the_moe_of_the_plan():
    g = torch.Generator().manual_seed(3)
    E, H, I, K, M = 8, 256, 128, 2, 5
    e4m3 = torch.float8_e4m3fn

    def packed(*shape):
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)

    def scales(*shape, lo, hi):
        return (torch.rand(shape, generator=g) * (hi - lo) + lo).to(e4m3)

    topk_ids, topk_w = routes(M, K, E, 3)
    sorted_ids, expert_ids, extent = align(topk_ids, E, 8)
    a = dict(
        hidden_states=packed(M, H // 2), hidden_states_scale=scales(M, H // 16, lo=0.25, hi=2),
        gemm1_weights=packed(E, 2 * I, H // 2),
        gemm1_weights_scale=scales(E, 2 * I, H // 16, lo=0.01, hi=0.05),
        gemm2_weights=packed(E, H, I // 2),
        gemm2_weights_scale=scales(E, H, I // 16, lo=0.01, hi=0.05),
        output1_scale_gate_scalar=torch.rand(E, generator=g) + 0.5,
        output1_scale_scalar=torch.rand(E, generator=g) + 0.5,
        output2_scale_scalar=torch.rand(E, generator=g) + 0.5,
        sorted_token_ids=sorted_ids, expert_ids=expert_ids, num_tokens_post_padded=extent,
        topk_weights=topk_w, routed_scaling_factor=2.5,
        out=torch.randn(M, H, generator=g).bfloat16(),
    )  # fmt: skip
    expected = _nvfp4_by_token(a)
    got = _reference(calls.ALPHAMOE_NVFP4)(
        **{
            **a,
            **{k: a[k].view(torch.float4_e2m1fn_x2) for k in ("gemm1_weights", "gemm2_weights")},
        },
    )
    torch.testing.assert_close(got.float(), expected, atol=3e-2, rtol=1e-2)


# ---------------------------------------------------------------------------------------
# alphamoe_nvfp4_routed_moe
# ---------------------------------------------------------------------------------------

NVFP4_ROUTED = "flashinfer.fused_moe.alphamoe_nvfp4_routed_moe"


def test_nvfp4_routed_adds_into_out_and_returns_it(monkeypatch):
    call = calls.alphamoe_nvfp4_routed(_catalogue())
    out = call.args[13]
    start = out.clone()
    outcome = _route(monkeypatch, NVFP4_ROUTED, call.name, call.args, call.kwargs)
    seen = _hit(outcome)
    assert outcome.result is out
    assert not any(k in seen for k in ("sorted_token_ids", "cumsum_buffer", "block_m"))
    assert torch.equal(out, _reference(call.name)(**{**seen, "out": start}))
    assert not torch.equal(out, start)


def test_nvfp4_routed_that_overwrites_out_falls_back(monkeypatch):
    call = calls.alphamoe_nvfp4_routed(_catalogue())
    kwargs = call.kwargs | {"accumulate": False}
    _refused(_route(monkeypatch, NVFP4_ROUTED, call.name, call.args, kwargs), "accumulate")


def test_nvfp4_routed_reference_is_the_aligned_one_over_the_plan_of_its_routes():
    x, _ = _catalogue().inputs(calls.ALPHAMOE_NVFP4_ROUTED, num_tokens=6)
    sorted_ids, expert_ids, extent = align(x["topk_ids"], 8, 8)
    routed = _reference(calls.ALPHAMOE_NVFP4_ROUTED)(**x)
    aligned_inputs = {k: v for k, v in x.items() if k != "topk_ids"}
    aligned = _reference(calls.ALPHAMOE_NVFP4)(
        **aligned_inputs,
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=extent,
    )
    assert not torch.equal(routed, x["out"])
    torch.testing.assert_close(routed, aligned, atol=0, rtol=1e-2)


def _with(call, path: str, **values) -> tuple:
    """The call's positional arguments with some replaced, by parameter name."""
    args = list(call.args)
    for name, value in values.items():
        args[_index(path, name)] = value
    return tuple(args)


@pytest.mark.parametrize("path", [FP8, NVFP4])
def test_aligned_plans_with_an_expert_not_of_this_rank_fall_back(monkeypatch, path):
    # vLLM and SGLang write -1 for an expert of another rank; FlashInfer's kernels index
    # weights and scales by it unguarded, so the definition (expert E-1) cannot stand for it.
    call = (calls.alphamoe_fp8_aligned if path == FP8 else calls.alphamoe_nvfp4_aligned)(
        _catalogue()
    )
    expert_ids = call.args[_index(path, "expert_ids")]
    ntpp = call.args[_index(path, "num_tokens_post_padded")]
    assert expert_ids.numel() > 1
    ids = expert_ids.clone()
    ids[0] = -1
    outcome = _route(monkeypatch, path, call.name, _with(call, path, expert_ids=ids), call.kwargs)
    rules = outcome.counts["rules"]
    assert outcome.counts["hit"] == 0 and "expert_ids" in next(iter(rules)), rules
    # With one live block (8 plan entries) a -1 past it is never read: routed.
    ids = expert_ids.clone()
    ids[1] = -1
    one_block = _with(call, path, expert_ids=ids, num_tokens_post_padded=torch.full_like(ntpp, 8))
    _hit(_route(monkeypatch, path, call.name, one_block, call.kwargs))


def _index(path: str, name: str) -> int:
    import inspect

    owner, attr = patching._locate(path)
    return list(inspect.signature(getattr(owner, attr)).parameters).index(name)


def test_nvfp4_routed_with_an_expert_not_of_this_rank_falls_back(monkeypatch):
    # FlashInfer bins an id of -1 as no expert; the reference would compute expert E-1.
    call = calls.alphamoe_nvfp4_routed(_catalogue())
    ids = call.args[_index(NVFP4_ROUTED, "topk_ids")].clone()
    ids[0, 0] = -1
    outcome = _route(
        monkeypatch, NVFP4_ROUTED, call.name, _with(call, NVFP4_ROUTED, topk_ids=ids), call.kwargs
    )
    rules = outcome.counts["rules"]
    assert outcome.counts["hit"] == 0 and "topk_ids" in next(iter(rules)), rules


def test_fp8_aligned_with_a_strided_operand_falls_back(monkeypatch):
    # FlashInfer's binding refuses strided weights, scales and plan tensors.
    call = calls.alphamoe_fp8_aligned(_catalogue())
    scale = call.args[_index(FP8, "hidden_states_scale")]
    args = _with(call, FP8, hidden_states_scale=strided(scale))
    outcome = _route(monkeypatch, FP8, call.name, args, call.kwargs)
    rules = outcome.counts["rules"]
    assert outcome.counts["hit"] == 0 and "hidden_states_scale" in next(iter(rules)), rules


@pytest.mark.parametrize("change", ["two tokens", "block_m 32", "strided ids"])
def test_nvfp4_routed_routes_only_the_shapes_flashinfer_runs(monkeypatch, change):
    # FlashInfer's routed companion serves 1 or 8 tokens of 8 experts among 256 or 512,
    # plan blocks of 8 or 16, and contiguous topk_ids; it raises for the rest.
    call = calls.alphamoe_nvfp4_routed(_catalogue())
    kwargs = dict(call.kwargs)
    ids = call.args[_index(NVFP4_ROUTED, "topk_ids")]
    if change == "two tokens":  # the token repeated: every per-token tensor twice
        per_token = ("hidden_states", "hidden_states_scale", "topk_weights", "out", "topk_ids")
        values = {
            name: call.args[_index(NVFP4_ROUTED, name)].expand(2, -1).contiguous()
            for name in per_token
        }
        args, rule = _with(call, NVFP4_ROUTED, **values), "topk_ids,gemm1_weights"
    elif change == "block_m 32":
        args, rule = call.args, "block_m"
        kwargs["block_m"] = 32
    else:
        args, rule = _with(call, NVFP4_ROUTED, topk_ids=strided(ids)), "topk_ids,out"
    outcome = _route(monkeypatch, NVFP4_ROUTED, call.name, args, kwargs)
    _refused(outcome, rule)


def test_fp8_aligned_falls_back_inside_graph_capture_without_reading_its_plan(monkeypatch):
    # Its expert-range rule reads the plan on the host, which capture forbids (Note [data
    # rules in capture]): inside capture the call goes to FlashInfer, counted by the rule.
    from fibgen.runtime.launch import capture

    call = calls.alphamoe_fp8_aligned(_catalogue())
    _hit(_route(monkeypatch, FP8, call.name, call.args, call.kwargs))
    monkeypatch.setattr(capture, "is_capturing", lambda: True)
    outcome = _route(monkeypatch, FP8, call.name, call.args, call.kwargs)
    rules = outcome.counts["rules"]
    assert outcome.counts["hit"] == 0 and "expert_ids" in next(iter(rules)), rules
