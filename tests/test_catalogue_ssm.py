"""The state-space and linear-attention families of ssm_gdn.fidef, ssm_linear.fidef and
ssm_kda.fidef (and the gdn.fidef rules they share), and mHC's of mhc.fidef, held to the real FlashInfer 0.7.2 on the CPU.

References: each family's reference against FlashInfer's own template reference
(``flashinfer.trace.templates.gdn``, ``gdn2``, ``gdp``) on small inputs, or, where the
template computes something else than the kernel, against a template reference fed the
kernel's meaning (noted at each test).

Routing: FlashInfer's functions are called with apply on and a solution that records what
it is given. A call giving every parameter at accepted values reaches the solution; each
value the definition does not model is refused, counted with its rule, and goes to FlashInfer
itself, whose kernels raise on this CPU.
"""

from __future__ import annotations

import functools
import math
import importlib
import warnings
from pathlib import Path

import pytest
import torch

from _shared import require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _routable_calls as routable  # noqa: E402
from flashinfer.trace.templates import gdn as fi_gdn  # noqa: E402
from flashinfer.trace.templates import gdn2 as fi_gdn2  # noqa: E402
from flashinfer.trace.templates import gdp as fi_gdp  # noqa: E402

import fibgen.runtime as rt  # noqa: E402
from fibgen.compiler import compile_paths  # noqa: E402
from fibgen.runtime.routing import patching  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FILES = ("ssm_gdn.fidef", "ssm_linear.fidef", "ssm_kda.fidef", "mhc.fidef", "gdn.fidef")
FILES += ("mamba.fidef",)
# Slow as a whole: state-space calls through the real FlashInfer's API.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning"),
]


@functools.cache
def _module():
    result = compile_paths([str(ROOT / "definitions" / f) for f in FILES])
    assert result.ok, "the state-space definitions do not compile"
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


def _inputs(name, seed=0, **axes):
    x, _ = _catalogue().inputs(name, seed=seed, **axes)
    return x


def _close(a, b, atol=2e-2, rtol=2e-2):
    assert a.shape == b.shape, (a.shape, b.shape)
    torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------
# References against FlashInfer's template references
# ---------------------------------------------------------------------------------------

PREFILL_AXES = {"total_seq_len": 7, "num_seqs": 2, "len_cu_seqlens": 3}


def test_chunk_prefill_reference_is_flashinfers_delta_product_with_one_householder():
    # FlashInfer's gdn prefill template computes the gates from A_log/a/dt_bias, which
    # chunk_gated_delta_rule never takes; its DeltaProduct template with one Householder
    # row per token is the same recurrence on given gates (gdp_prefill's docstring).
    name = "gdn_prefill_qk4_v8_d128"
    x = _inputs(name, **PREFILL_AXES)
    assert x["state"] is not None
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], x["cu_seqlens"], 0.1)
    out, state = _reference(name)(*args)
    theirs = fi_gdp._gdp_prefill_reference(*args, num_householder=1)
    _close(out, theirs[0]), _close(state, theirs[1], atol=1e-4, rtol=1e-4)
    # Without an initial state the sequences start from zeros.
    out0, _ = _reference(name)(*args[:5], None, *args[6:])
    assert not torch.equal(out0, out)
    _close(out0, fi_gdp._gdp_prefill_reference(*args[:5], None, *args[6:], 1)[0])


def test_delta_product_reference_is_flashinfers_template():
    name = "gdp_prefill_n2_qk4_v8_d128"
    x = _inputs(name, expanded_seq_len=14, **PREFILL_AXES)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], x["cu_seqlens"])
    out, state = _reference(name)(*args, 0.125)
    theirs = fi_gdp._gdp_prefill_reference(*args, 0.125, num_householder=2)
    _close(out, theirs[0]), _close(state, theirs[1], atol=1e-4, rtol=1e-4)


def test_gdn2_reference_decays_by_exp_g_as_the_docstring_says():
    # The docstring: g is the log decay, the state decays by exp(g). FlashInfer's template
    # multiplies by g itself; fed exp(g), it computes the kernel's recurrence.
    name = "gdn2_prefill_qk4_v8_d128"
    x = _inputs(name, **PREFILL_AXES)
    args = [x[k] for k in ("q", "k", "v", "g", "beta", "w", "initial_state", "cu_seqlens")]
    out, state = _reference(name)(*args, 0.09)
    args[3] = x["g"].exp()
    theirs = fi_gdn2._gdn2_prefill_reference(*args, 0.09)
    _close(out, theirs[0]), _close(state, theirs[1], atol=1e-4, rtol=1e-4)


def test_decode_pool_reference_is_the_per_sequence_decode_at_each_slot():
    name = "gdn_decode_pool_qk4_v8_d128"
    x = _inputs(name, batch_size=3, pool_size=5)
    slots = torch.tensor([3, -1, 0], dtype=torch.int32)  # row 1 is padding
    args = [x[k] for k in ("q", "k", "v", "pool")] + [slots]
    args += [x[k] for k in ("A_log", "a", "dt_bias", "b")]
    out, pool = _reference(name)(*args, None)
    gathered = x["pool"][slots.clamp(min=0).long()]
    theirs_out, theirs_state = fi_gdn._gdn_decode_reference(
        x["q"], x["k"], x["v"], gathered, x["A_log"], x["a"], x["dt_bias"], x["b"], None
    )
    for row, slot in ((0, 3), (2, 0)):
        _close(out[row], theirs_out[row])
        _close(pool[slot], theirs_state[row], atol=1e-4, rtol=1e-4)
    assert not out[1].any()  # a padded row's output is zero
    for slot in (1, 2, 4):  # slots no live row names are left as they were
        assert torch.equal(pool[slot], x["pool"][slot])


def test_replayssm_commit_reference_is_flashinfers_template_with_tracking():
    name = "gdn_replayssm_commit_k4_v8_d128"
    x = _inputs(name, num_layers=2, pool_size=6, batch_size=3, seq_len=4)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)  # slot 0 is at null_block_id: skipped
    accept = torch.tensor([3, 2, 0], dtype=torch.int32)  # slot 2 accepts nothing
    track, steps = torch.tensor([5, 1, 3], dtype=torch.int32), torch.tensor(
        [1, 0, 0], dtype=torch.int32
    )
    names = ("checkpoint_state", "rawv_cache", "rawk_cache", "g_cache", "beta_cache")
    caches = [x[k] for k in names]
    ours = _reference(name)(*caches, slots, accept, track, steps, 0)
    theirs = caches[0].clone()
    fi_gdn._gdn_replayssm_commit_reference(
        theirs, *caches[1:], slots, accept,
        track_state_indices=track, track_steps=steps, null_block_id=0,
    )  # fmt: skip
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert not torch.equal(ours[:, 4], caches[0][:, 4]) and not torch.equal(
        ours[:, 5], caches[0][:, 5]
    )
    for slot in (0, 1, 2, 3):
        assert torch.equal(ours[:, slot], caches[0][:, slot])


def test_fused_decode_reference_is_flashinfers_template():
    name = "gdn_fused_decode_h2048_v16_d128"
    x = _inputs(name, batch_size=3, num_pages=5)
    slots = torch.tensor([4, -1, 1], dtype=torch.int32)
    names = ("hidden_states", "w_ba", "mixed_qkv", "conv_weight", "conv_bias", "conv_state")
    names += ("A_log", "dt_bias", "scale", "ssm_state")
    args = [x[k] for k in names]
    out, conv, ssm = _reference(name)(*args, slots)
    live = torch.tensor([4, 1], dtype=torch.int32)
    rows = [0, 2]
    t_conv, t_ssm = x["conv_state"].clone(), x["ssm_state"].clone()
    t_args = [a[rows] if n in ("hidden_states", "mixed_qkv") else a for n, a in zip(names, args)]
    t_args[5], t_args[9] = t_conv, t_ssm
    t_out, _, _ = fi_gdn._gdn_fused_decode_reference(*t_args, live)
    _close(out[rows], t_out)
    assert torch.equal(conv, t_conv)
    torch.testing.assert_close(ssm, t_ssm, atol=1e-5, rtol=1e-5)
    assert not out[1].any()


def test_kda_reference_is_flashinfers_fp32_oracle_on_the_gates_it_computes():
    # FlashInfer's KDA templates carry no reference; its b12x package holds the fp32 token
    # recurrence the kernels are tested against, which computes the gates from raw inputs.
    # Fed the gates it computes, rounded to bfloat16 as the API takes them, ours agrees.
    from flashinfer.experimental.b12x.sequence._shared.kda_math import kda_log_decay
    from flashinfer.experimental.b12x.sequence.kda_prefill import reference as oracle

    gen = torch.Generator().manual_seed(3)
    T, H, D = 5, 4, 128
    q, k, v, raw_g = (torch.randn(T, H, D, generator=gen).to(torch.bfloat16) for _ in range(4))
    raw_beta = torch.randn(T, H, generator=gen).to(torch.bfloat16)
    A_log, dt_bias = torch.randn(H, generator=gen), torch.randn(H, D, generator=gen)
    state = (torch.randn(H, D, D, generator=gen) * 0.1).to(torch.bfloat16)
    want_out, want_state, _ = oracle.recurrent_kda(
        q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound=-5.0, initial_state=state
    )
    g = kda_log_decay(raw_g, dt_bias, A_log, -5.0).to(torch.bfloat16)
    beta = torch.sigmoid(raw_beta.float()).to(torch.bfloat16)
    l2 = lambda x: (x.float() * torch.rsqrt(x.float().square().sum(-1, keepdim=True) + 1e-6))
    for name in ("recurrent_kda_q4_v4_d128", "recurrent_kda_decode_q4_v4_d128"):
        steps = T if "decode" not in name else 1
        out, new_state = _reference(name)(
            l2(q[:steps])[None].to(torch.bfloat16), l2(k[:steps])[None].to(torch.bfloat16),
            v[None, :steps], g[None, :steps], beta[None, :steps], state[None], D**-0.5,
        )  # fmt: skip
        if steps == T:
            _close(out[0], want_out, atol=3e-2)
            _close(new_state[0], want_state, atol=3e-2)
            assert new_state.dtype == torch.bfloat16
    # One step of the decode facade is the first step of the recurrence.
    first, _, _ = oracle.recurrent_kda(
        q[:1], k[:1], v[:1], raw_g[:1], raw_beta[:1], A_log, dt_bias,
        lower_bound=-5.0, initial_state=state,
    )  # fmt: skip
    _close(out[0], first, atol=3e-2)


def test_packed_kda_reference_is_flashinfers_fp32_oracle_row_by_row():
    # The oracle computes the gates from the raw logits as the packed kernel does (lower
    # bound -5, its docstring's fixed contract); one token of one sequence per row.
    from flashinfer.experimental.b12x.sequence.kda_prefill import reference as oracle

    name = "packed_kda_decode_h12_d128"
    x = _inputs(name, seed=4, batch_size=3, pool_size=5)
    x["state_indices"] = torch.tensor([3, -1, 0], dtype=torch.int32)  # row 1: padding
    names = ("mixed_qkv", "raw_gate", "raw_beta", "A_log", "dt_bias", "state", "state_indices")
    out, new_state = _reference(name)(*(x[k] for k in names))
    q, k, v = x["mixed_qkv"].view(3, 3, 12, 128).unbind(1)
    for row, slot in ((0, 3), (2, 0)):
        want_out, want_state, _ = oracle.recurrent_kda(
            q[row : row + 1], k[row : row + 1], v[row : row + 1],
            x["raw_gate"][row].view(1, 12, 128), x["raw_beta"][row : row + 1],
            x["A_log"], x["dt_bias"].view(12, 128), lower_bound=-5.0,
            initial_state=x["state"][slot],
        )  # fmt: skip
        _close(out[row, 0], want_out[0], atol=1e-2)
        _close(new_state[slot], want_state.to(torch.bfloat16), atol=1e-2)
    assert not out[1].any()  # the padding row: zeros, and the slots no row names unchanged
    for slot in (1, 2, 4):
        assert torch.equal(new_state[slot], x["state"][slot])
    assert out.shape == (3, 1, 12, 128) and new_state.dtype == torch.bfloat16


def test_fused_kda_reference_is_a_convolution_then_flashinfers_fp32_oracle_then_a_gated_norm():
    from flashinfer.experimental.b12x.sequence.kda_prefill import reference as oracle

    name = "fused_kda_decode_h8_d128"
    x = _inputs(name, seed=5, num_rows=3, num_slots=5)
    x["state_indices"] = torch.tensor([3, 0, 1], dtype=torch.int32)  # row 1: the null slot
    names = ("x", "weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias")
    names += ("state_indices", "state", "output_gate", "norm_weight")
    args = [x[k] for k in names]
    out, conv, state = _reference(name)(*args, -5.0, 1e-5)
    H, D = 8, 128
    for row, slot in ((0, 3), (2, 1)):
        # The causal convolution of each channel over its three cached inputs and this one.
        window = torch.cat([x["conv_state"][slot], x["x"][row][:, None]], dim=1).float()
        taps = x["weight"].permute(0, 2, 1).reshape(3 * H * D, 1, 4)
        acc = torch.nn.functional.conv1d(window[None], taps, groups=3 * H * D)[0, :, 0]
        mixed = torch.nn.functional.silu(acc).to(torch.bfloat16)
        assert torch.equal(conv[slot], window[:, 1:].to(torch.bfloat16))
        q, k, v = mixed.view(3, 1, H, D).unbind(0)
        o, want_state, _ = oracle.recurrent_kda(
            q, k, v, x["raw_gate"][0, row : row + 1], x["raw_beta"][0, row : row + 1],
            x["A_log"], x["dt_bias"].view(H, D), lower_bound=-5.0,
            initial_state=x["state"][slot],
        )  # fmt: skip
        torch.testing.assert_close(state[slot], want_state, atol=2e-3, rtol=1e-3)
        o = o[0].float()
        gated = torch.sigmoid(x["output_gate"][row].float()) * x["norm_weight"]
        want = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + 1e-5) * gated
        _close(out[0, row], want.to(torch.bfloat16), atol=2e-2)
    assert not out[0, 1].any()  # the null row: zeros, and slot 0 (and 2, 4) untouched
    for slot in (0, 2, 4):
        assert torch.equal(conv[slot], x["conv_state"][slot])
        assert torch.equal(state[slot], x["state"][slot])
    # Without a bound the decay is -exp(A_log) * softplus(raw_gate + dt_bias).
    _, _, soft = _reference(name)(*args, float("nan"), 1e-5)
    _, _, bounded = _reference(name)(*args, -5.0, 1e-5)
    assert not torch.allclose(soft[3], bounded[3])
    pre = x["raw_gate"][0, 0].float() + x["dt_bias"].view(H, D)
    decay = torch.exp(-torch.exp(x["A_log"])[:, None] * torch.nn.functional.softplus(pre))
    zero_beta = list(args)
    zero_beta[4] = torch.full_like(x["raw_beta"], -1e4)  # beta = 0: only the decay acts
    _, _, decayed = _reference(name)(*zero_beta, float("nan"), 1e-5)
    torch.testing.assert_close(decayed[3], x["state"][3] * decay[:, None, :])


def _segsum(a):
    """segsum[..., i, j] = a[..., j + 1] + ... + a[..., i] for i >= j, -inf above."""
    t = a.shape[-1]
    cum = torch.cumsum(a, dim=-1)
    out = cum[..., :, None] - cum[..., None, :]
    return out.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))


def _ssd_chunked(x, a, b, c, initial, chunk):
    """Mamba-2's chunked SSD (the "minimal" form of its paper, the algorithm of FlashInfer's
    kernel): x and a already multiplied by dt, b and c per head; returns y and the state."""
    bs, length, h, p = x.shape
    n = b.shape[-1]
    split = lambda t: t.reshape(bs, length // chunk, chunk, *t.shape[2:])  # noqa: E731
    x, b, c = split(x), split(b), split(c)
    a = split(a).permute(0, 3, 1, 2)  # [b, h, chunks, chunk]
    a_cum = torch.cumsum(a, dim=-1)
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", c, b, torch.exp(_segsum(a)), x)
    decay_states = torch.exp(a_cum[..., -1:] - a_cum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", b, decay_states, x)
    states = torch.cat([initial[:, None], states], dim=1)
    decay_chunk = torch.exp(_segsum(torch.nn.functional.pad(a_cum[..., -1], (1, 0))))
    new_states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
    states, final = new_states[:, :-1], new_states[:, -1]
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", c, states, torch.exp(a_cum))
    return (y_diag + y_off).reshape(bs, length, h, p), final


def test_ssd_combined_reference_is_mamba2s_chunked_scan():
    name = "mamba_ssd_combined_h64_d64_s128_ng4"
    x = _inputs(name, seed=7, batch_size=2, seqlen=256)
    names = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias")
    y, final = _reference(name)(*(x[k] for k in names), True, 0.0, 0.5, x["initial_states"])
    dt = torch.nn.functional.softplus(x["dt"].float() + x["dt_bias"]).clamp(0.0, 0.5)
    heads = lambda t: t.float().repeat_interleave(16, dim=2)  # noqa: E731  (64 heads, 4 groups)
    want_y, want_final = _ssd_chunked(
        x["x"].float() * dt[..., None], dt * x["A"], heads(x["B"]), heads(x["C"]),
        x["initial_states"].float(), chunk=128,
    )  # fmt: skip
    want_y = (want_y + x["D"].float()[:, None] * x["x"].float()) * torch.nn.functional.silu(
        x["z"].float()
    )
    _close(y, want_y.bfloat16(), atol=3e-2)
    _close(final, want_final.bfloat16(), atol=3e-2)
    # Without D, z, dt_bias, a limit and an initial state: the plain scan from zeros.
    plain, _ = _reference(name)(
        *(x[k] for k in names[:5]), None, None, None, True, 0.0, float("inf"), None
    )
    dt = torch.nn.functional.softplus(x["dt"].float())
    want, _ = _ssd_chunked(
        x["x"].float() * dt[..., None], dt * x["A"], heads(x["B"]), heads(x["C"]),
        torch.zeros(2, 64, 64, 128), chunk=128,
    )  # fmt: skip
    _close(plain, want.bfloat16(), atol=3e-2)


def test_mhc_post_reference_is_flashinfers_test_oracle_and_its_docstrings_sum():
    from flashinfer.experimental.b12x.testing.mhc import post_reference

    x = _inputs("mhc_post_hc4_h4096", num_tokens=3)
    args = (x["x"], x["residual"], x["post_layer_mix"], x["comb_res_mix"])
    ours = _reference("mhc_post_hc4_h4096")(*args)
    _close(ours, post_reference(*args), atol=1e-2)
    # The docstring's formula, one new stream at a time, in float64.
    for new in range(4):
        want = x["x"].double() * x["post_layer_mix"][:, new, None].double()
        for old in range(4):
            want += x["residual"][:, old].double() * x["comb_res_mix"][:, old, new, None].double()
        _close(ours[:, new], want, atol=1e-2)


def _mhc_oracle_case(hidden_size=4096, tokens=3):
    """FlashInfer's mHC test inputs, and the pre map of its test oracle on them; with the
    projection logits and square sums the big-fuse kernels take computed from them."""
    from flashinfer.experimental.b12x.testing.mhc import make_inputs, pre_reference

    residual, _, fn, scale, bias = make_inputs(
        tokens=tokens, hidden_size=hidden_size, seed=0, device=torch.device("cpu")
    )
    want = pre_reference(
        residual, fn, scale, bias, rms_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20
    )  # fmt: skip
    flat = residual.flatten(1).float()
    dot_mix = torch.nn.functional.linear(flat, fn)
    return residual, dot_mix, flat.square().sum(-1), scale, bias, want


def test_mhc_pre_big_fuse_references_are_flashinfers_test_oracle_after_its_projection():
    residual, dot_mix, sqrsum, scale, bias, (y, post, comb) = _mhc_oracle_case()
    eps = (1e-6, 1e-6, 1e-6)
    # The oracle's post map is 2 * sigmoid: the kernel's mhc_post_mult_value = 2.
    ours = _reference("mhc_pre_big_fuse_hc4_h4096_mix24")(
        dot_mix, sqrsum, residual, scale, bias, 4 * 4096, *eps, 2.0, 20
    )
    prenorm = _reference("mhc_pre_big_fuse_with_prenorm_hc4_h4096_mix24")(
        dot_mix, residual, scale, bias, *eps, 2.0, 20
    )
    for post_mix, comb_mix, layer_input in (ours, prenorm):
        assert post_mix.shape == (3, 4, 1) and post_mix.dtype == torch.float32
        _close(post_mix[..., 0], post, atol=1e-5, rtol=1e-5)
        _close(comb_mix, comb, atol=1e-5, rtol=1e-5)
        assert layer_input.dtype == torch.bfloat16
        _close(layer_input, y, atol=1e-2)
    # Sinkhorn: after 20 rounds the comb matrix is doubly stochastic.
    _close(ours[1].sum(-1), torch.ones(3, 4), atol=1e-3)
    _close(ours[1].sum(-2), torch.ones(3, 4), atol=1e-3)
    # k is what sqrsum is divided by: another k is another RMS scaling of the logits.
    other = _reference("mhc_pre_big_fuse_hc4_h4096_mix24")(
        dot_mix, sqrsum, residual, scale, bias, 4096, *eps, 2.0, 20
    )
    assert not torch.allclose(other[0], ours[0])
    # One Sinkhorn round is a softmax over each row, then columns divided by their sums.
    one = _reference("mhc_pre_big_fuse_hc4_h4096_mix24")(
        dot_mix, sqrsum, residual, scale, bias, 4 * 4096, 0.0, 0.0, 0.0, 1.0, 1
    )
    rstd = torch.rsqrt(sqrsum / (4 * 4096))[:, None]
    soft = torch.softmax((dot_mix[:, 8:] * rstd * scale[2] + bias[8:]).view(-1, 4, 4), dim=-1)
    _close(one[1], soft / soft.sum(-2, keepdim=True), atol=1e-6, rtol=1e-5)
    _close(one[0][..., 0], torch.sigmoid(dot_mix[:, 4:8] * rstd * scale[1] + bias[4:8]))


# ---------------------------------------------------------------------------------------
# Routing of FlashInfer's functions
# ---------------------------------------------------------------------------------------


def _recorder(name, seen):
    def solution(**inputs):
        seen.append(inputs)
        return _reference(name)(**inputs)

    return solution


def _call(path, args, kwargs):
    owner, attr = patching._locate(path)
    return getattr(owner, attr)(*args, **kwargs)


def _route(path, overrides_and_rules, fallback_runs=False):
    """The routable call of ``path`` with FlashInfer's values, then with each override: the
    first is routed to the definition; each override is refused with its rule, and FlashInfer
    itself runs it (raising on this CPU, unless ``fallback_runs``: it has a torch path)."""
    call = routable.ROUTABLE[path](_catalogue())
    seen: list = []
    with rt.enable_apply({call.name: _recorder(call.name, seen)}):
        result = _call(path, call.args, call.kwargs)
        assert len(seen) == 1, rt.stats()[path]
        for overrides, _rule in overrides_and_rules:
            args, kwargs = list(call.args), dict(call.kwargs)
            for key, value in overrides.items():
                if isinstance(key, int):
                    args[key] = value
                else:
                    kwargs[key] = value
            if fallback_runs:
                _call(path, args, kwargs)
            else:
                with pytest.raises(
                    (RuntimeError, ValueError, TypeError, AssertionError, ImportError)
                ):
                    _call(path, args, kwargs)
            assert len(seen) == 1, overrides
    counts = rt.stats()[path]
    assert counts["hit"] == 1
    rules = [r for _, r in overrides_and_rules]
    assert counts.get("rules", {}) == {r: rules.count(r) for r in rules}, counts
    return call, seen[0], result


def test_chunk_prefill_routes_given_gates_and_refuses_pools_and_checkpoints():
    path = "flashinfer.gdn_prefill.chunk_gated_delta_rule"
    call, seen, (out, state) = _route(
        path,
        [
            ({7: False}, "output_final_state"),
            ({"state_indices": torch.zeros(2, dtype=torch.int32)}, "state_indices"),
            ({"checkpoint_every_n_tokens": 4}, "checkpoint_every_n_tokens"),
        ],
    )
    # use_qk_l2norm_in_kernel=True: the solution gets unit-norm keys; the scale is the caller's.
    assert torch.allclose(seen["k"].float().norm(dim=-1), torch.ones(5, 4), atol=1e-2)
    assert seen["scale"] == call.args[5] and seen["cu_seqlens"].dtype == torch.int64
    assert out is call.kwargs["output"] and state is call.kwargs["output_state"]
    assert out.any() and state.any()


def test_chunk_prefill_without_gates_or_scale_gets_ones_and_the_default_scale():
    path = "flashinfer.gdn_prefill.chunk_gated_delta_rule"
    call = routable.ROUTABLE[path](_catalogue())
    seen: list = []
    q = call.args[0]
    with rt.enable_apply({call.name: _recorder(call.name, seen)}):
        _call(
            path,
            (q, *call.args[1:3]),
            {"cu_seqlens": call.kwargs["cu_seqlens"], "output_final_state": True},
        )
    assert torch.equal(seen[0]["g"], torch.ones(5, 8)) and torch.equal(
        seen[0]["beta"], torch.ones(5, 8)
    )
    assert seen[0]["scale"] == pytest.approx(128**-0.5) and seen[0]["state"] is None


def test_decode_pool_routes_the_pool_and_refuses_a_per_sequence_state():
    path = "flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose"
    # The routable call is made from seeded inputs: a second one holds the pool as it was.
    pool_before = routable.ROUTABLE[path](_catalogue()).kwargs["initial_state"]
    call, seen, (out, pool) = _route(
        path,
        [
            ({3: torch.zeros(2, 8, 128, 128)}, "state"),
            ({"output_state_indices": torch.zeros(2, dtype=torch.int32)}, "output_state_indices"),
            ({"disable_state_update": True}, "disable_state_update"),
        ],
    )
    assert pool is call.kwargs["initial_state"] and out is call.kwargs["output"]
    assert torch.equal(seen["slots"], call.kwargs["initial_state_indices"])
    written = call.kwargs["initial_state_indices"].long()
    assert not torch.equal(pool[written], pool_before[written])


def test_mtp_with_an_intermediate_states_buffer_goes_to_flashinfer():
    path = "flashinfer.gdn_decode.gated_delta_rule_mtp"
    x, _ = _catalogue().inputs("gdn_mtp_qk4_v8_d128_k_last", batch_size=2, seq_len=3, pool_size=4)
    assert x["intermediate_states_buffer"] is not None
    _route(
        path,
        [
            (
                {"intermediate_states_buffer": x["intermediate_states_buffer"]},
                "intermediate_states_buffer",
            )
        ],
    )


def test_gdn_decode_hands_its_k_major_state_over_as_the_v_major_view():
    path = "flashinfer.gdn_decode.gated_delta_rule_decode"
    call = routable.ROUTABLE[path](_catalogue())
    state = call.args[3]
    seen: list = []
    with rt.enable_apply({call.name: _recorder(call.name, seen)}):
        _call(path, call.args, call.kwargs)
    assert torch.equal(seen[0]["state"], state.transpose(-1, -2))


def test_replayssm_commit_writes_the_checkpoints_in_place_and_refuses_raw_keys():
    path = "flashinfer.gdn_decode.gated_delta_rule_replayssm_commit"
    before = routable.ROUTABLE[path](_catalogue()).args[0]
    call, _, result = _route(path, [({"use_qk_l2norm": False}, "use_qk_l2norm")])
    assert result is None
    expected = _reference(call.name)(before, *call.args[1:], None, None, -1)
    torch.testing.assert_close(call.args[0], expected)


def test_fused_decode_updates_both_pools_and_refuses_raw_keys():
    path = "flashinfer.gdn_kernels.experimental.gdn_fused_decode.gdn_fused_decode_step"
    call, _, (out, conv, ssm) = _route(
        path, [({"use_qk_l2norm": False}, "use_qk_l2norm")], fallback_runs=True
    )
    assert out is call.kwargs["out"] and conv is call.args[5] and ssm is call.args[9]
    assert out.any()


@pytest.mark.parametrize(
    "path",
    [
        "flashinfer.gdn2_prefill.chunk_gated_delta_rule2",
        "flashinfer.gdp_prefill.chunk_gated_delta_product",
    ],
)
def test_cudnn_prefills_route_and_refuse_the_output_alone(path):
    key = 7 if "rule2" in path else 8
    call, seen, (out, state) = _route(
        path, [({key if "product" in path else "output_final_state": False}, "output_final_state")]
    )
    assert out is call.kwargs["output"] and state is call.kwargs["output_state"]
    assert out.any() and state.any()


@pytest.mark.parametrize("module", ["kda", "kda_decode"])
def test_kda_updates_the_callers_state_in_place_and_refuses_what_it_does_not_model(module):
    path = f"flashinfer.{module}.recurrent_kda"
    before = routable.ROUTABLE[path](_catalogue()).kwargs["initial_state"]
    strided = before.transpose(-1, -2).contiguous().transpose(-1, -2)
    refusals = [
        ({"use_gate_in_kernel": True}, "use_gate_in_kernel"),
        ({"beta_is_logit": True}, "beta_is_logit"),
        ({"output_final_state": False}, "output_final_state"),
        ({"initial_state": None}, "initial_state"),
        ({"num_spec_tokens": 2}, "num_spec_tokens"),
        # What FlashInfer refuses with given gates: a bound, a dt_bias not in float32, a
        # strided state (its update would be lost), a backend that needs the in-kernel gate.
        ({"lower_bound": -5.0}, "lower_bound"),
        ({"dt_bias": torch.zeros(4 * 128, dtype=torch.bfloat16)}, "dt_bias"),
        ({"initial_state": strided}, "initial_state"),
        ({"backend": "tirx" if module == "kda" else "cudnn"}, "backend,A_log,dt_bias"),
    ]
    if module == "kda":
        refusals.append(({"checkpoint_every_n_tokens": 64}, "checkpoint_every_n_tokens"))
        refusals.append(({"prefill_workspace": torch.empty(8)}, "prefill_workspace"))
    call, seen, (out, state) = _route(path, refusals)
    assert out is call.kwargs["output"] and state is call.kwargs["initial_state"]
    assert not torch.equal(state, before) and state.dtype == torch.bfloat16
    # The default l2 normalization reaches the solution as unit-norm keys.
    norms = seen["k"].float().norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2)
    expected = _reference(call.name)(
        *(seen[n] for n in ("q", "k", "v", "g", "beta")), before, seen["scale"]
    )
    assert torch.equal(out, expected[0]) and torch.equal(state, expected[1])


def test_packed_kda_routes_into_the_callers_pool_and_leaves_a_strided_A_log_to_flashinfer():
    path = "flashinfer.kda_decode.packed_kda_decode"
    a_log = routable.ROUTABLE[path](_catalogue()).args[3]
    strided = torch.stack([a_log, a_log], dim=1)[:, 0]
    assert not strided.is_contiguous()
    before = routable.ROUTABLE[path](_catalogue()).args[5]  # the same seed: the same pool
    call, seen, out = _route(
        path,
        [
            ({3: strided}, "A_log,dt_bias,state_indices"),
            ({5: before.float()}, "tensor:state"),  # a float32 pool is another kernel
        ],
    )
    want_out, want_state = _reference(call.name)(**{**seen, "state": before})
    assert out is call.kwargs["output"] and torch.equal(out, want_out)
    assert torch.equal(call.args[5], want_state) and not torch.equal(before, want_state)


def test_fused_kda_routes_the_softplus_gate_and_leaves_repeated_slots_to_flashinfer():
    path = "flashinfer.kda_decode.fused_kda_decode"
    call, seen, out = _route(
        path,
        [
            ({"state_indices_mode": "repeated_positive"}, "state_indices_mode"),
            ({8: routable.ROUTABLE[path](_catalogue()).args[8].bfloat16()}, "tensor:state"),
            # What FlashInfer refuses: a contiguous [slots, C, 3] convolution cache (it takes
            # the SD layout), a bound >= 0, a negative eps, Cake without a slot mode.
            ({2: routable.ROUTABLE[path](_catalogue()).args[2].contiguous()}, "conv_state"),
            ({11: 1.0}, "lower_bound"),
            ({12: -1.0}, "norm_eps"),
            ({"backend": "cake", "state_indices_mode": None}, "backend,state_indices_mode"),
        ],
    )
    assert math.isnan(seen["lower_bound"]) and seen["norm_eps"] == 1e-6
    assert out is call.args[13] and seen["output_gate"].dim() == 3
    # The output gate as [1, num_rows, H, 128]: the same call.
    seen_again: list = []
    again = routable.ROUTABLE[path](_catalogue())
    args = list(again.args)
    args[9] = args[9][None]
    with rt.enable_apply({call.name: _recorder(call.name, seen_again)}):
        _call(path, args, again.kwargs)
    assert torch.equal(seen_again[0]["output_gate"], again.args[9])


def test_ssd_combined_routes_batched_calls_and_leaves_packed_ones_to_flashinfer():
    path = "flashinfer.mamba.ssd_combined.ssd_combined_fwd"
    call, seen, (out, final) = _route(
        path,
        [
            ({"seq_idx": torch.zeros(2, 5, dtype=torch.int32)}, "seq_idx"),
            ({"return_final_states": False}, "return_final_states"),
            ({"out": torch.zeros(2, 5, 64, 64, dtype=torch.bfloat16)}, "out"),
            ({5: torch.ones(64, 64, dtype=torch.bfloat16)}, "tensor:D"),  # D per channel
        ],
    )
    assert (seen["dt_min"], seen["dt_max"]) == (0.001, 10.0)
    want = _reference(call.name)(**seen)
    assert torch.equal(out, want[0]) and torch.equal(final, want[1])


def test_packed_fused_kda_maps_rows_to_their_sequences_slots_and_is_fused_kda_decode():
    path = "flashinfer.kda_decode.packed_fused_kda_decode"
    base = routable.ROUTABLE[path](_catalogue())
    # Sequences of 1, 0 and 1 tokens, then a row of unused capacity: rows 0, 1 take the
    # slots of sequences 0 and 2; row 2 none (zeros, no cache touched).
    qsl = torch.tensor([0, 1, 1, 2], dtype=torch.int32)
    slots = torch.tensor([[3], [4], [1]], dtype=torch.int32)
    two_tokens = torch.tensor([[3, 2], [4, 0], [1, 0]], dtype=torch.int32)
    call, seen, out = _route(
        path,
        [
            ({7: two_tokens}, "tensor:state_indices"),  # T = 2: the checkpointing kernel
            ({7: slots[:, 0].contiguous()}, "state_indices"),  # FlashInfer takes [N, T]
        ],
    )
    assert torch.equal(seen["state_indices"], call.args[7][:, 0])
    args = list(base.args)
    args[7] = slots
    conv, state = args[2].clone(), args[8].clone()
    seen_packed: list = []
    with rt.enable_apply({call.name: _recorder(call.name, seen_packed)}):
        packed = _call(path, args, {**base.kwargs, "query_start_loc": qsl})
    assert seen_packed[0]["state_indices"].tolist() == [3, 1, 0]
    fused = _reference("fused_kda_decode_h8_d128")
    names = ("x", "weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias")
    names += ("state_indices", "state", "output_gate", "norm_weight", "lower_bound", "norm_eps")
    direct = {**seen_packed[0], "conv_state": conv, "state": state}
    want_out, want_conv, want_state = fused(*(direct[k] for k in names))
    assert torch.equal(packed, want_out) and not packed[0, 2].any()
    assert torch.equal(args[2], want_conv) and torch.equal(args[8], want_state)
    # t1_state_indices gives the slots of the rows directly.
    seen_t1: list = []
    rows = torch.tensor([2, 0, 4], dtype=torch.int32)
    with rt.enable_apply({call.name: _recorder(call.name, seen_t1)}):
        _call(path, args, {**base.kwargs, "query_start_loc": qsl, "t1_state_indices": rows})
    assert torch.equal(seen_t1[0]["state_indices"], rows)


def test_mhc_post_routes_flat_tokens_and_leaves_other_shapes_to_flashinfer():
    path = "flashinfer.mhc.mhc_post"
    call = routable.ROUTABLE[path](_catalogue())
    x, residual, post, comb = call.args
    batched = (x[None], residual[None], post[None], comb[None])  # [1, T, ...]
    _, seen, out = _route(path, [({i: a for i, a in enumerate(batched)}, "tensor:x")])
    assert torch.equal(out, _reference(call.name)(x, residual, post, comb))
    # [T, 4, 1] mixing weights are FlashInfer's other accepted shape: the same call.
    seen_again: list = []
    with rt.enable_apply({call.name: _recorder(call.name, seen_again)}):
        again = _call(path, (x, residual, post[..., None], comb), {})
    assert torch.equal(seen_again[0]["post_layer_mix"], post) and torch.equal(again, out)


def test_mhc_pre_big_fuse_routes_split_partials_summed_and_leaves_bad_values_to_flashinfer():
    path = "flashinfer.mhc.mhc_pre_big_fuse"
    call = routable.ROUTABLE[path](_catalogue())
    dot_mix, sqrsum = call.args[:2]
    # Partials over two splits: the kernel sums them first; the definition gets the sums.
    parts = (torch.stack([dot_mix / 4, dot_mix * 3 / 4]), torch.stack([sqrsum / 2] * 2))
    split = {0: parts[0], 1: parts[1], "num_splits": 2}
    three = (torch.stack([dot_mix / 3] * 3), torch.stack([sqrsum / 3] * 3))
    _, seen, (post, comb, layer) = _route(
        path,
        [
            ({0: three[0], 1: three[1], "num_splits": 3}, "num_splits"),
            ({0: parts[0], 1: parts[1]}, "tensor:dot_mix"),  # no num_splits=2
            ({"rms_eps": 0.0}, "rms_eps"),
            ({"sinkhorn_repeat": 0}, "sinkhorn_repeat"),
            ({5: 0}, "k"),
        ],
    )
    expected = _reference(call.name)(**seen)
    assert torch.equal(post, expected[0]) and torch.equal(layer, expected[2])
    seen_split: list = []
    with rt.enable_apply({call.name: _recorder(call.name, seen_split)}):
        args, kwargs = list(call.args), dict(call.kwargs)
        args[0], args[1], kwargs["num_splits"] = split[0], split[1], split["num_splits"]
        again = _call(path, args, kwargs)
    _close(seen_split[0]["dot_mix"], dot_mix, atol=1e-5, rtol=1e-6)
    _close(seen_split[0]["sqrsum"], sqrsum, atol=1e-3, rtol=1e-6)
    _close(again[1], comb, atol=1e-5, rtol=1e-5)


def test_mhc_pre_big_fuse_with_prenorm_takes_a_split_axis_of_one_and_no_other():
    path = "flashinfer.mhc.mhc_pre_big_fuse_with_prenorm"
    call = routable.ROUTABLE[path](_catalogue())
    dot_mix = call.args[0]
    _, seen, out = _route(
        path,
        [
            ({0: torch.stack([dot_mix, dot_mix])}, "tensor:dot_mix"),
            ({"mhc_sinkhorn_eps": -1e-6}, "mhc_sinkhorn_eps"),
        ],
    )
    seen_again: list = []
    with rt.enable_apply({call.name: _recorder(call.name, seen_again)}):
        again = _call(path, (dot_mix[None], *call.args[1:]), call.kwargs)
    assert torch.equal(seen_again[0]["dot_mix"], dot_mix)
    assert all(torch.equal(a, b) for a, b in zip(again, out))


def test_every_family_of_the_files_has_a_routable_call():
    paths = {f.api.path for f in _module().families() if f.api is not None}
    assert paths <= set(routable.ROUTABLE), paths - set(routable.ROUTABLE)
    assert importlib.import_module("flashinfer.gdn_prefill")


MAMBA = "flashinfer.mamba.selective_state_update.selective_state_update"


def test_mamba_decode_takes_per_head_parameters_broadcast_as_flashinfer_does():
    # FlashInfer refuses A, dt, D and dt_bias that are not one value per head (stride 0).
    call = routable.ROUTABLE[MAMBA](_catalogue())
    _route(MAMBA, [({3: call.args[3].contiguous()}, "A"), ({2: call.args[2].contiguous()}, "dt")])


def test_mamba_decode_gives_a_padded_sequence_flashinfers_output_and_stores_no_state():
    # A slot of -1 reads a zero state and still gets D * x + dt * x * (B . C), as in
    # FlashInfer's kernels; the cache is left as it was for it.
    call = routable.ROUTABLE[MAMBA](_catalogue())
    state, x, dt, A, B, C, D = call.args
    slots = call.kwargs["state_batch_indices"].clone()
    slots[0] = -1
    before = state.clone()
    seen: list = []
    with rt.enable_apply({call.name: _recorder(call.name, seen)}):
        _call(MAMBA, call.args, call.kwargs | {"state_batch_indices": slots})
    assert rt.stats()[MAMBA]["hit"] == 1
    out = call.kwargs["out"]
    step = torch.nn.functional.softplus(dt[0].float() + call.kwargs["dt_bias"].float())
    per_head = x.shape[1] // B.shape[1]
    bc = (B[0].float() * C[0].float()).sum(-1).repeat_interleave(per_head)  # [heads]
    want = step * x[0].float() * bc[:, None] + x[0].float() * D.float()
    _close(out[0], want.to(out.dtype), atol=2e-2, rtol=2e-2)
    assert out[0].abs().max() > 0.05
    live = int(slots[1])
    untouched = [i for i in range(state.shape[0]) if i != live]
    assert torch.equal(state[untouched], before[untouched])
    assert not torch.equal(state[live], before[live])
