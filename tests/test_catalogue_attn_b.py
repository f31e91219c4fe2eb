"""The TRT-LLM / XQA paged attention, MLA and KV-cache families against the real FlashInfer.

FlashInfer 0.7.2.post1 is installed; its kernels need a GPU (most of these an SM100 one), so
its functions are never run here. For each API the real function is replaced by a recorder
with its signature before apply is enabled, and each check calls the patched API:

- a call with FlashInfer's defaults is routed, and the solution sees the definition's inputs;
- each ruled parameter at a non-default value is routed (an input, a layout the rules
  convert, an ignored launch option) or refused with its rule counted, and then reaches
  FlashInfer's function unchanged;
- the reference agrees with an independent computation: the reference of FlashInfer's own
  trace template where it has one, else a formula from the API's docstring.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from _shared import catalogue_module, require_module

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _attn_b_calls as calls  # noqa: E402
import _routable_calls as routable  # noqa: E402
import fibgen.runtime as rt  # noqa: E402
from fibgen.runtime.routing import patching  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Slow as a whole: hundreds of calls through the real FlashInfer's API.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning"),
]


@functools.cache
def _module():
    return catalogue_module()


@functools.cache
def _catalogue():
    return routable.Catalogue(_module())


@functools.cache
def _reference(name: str):
    namespace: dict = {}
    exec(_catalogue().defs[name].reference, namespace)
    return namespace["run"]


@pytest.fixture(autouse=True)
def _off():
    yield
    rt.disable_apply()


@dataclass
class Outcome:
    result: Any
    seen: list  # the inputs each solution call got
    originals: list  # the arguments FlashInfer's function got, as its signature binds them
    counts: dict


def _recorder(real, calls_):
    sig = inspect.signature(real)

    def original(*args, **kwargs):
        calls_.append(sig.bind(*args, **kwargs).arguments)
        return "flashinfer"

    original.__signature__ = sig
    return original


def _route(monkeypatch, path: str, name: str, args: tuple, kwargs: dict) -> Outcome:
    """Call the patched API with a solution for ``name`` that runs the reference."""
    owner, attr = patching._locate(path)
    originals: list = []
    monkeypatch.setattr(owner, attr, _recorder(getattr(owner, attr), originals))
    seen: list = []
    ref = _reference(name)

    def solution(**inputs):
        seen.append(inputs)
        return ref(**inputs)

    rt.enable_apply({name: solution})
    result = getattr(owner, attr)(*args, **kwargs)
    counts = rt.stats()[path]
    rt.disable_apply()
    return Outcome(result, seen, originals, counts)


def _hit(outcome: Outcome) -> None:
    assert outcome.counts["hit"] == 1 and len(outcome.seen) == 1, outcome.counts
    assert not outcome.originals


def _refused(outcome: Outcome, rule: str | None) -> None:
    """Not routed: a rule failed (counted by name), or with ``rule`` None, the call names a
    definition nothing serves (a const the call gives that differs from the definition's)."""
    assert outcome.counts["hit"] == 0 and not outcome.seen, outcome.counts
    if rule is None:
        assert outcome.counts["fallback_no_candidate"] == 1, outcome.counts
    else:
        assert outcome.counts["fallback_guard"] == 1 and outcome.counts["rules"] == {rule: 1}
    assert outcome.result == "flashinfer" and len(outcome.originals) == 1


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 2e-2) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    assert (a.float() - b.float()).abs().max().item() <= atol


# ---------------------------------------------------------------------------------------
# trtllm_batch_decode_with_kv_cache
# ---------------------------------------------------------------------------------------

DECODE = "flashinfer.decode.trtllm_batch_decode_with_kv_cache"
DECODE_NAME = "trtllm_batch_decode_h64_kv8_d64_ps16"


def _decode_case(seed: int = 0):
    c = _catalogue()
    x, axes = c.inputs(
        DECODE_NAME, seed=seed, num_tokens=3, batch_size=3, num_pages=12, max_pages_per_seq=3
    )
    # The HND cache of FlashInfer's default layout, one tensor [pages, 2, heads, ps, dim].
    hnd = torch.stack([x["k_cache"], x["v_cache"]], dim=1).transpose(2, 3).contiguous()
    return x, axes, hnd


def _decode_args(x, hnd):
    ws = torch.empty(16, dtype=torch.uint8)
    return (x["query"], hnd, ws, x["block_tables"], x["seq_lens"], int(x["max_seq_len"]))


def test_trtllm_decode_with_flashinfers_defaults_is_routed(monkeypatch):
    x, _, hnd = _decode_case()
    out = _route(monkeypatch, DECODE, DECODE_NAME, _decode_args(x, hnd), {})
    _hit(out)
    (seen,) = out.seen
    # The HND tensor reaches the solution as NHD views of the same storage.
    assert torch.equal(seen["k_cache"], x["k_cache"]) and torch.equal(seen["v_cache"], x["v_cache"])
    assert seen["k_cache"].data_ptr() == hnd.data_ptr()
    assert (seen["bmm1_scale"], seen["bmm2_scale"], seen["window_left"]) == (1.0, 1.0, -1)
    assert seen["sinks"] is None
    expected = _reference(DECODE_NAME)(**{**seen})
    assert torch.equal(out.result, expected)


@pytest.mark.parametrize(
    ("param", "value", "rule"),
    [
        ("out_dtype", torch.float16, "out_dtype,query"),
        ("o_sf_scale", 1.0, "o_sf_scale"),
        ("o_sf_vec_size", 16, "o_sf_vec_size"),
        ("q_len_per_req", 2, "q_len_per_req"),
        ("o_scale", 0.5, "o_scale"),
        ("mask", torch.ones(3, 1, 2, dtype=torch.int16), "mask"),
        ("max_q_len", 1, "max_q_len"),
        ("cum_seq_lens_q", torch.arange(4, dtype=torch.int32), "cum_seq_lens_q"),
        ("skip_softmax_threshold_scale_factor", 0.5, "skip_softmax_threshold_scale_factor"),
        ("kv_cache_sf", (torch.zeros(1), torch.zeros(1)), "kv_cache_sf"),
        ("uses_shared_paged_kv_idx", False, "uses_shared_paged_kv_idx"),
        ("lse", torch.zeros(3, 64), "lse"),
        ("return_lse", True, "return_lse"),
        ("bmm1_scale_log2", torch.ones(1), "bmm1_scale_log2"),
        ("enable_block_sparse_attention", True, "enable_block_sparse_attention"),
        ("cp_world", 2, "cp_world"),
        ("cp_rank", 1, "cp_rank"),
        ("causal_seqlens_kv_global", torch.ones(3, dtype=torch.int32), "causal_seqlens_kv_global"),
        ("bf16q_fp8kv_transform_mode", "k_only", "bf16q_fp8kv_transform_mode"),
        ("request_order", torch.arange(3, dtype=torch.int32), "request_order"),
        ("request_order_plan", object(), "request_order_plan"),
        ("bmm1_scale", torch.ones(1), "bmm1_scale"),
        ("bmm2_scale", torch.ones(1), "bmm2_scale"),
        ("bmm2_scale", 2.0, "bmm2_scale"),  # Note [XQA scales of a 16-bit cache]
    ],
)
def test_trtllm_decode_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, param, value, rule
):
    x, _, hnd = _decode_case()
    out = _route(monkeypatch, DECODE, DECODE_NAME, _decode_args(x, hnd), {param: value})
    _refused(out, rule)
    assert out.originals[0][param] is value


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("enable_pdl", True),
        ("backend", "trtllm-gen"),
        ("workspace_buffer", torch.zeros(8, dtype=torch.uint8)),
        ("multi_ctas_kv_counter_buffer", torch.zeros(4, dtype=torch.int32)),
        ("out_dtype", torch.bfloat16),
        ("o_scale", None),
    ],
)
def test_trtllm_decode_launch_options_never_stop_a_call(monkeypatch, param, value):
    x, _, hnd = _decode_case()
    args = list(_decode_args(x, hnd))
    kwargs = {param: value}
    if param == "workspace_buffer":
        args[2], kwargs = value, {}
    out = _route(monkeypatch, DECODE, DECODE_NAME, tuple(args), kwargs)
    _hit(out)


def test_trtllm_decode_values_the_definition_reads_reach_the_solution(monkeypatch):
    x, axes, hnd = _decode_case()
    sinks = torch.randn(64)
    buf = torch.zeros(3, 64, 64, dtype=torch.bfloat16)
    kwargs = {"bmm1_scale": 0.3, "bmm2_scale": 1.0, "window_left": 5, "sinks": sinks, "out": buf}
    out = _route(monkeypatch, DECODE, DECODE_NAME, _decode_args(x, hnd), kwargs)
    _hit(out)
    (seen,) = out.seen
    assert (seen["bmm1_scale"], seen["bmm2_scale"], seen["window_left"]) == (0.3, 1.0, 5)
    assert seen["sinks"] is sinks
    assert out.result is buf and torch.equal(buf, _reference(DECODE_NAME)(**seen))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["tensor", "tuple"])
def test_trtllm_decode_takes_every_cache_form(monkeypatch, layout, form):
    x, _, _ = _decode_case()
    k, v = x["k_cache"], x["v_cache"]
    if layout == "HND":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    cache = (k, v) if form == "tuple" else torch.stack([k, v], dim=1)
    args = (x["query"], cache, torch.empty(16, dtype=torch.uint8), x["block_tables"])
    args += (x["seq_lens"], 48)
    out = _route(monkeypatch, DECODE, DECODE_NAME, args, {"kv_layout": layout})
    _hit(out)
    assert torch.equal(out.seen[0]["k_cache"], x["k_cache"])
    assert torch.equal(out.seen[0]["v_cache"], x["v_cache"])


def test_trtllm_decode_inputs_of_another_dtype_or_shape_are_refused(monkeypatch):
    x, _, hnd = _decode_case()
    args = list(_decode_args(x, hnd))
    args[1] = hnd.to(torch.float8_e4m3fn)  # an FP8 cache
    _refused(_route(monkeypatch, DECODE, DECODE_NAME, tuple(args), {}), "tensor:k_cache")
    args = list(_decode_args(x, hnd))
    args[0] = torch.cat([x["query"], x["query"]])  # two tokens per sequence
    _refused(_route(monkeypatch, DECODE, DECODE_NAME, tuple(args), {}), "query,block_tables")
    args = list(_decode_args(x, hnd))
    args[1] = hnd[:, :1]  # one shared K/V tensor (kv_cache_dim 1): not this contract
    _refused(_route(monkeypatch, DECODE, DECODE_NAME, tuple(args), {}), "kv_cache")


def _template(name: str):
    import flashinfer.trace.templates.attention as templates

    return getattr(templates, name)


def _template_of(module: str, name: str):
    """A reference of FlashInfer's trace templates kept outside ``attention.py``."""
    import importlib

    return getattr(importlib.import_module(f"flashinfer.trace.templates.{module}"), name)


def test_trtllm_decode_reference_agrees_with_flashinfers_template():
    x, _, hnd = _decode_case(seed=1)
    ours = _reference(DECODE_NAME)(**{k: x[k] for k in _decode_inputs()} | {"sinks": None})
    theirs = _template("_trtllm_batch_decode_reference")(
        x["query"], hnd, None, x["block_tables"], x["seq_lens"], int(x["max_seq_len"]),
        bmm1_scale=float(x["bmm1_scale"]), bmm2_scale=1.0, kv_layout="HND",
    )  # fmt: skip
    _close(ours, theirs)


def _decode_inputs():
    return [t.name for t in _catalogue().defs[DECODE_NAME].inputs]


def _attend(q, k, v, scale, sink=None):
    """softmax(scale * q.k) v for one query row per head: [h, d] x [n, h, d]."""
    logits = torch.einsum("hd,nhd->hn", q.float(), k.float()) * scale
    if sink is not None:
        # With a sink the weights are exp(l) / (sum exp(l) + exp(sink)).
        lse = torch.logsumexp(logits, dim=-1)
        shrink = torch.exp(lse) / (torch.exp(lse) + torch.exp(sink.float()))
        return torch.einsum("hn,nhd->hd", logits.softmax(-1), v.float()) * shrink[:, None]
    return torch.einsum("hn,nhd->hd", logits.softmax(-1), v.float())


def test_trtllm_decode_reference_window_and_sinks_match_their_formulas():
    # The template's reference has neither: each sequence's output is recomputed over the
    # keys the docstring says it sees (the last window_left + 1), with the sink in the
    # denominator.
    x, _, _ = _decode_case(seed=2)
    inputs = {k: x[k] for k in _decode_inputs()}
    inputs["sinks"] = torch.randn(64) * 2
    inputs["window_left"] = 4
    out = _reference(DECODE_NAME)(**inputs)
    group = 8
    for b in range(3):
        n = int(x["seq_lens"][b])
        pages = x["block_tables"][b, : (n + 15) // 16].long()
        k = x["k_cache"][pages].flatten(0, 1)[:n][-5:].repeat_interleave(group, dim=1)
        v = x["v_cache"][pages].flatten(0, 1)[:n][-5:].repeat_interleave(group, dim=1)
        want = _attend(x["query"][b], k, v, float(x["bmm1_scale"]), inputs["sinks"])
        _close(out[b], want.to(torch.bfloat16))


# ---------------------------------------------------------------------------------------
# Every other API, from a table: a call with FlashInfer's defaults, then one parameter at a
# time at a value its rule refuses, or at a value that is routed (a launch option the
# definition ignores, a value it reads, a layout its rules convert).
# ---------------------------------------------------------------------------------------


@dataclass
class Api:
    path: str
    name: str
    build: Any  # seed -> (args, kwargs, inputs): the call with FlashInfer's defaults
    refused: list  # (parameter, value, the rule counted)
    routed: list  # (parameter, value)
    written: str = "output"  # the buffer parameter of an API that returns None


def _same(a: Any, b: Any) -> bool:
    """Equal tensors (FP8 ones compared by their bytes), or tuples of them."""
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if a.dtype == torch.float8_e4m3fn:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.shape == b.shape and torch.equal(a, b)


def _positional(path: str) -> list[str]:
    owner, attr = patching._locate(path)
    return list(inspect.signature(getattr(owner, attr)).parameters)


def _with(api: Api, param: str, value: Any, seed: int = 0):
    """The default call of ``api`` with ``param`` set to ``value`` (in place if positional)."""
    args, kwargs, x = api.build(seed)
    names = _positional(api.path)
    if names.index(param) < len(args):
        args = tuple(value if i == names.index(param) else a for i, a in enumerate(args))
    else:
        kwargs = {**kwargs, param: value}
    return args, kwargs, x


def _xqa_batch_decode_build(seed):
    name = "xqa_batch_decode_h64_kv8_d64_ps16"
    x, _ = _catalogue().inputs(
        name, seed=seed, num_tokens=3, batch_size=3, num_pages=12, max_pages_per_seq=3
    )
    args = (x["query"], (x["k_cache"], x["v_cache"]), torch.empty(16, dtype=torch.uint8))
    return args + (x["block_tables"], x["seq_lens"], int(x["max_seq_len"])), {}, x


def _xqa_build(seed):
    name = "xqa_h64_kv8_d64_ps16"
    x, _ = _catalogue().inputs(name, seed=seed, batch_size=3, num_pages=12, max_pages_per_seq=3)
    args = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["seq_lens"].to(torch.uint32))
    args += (torch.zeros_like(x["q"]), torch.empty(16, dtype=torch.uint8))
    return args + (torch.zeros(8, dtype=torch.uint32), 8, 16), {}, x


def _context_build(seed):
    name = "trtllm_batch_context_h64_kv8_d64_ps16"
    x, _ = _catalogue().inputs(
        name,
        seed=seed,
        num_tokens=5,
        batch_size=2,
        batch_size_plus_1_q=3,
        batch_size_plus_1_kv=3,
        num_pages=8,
        max_pages_per_seq=2,
    )
    hnd = torch.stack([x["k_cache"], x["v_cache"]], dim=1).transpose(2, 3).contiguous()
    args = (x["query"], hnd, torch.empty(16, dtype=torch.uint8), x["block_tables"])
    args += (x["seq_lens"], 8, 32, float(x["bmm1_scale"]), 1.0, 2)
    return args + (x["cum_seq_lens_q"], x["seq_lens"].cumsum(0).to(torch.int32)), {}, x


def _mla_build(kind):
    def build(seed):
        name = f"trtllm_{kind}_mla_dense_h16_d_qk576_ckv512_kpe64_nope128_ps32"
        q_len = 1 if kind == "batch_decode" else 3
        x, _ = _catalogue().inputs(
            name, seed=seed, batch_size=2, q_len_per_request=q_len, num_pages=6,
            max_pages_per_seq=3,
        )  # fmt: skip
        args = (x["query"], x["kv_cache"], torch.empty(16, dtype=torch.uint8), 128, 512, 64)
        return args + (x["block_tables"], x["seq_lens"], int(x["max_seq_len"])), {}, x

    return build


def _mla_api(kind: str) -> Api:
    fn = "trtllm_batch_decode_with_kv_cache_mla" if kind == "batch_decode" else (
        "trtllm_prefill_with_kv_cache_mla"
    )  # fmt: skip
    return Api(
        f"flashinfer.mla.{fn}",
        f"trtllm_{kind}_mla_dense_h16_d_qk576_ckv512_kpe64_nope128_ps32",
        _mla_build(kind),
        [
            ("sparse_mla_top_k", 2048, "sparse_mla_top_k"),
            ("bmm1_scale", _ONE, "bmm1_scale"),
            ("bmm2_scale", _ONE, "bmm2_scale"),
            ("bmm2_scale", 2.0, "bmm2_scale"),  # SM120's XQA MLA kernel scales the logits too
            ("sinks", torch.zeros(16), "sinks"),
            ("skip_softmax_threshold_scale_factor", 0.5, "skip_softmax_threshold_scale_factor"),
            ("uses_shared_paged_kv_idx", False, "uses_shared_paged_kv_idx"),
            ("lse", torch.zeros(2, 16), "lse"),
            ("return_lse", True, "return_lse"),
            ("cum_seq_lens_q", torch.arange(3, dtype=torch.int32), "cum_seq_lens_q"),
            ("max_q_len", 1, "max_q_len"),
            ("sparse_mla_top_k_lens", torch.ones(2, dtype=torch.int32), "sparse_mla_top_k_lens"),
            ("enable_dcp", True, "enable_dcp"),
            ("cp_world", 2, "cp_world"),
            ("cp_rank", 1, "cp_rank"),
            ("causal_seqlens_kv_global", torch.ones(2, dtype=torch.int32),
             "causal_seqlens_kv_global"),
            ("use_fp16_softmax", True, "use_fp16_softmax"),
            ("kv_lora_rank", 256, "kv_lora_rank"),  # the call must agree with the definition
            ("qk_nope_head_dim", 64, None),
            ("qk_rope_head_dim", 32, None),
        ],  # fmt: skip
        [
            ("bmm1_scale", 0.07),
            ("bmm2_scale", 1.0),
            ("out", torch.zeros(2, 1 if kind == "batch_decode" else 3, 16, 512).bfloat16()),
            ("enable_pdl", True),
            ("backend", "trtllm-gen"),
            ("is_var_seq", False),
            ("cute_dsl_impl", "modular"),
            ("kv_scale_format", "arbitrary_fp32"),
            ("return_lse_base", "basee"),
            ("multi_ctas_kv_counter_buffer", torch.zeros(4, dtype=torch.int32)),
            ("workspace_buffer", torch.zeros(4, dtype=torch.uint8)),
            ("use_fp16_softmax", False),
        ],
    )


XQA_MLA_NAME = "xqa_batch_decode_mla_h16_d_qk576_ckv512_kpe64_nope128_ps32"


def _xqa_mla_build(seed):
    x, _ = _catalogue().inputs(
        XQA_MLA_NAME, seed=seed, batch_size=2, num_pages=6, max_pages_per_seq=3
    )
    args = (x["query"], x["kv_cache"], torch.empty(16, dtype=torch.uint8), 128, 512, 64)
    return args + (x["block_tables"], x["seq_lens"], int(x["max_seq_len"])), {}, x


CONCAT_K_NAME = "concat_mla_k_h16_nope128_rope64_d192"
CONCAT_KV_NAME = "concat_mla_kv_quant_fp8_h16_kv256_rope64"


def _concat_k_build(seed):
    x, _ = _catalogue().inputs(CONCAT_K_NAME, seed=seed, num_tokens=5)
    k = torch.full((5, 16, 192), float("nan"), dtype=torch.bfloat16)
    return (k, x["k_nope"], x["k_rope"]), {}, x


def _concat_kv_build(seed):
    x, _ = _catalogue().inputs(CONCAT_KV_NAME, seed=seed, num_tokens=5)
    return (x["kv_nope"], x["k_pe"]), {}, x


RAGGED_NAME = "trtllm_ragged_attention_deepseek_h16_d_qk192_d_v128"


def _ragged_build(seed):
    x, _ = _catalogue().inputs(
        RAGGED_NAME, seed=seed, batch_size=2, batch_size_plus_1=3, num_q_tokens=5,
        num_kv_tokens=32,
    )  # fmt: skip
    args = (x["query"], x["key"], x["value"], torch.empty(16, dtype=torch.uint8))
    args += (x["seq_lens"], 16, 16, float(x["bmm1_scale"]), 1.0, 1.0, 2, -1)
    args += (x["cum_seq_lens_q"], x["cum_seq_lens_kv"], None, True, False)
    return args, {}, x


XQA_MLA_KERNEL = "xqa_mla_h128_ckv512_d_qk576_ps32"


def _xqa_mla_kernel_build(seed):
    x, _ = _catalogue().inputs(
        XQA_MLA_KERNEL, seed=seed, batch_size=2, num_pages=6, max_pages_per_seq=3
    )
    seq_lens = x["seq_lens"].to(torch.uint32)  # as FlashInfer takes them
    output = torch.zeros(2, 1, 128, 512, dtype=torch.bfloat16)
    args = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], seq_lens, output)
    args += (torch.empty(16, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint32), 32)
    return args, {}, x


FMHA_V2_NAME = "trtllm_fmha_v2_prefill_h16_kv2_d128"


def _fmha_v2_build(seed, name=FMHA_V2_NAME):
    x, _ = _catalogue().inputs(
        name, seed=seed, batch_size=2, batch_size_plus_1=3, num_tokens=5, num_kv_tokens=32
    )
    args = ((x["query"], x["key"], x["value"]), "SEPARATE_Q_K_V", torch.empty(16).byte())
    args += (x["seq_lens"], 16, 16, float(x["bmm1_scale"]), 1.0, 2)
    return args + (x["cum_seq_lens_q"], x["cum_seq_lens_kv"]), {}, x


def _sm120_build(kind):
    name = "fmha_v2_prefill_sm120_h32_d128" if kind == "sm120" else (
        "fmha_v2_prefill_deepseek_h16_d192"
    )  # fmt: skip

    def build(seed):
        x, axes = _catalogue().inputs(name, seed=seed, batch_size=2, seq_len=6)
        out = _catalogue().buffer(name, "output", axes)
        heads, dim = x["query"].shape[2:]
        return (x["query"], x["key"], x["value"], out, heads, dim, 6, 1.0), {}, x

    return name, build


def _sm120_api(kind: str) -> Api:
    name, build = _sm120_build(kind)
    refused = [
        ("scale_softmax", 0.5, "scale_softmax"),
        ("return_lse", True, "return_lse"),
        ("lse", torch.zeros(2, 6, 32, 2), "lse"),
        ("scale_bmm1_d", torch.ones(1), "scale_bmm1_d"),
        ("scale_bmm2_d", torch.ones(1), "scale_bmm2_d"),
        ("num_heads", 8, "num_heads"),
        ("seq_len", 7, "seq_len"),
        ("query", torch.zeros(2, 6, *((16, 192) if kind == "deepseek" else (32, 128))).bfloat16(),
         "tensor:query"),
    ]  # fmt: skip
    routed = [("scale_bmm1", 0.1), ("scale_bmm2", 2.0), ("scale_softmax", 1.0)]
    if kind == "sm120":
        routed.append(("causal", False))
    return Api(f"flashinfer.prefill.fmha_v2_prefill_{kind}", name, build, refused, routed)


TOPK_NAME = "msa_topk_select_h4_topk16"


def _topk_build(seed):
    x, _ = _catalogue().inputs(TOPK_NAME, seed=seed, max_k_tiles=40, total_q=6)
    return (x["max_score"], 16), {}, x


MSA_NAME = "msa_sparse_attention_h4_kv2_d128_topk16"


def _msa_build(seed):
    x, _ = _catalogue().inputs(MSA_NAME, seed=seed, len_indptr=3)
    names = ("q", "k", "v", "q2k_indices", "cu_seqlens_q", "cu_seqlens_k")
    return tuple(x[k] for k in names), {}, x


MSA_DECODE_NAME = "msa_sparse_decode_attention_h4_kv2_d128_topk16_sq1"


def _msa_decode_build(seed):
    x, _ = _catalogue().inputs(MSA_DECODE_NAME, seed=seed, len_indptr=3)
    args = tuple(x[k] for k in ("q", "k", "v", "q2k_indices"))
    return args, {"cu_seqlens_k": x["cu_seqlens_k"]}, x


_FP8 = torch.float8_e4m3fn
_ONE = torch.ones(1)
APIS = [
    Api(
        "flashinfer.msa_ops.sparse_decode.msa_sparse_decode_attention",
        MSA_DECODE_NAME,
        _msa_decode_build,
        [
            # Another number of tokens per sequence names another definition.
            ("seqlen_q", 2, None),
            ("page_table", torch.zeros(2, 4, dtype=torch.int32), "page_table"),
            ("seqused_k", torch.ones(2, dtype=torch.int32), "seqused_k"),
            ("return_softmax_lse", True, "return_softmax_lse"),
            ("k_scale", torch.ones(1, dtype=torch.uint8), "k_scale"),
            ("v_global_scale", 0.5, "v_global_scale"),
            ("q_offset", 3, "q_offset"),
            ("partial_dtype", torch.bfloat16, "partial_dtype"),
            ("out", torch.zeros(4, 4, 128, dtype=torch.bfloat16), "out"),
            ("k", torch.zeros(3, 2, 128, dtype=_FP8), "tensor:k"),
        ],
        [
            ("causal", False),
            ("softmax_scale", 0.05),
            ("partial_dtype", torch.float32),
            ("force_fused", False),
            ("workspace", object()),
        ],
    ),
    Api(
        "flashinfer.msa_ops.sparse_prefill.msa_sparse_attention",
        MSA_NAME,
        _msa_build,
        [
            ("cu_seqlens_k", None, "unevaluable"),
            ("page_table", torch.zeros(2, 4, dtype=torch.int32), "page_table"),
            ("seqused_k", torch.ones(2, dtype=torch.int32), "seqused_k"),
            ("return_softmax_lse", True, "return_softmax_lse"),
            ("return_temperature_lse", True, "return_temperature_lse"),
            ("k_scale", torch.ones(1, dtype=torch.uint8), "k_scale"),
            ("v_scale", torch.ones(1, dtype=torch.uint8), "v_scale"),
            ("k_global_scale", 0.5, "k_global_scale"),
            ("v_global_scale", 0.5, "v_global_scale"),
            ("q_offset", 3, "q_offset"),
            ("k", torch.zeros(3, 2, 128, dtype=_FP8), "tensor:k"),
        ],
        [
            ("causal", False),
            ("softmax_scale", 0.05),
            ("lse_temperature_scale", 2.0),
            ("workspace", object()),
        ],
    ),
    Api(
        "flashinfer.msa_ops.sparse_topk_select.msa_topk_select",
        TOPK_NAME,
        _topk_build,
        [
            ("force_begin_blocks", 17, "force_begin_blocks,force_end_blocks,topk"),
            ("output", torch.zeros(6, 4, 16, dtype=torch.int64), "tensor:block_indices"),
            ("max_score", torch.zeros(4, 40, 6, dtype=torch.bfloat16), "tensor:max_score"),
            ("topk", 8, "topk"),
        ],
        [
            ("num_valid_pages", torch.tensor([0, 3, 16, 20, 40, 99], dtype=torch.int32)),
            ("force_begin_blocks", 2),
            ("force_end_blocks", 4),
            ("output", torch.zeros(6, 4, 16, dtype=torch.int32)),
        ],
    ),
    _sm120_api("sm120"),
    _sm120_api("deepseek"),
    Api(
        "flashinfer.prefill.trtllm_fmha_v2_prefill",
        FMHA_V2_NAME,
        _fmha_v2_build,
        [
            ("input_layout", "Q_PAGED_KV_NHD", "input_layout"),
            ("mask_mode", "sliding_window", "mask_mode"),
            ("mask_mode", "chunked", "mask_mode"),
            ("out_dtype", torch.float16, "out_dtype,qkv,input_layout"),  # query: a let over qkv
            ("out", torch.zeros(5, 16, 128, dtype=torch.float16), "tensor:output"),
            ("sinks", [torch.zeros(16)], "sinks"),
            ("pos_encoding_mode", "alibi", "pos_encoding_mode"),
            ("logits_soft_cap_scale", 30.0, "logits_soft_cap_scale"),
            ("save_softmax_stats", True, "save_softmax_stats"),
            ("skip_softmax_threshold_scale_factor", 0.5, "skip_softmax_threshold_scale_factor"),
            ("bmm2_scale", 2.0, "bmm2_scale"),  # Note [FMHA v2 output scale]
        ],
        [
            ("mask_mode", "padding"),
            ("bmm1_scale", 0.1),
            ("bmm2_scale", 1.0),
            ("out_dtype", torch.bfloat16),
            ("out", torch.zeros(5, 16, 128, dtype=torch.bfloat16)),
            ("block_tables", torch.zeros(2, 1, dtype=torch.int32)),
            ("window_left", 7),
            ("chunked_attention_size", 64),
            ("workspace_buffer", torch.zeros(4, dtype=torch.uint8)),
        ],
    ),
    Api(
        "flashinfer.xqa.xqa_mla",
        XQA_MLA_KERNEL,
        _xqa_mla_kernel_build,
        [
            ("q_scale", _ONE, "q_scale"),
            ("kv_scale", 0.5, "kv_scale"),
            ("q", torch.zeros(2, 1, 128, 576, dtype=torch.bfloat16), "tensor:q"),
            ("q", torch.zeros(2, 1, 64, 576, dtype=_FP8), None),  # 64 heads: no definition
        ],
        [
            ("q_scale", 0.1),
            ("sm_count", 132),
            ("enable_pdl", True),
            ("semaphores", torch.zeros(4, dtype=torch.uint32)),
            ("workspace_buffer", torch.zeros(4, dtype=torch.uint8)),
            ("seq_lens", torch.full((2, 1), 40, dtype=torch.int32)),
        ],
        written="output",
    ),
    Api(
        "flashinfer.prefill.trtllm_ragged_attention_deepseek",
        RAGGED_NAME,
        _ragged_build,
        [
            ("bmm1_scale", _ONE, "bmm1_scale"),
            ("bmm2_scale", _ONE, "bmm2_scale"),
            ("window_left", 8, "window_left"),
            ("return_lse", True, "return_lse"),
            ("attention_sinks", torch.zeros(16), "attention_sinks"),
            ("skip_softmax_threshold_scale_factor", 0.5, "skip_softmax_threshold_scale_factor"),
            ("lse", torch.zeros(5, 16), "lse"),
            ("sage_attn_sfs", (torch.ones(1), None, None, None), "sage_attn_sfs"),
            ("num_elts_per_sage_attn_blk", (1, 1, 1, 1), "num_elts_per_sage_attn_blk"),
            ("use_fp16_softmax", True, "use_fp16_softmax"),
            ("uses_spcompress", True, "uses_spcompress"),
            ("out", torch.zeros(5, 16, 128, dtype=torch.float16), "tensor:output"),
            ("query", torch.zeros(5, 16, 192, dtype=_FP8), "tensor:query"),
        ],
        [
            ("is_causal", False),
            ("bmm1_scale", 0.1),
            ("bmm2_scale", 2.0),
            ("o_sf_scale", 0.5),
            ("enable_pdl", True),
            ("backend", "cute-dsl"),
            ("q_seq_lens_cpu", torch.tensor([2, 3])),
            ("kv_seq_lens_cpu", torch.tensor([16, 16])),
            ("skip_all_rows_active_check", False),
            ("out", torch.zeros(5, 16, 128, dtype=torch.bfloat16)),
            ("workspace_buffer", torch.zeros(4, dtype=torch.uint8)),
        ],
    ),
    Api(
        "flashinfer.concat_ops.concat_mla_k",
        CONCAT_K_NAME,
        _concat_k_build,
        [
            ("k", torch.zeros(5, 16, 192, dtype=torch.float16), "tensor:k_out"),
            ("k_rope", torch.zeros(5, 16, 64, dtype=torch.bfloat16), "tensor:k_rope"),
            ("k_nope", torch.zeros(5, 16, 64, dtype=torch.bfloat16), None),
        ],
        [("backend", "cake"), ("k", torch.zeros(5, 16, 256, dtype=torch.bfloat16)[..., :192])],
        written="k",
    ),
    Api(
        "flashinfer.mla_kv_pack.concat_mla_kv_quant_fp8",
        CONCAT_KV_NAME,
        _concat_kv_build,
        [
            ("nope_dim", 64, "nope_dim"),
            ("key", torch.zeros(5, 16, 192, dtype=torch.bfloat16), "tensor:key_out"),
            ("value", torch.zeros(5, 16, 128, dtype=torch.bfloat16), "tensor:value_out"),
            ("kv_nope", torch.zeros(5, 16, 256, dtype=torch.float16), "tensor:kv_nope"),
        ],
        [
            ("key", torch.zeros(5, 16, 192, dtype=_FP8)),
            ("value", torch.zeros(5, 16, 128, dtype=_FP8)),
            ("k_pe", torch.zeros(5, 1, 64, dtype=torch.bfloat16)),
            ("backend", "specialized"),
        ],
    ),
    _mla_api("batch_decode"),
    _mla_api("prefill"),
    Api(
        "flashinfer.mla.xqa_batch_decode_with_kv_cache_mla",
        XQA_MLA_NAME,
        _xqa_mla_build,
        [
            ("out", torch.zeros(2, 16, 512, dtype=torch.bfloat16), "out"),
            ("bmm1_scale", _ONE, "bmm1_scale"),
            ("bmm2_scale", 0.5, "bmm2_scale"),
            ("sinks", [torch.zeros(16)], "sinks"),
            ("kv_lora_rank", 256, "kv_lora_rank"),  # the call must agree with the definition
            ("qk_nope_head_dim", 64, None),
            ("qk_rope_head_dim", 32, None),
        ],
        [
            ("bmm1_scale", 0.07),
            ("bmm2_scale", 1.0),
            ("enable_pdl", True),
            ("workspace_buffer", torch.zeros(4, dtype=torch.uint8)),
        ],
    ),
    Api(
        "flashinfer.decode.xqa_batch_decode_with_kv_cache",
        "xqa_batch_decode_h64_kv8_d64_ps16",
        _xqa_batch_decode_build,
        [
            ("bmm1_scale", _ONE, "bmm1_scale"),
            ("bmm2_scale", _ONE, "bmm2_scale"),
            ("q_len_per_req", 2, "q_len_per_req"),
            ("o_scale", 0.5, "o_scale"),
            ("mask", torch.ones(3, 1, 2, dtype=torch.int16), "mask"),
            ("kv_cache_sf", (torch.zeros(1), torch.zeros(1)), "kv_cache_sf"),
            ("q_cu_seq_lens", torch.arange(4, dtype=torch.int32), "q_cu_seq_lens"),
            ("bmm2_scale", 2.0, "bmm2_scale"),  # Note [XQA scales of a 16-bit cache]
        ],
        [
            ("bmm1_scale", 0.3),
            ("bmm2_scale", 1.0),
            ("window_left", 127),
            ("sinks", torch.randn(64)),
            ("out", torch.zeros(3, 64, 64, dtype=torch.bfloat16)),
            ("enable_pdl", True),
            ("workspace_buffer", torch.zeros(4, dtype=torch.uint8)),
        ],
    ),
    Api(
        "flashinfer.xqa.xqa",
        "xqa_h64_kv8_d64_ps16",
        _xqa_build,
        [
            ("q_scale", _ONE, "q_scale"),
            ("kv_scale", 0.5, "kv_scale"),
            ("rcp_out_scale", 2.0, "rcp_out_scale"),
            ("q_seq_len", 2, "q_seq_len"),
            ("mask", torch.ones(3, 1, 2, dtype=torch.int16), "mask"),
            ("q_cu_seq_lens", torch.arange(4, dtype=torch.int32), "q_cu_seq_lens"),
            ("k_sf_cache", torch.zeros(1, dtype=torch.uint8), "k_sf_cache"),
            ("v_sf_cache", torch.zeros(1, dtype=torch.uint8), "v_sf_cache"),
            ("kv_layout", "NDH", "kv_layout"),
            ("num_kv_heads", 4, "num_kv_heads"),  # the call must agree with its caches
            ("page_size", 32, "page_size"),
        ],
        [
            ("q_scale", 0.7),
            ("sliding_win_size", 128),
            ("sinks", torch.randn(8, 8)),
            ("enable_pdl", True),
            ("sm_count", 132),
            ("semaphores", torch.zeros(4, dtype=torch.uint32)),
            ("workspace_buffer", torch.zeros(4, dtype=torch.uint8)),
        ],
    ),
    Api(
        "flashinfer.prefill.trtllm_batch_context_with_kv_cache",
        "trtllm_batch_context_h64_kv8_d64_ps16",
        _context_build,
        [
            ("bmm1_scale", _ONE, "bmm1_scale"),
            ("bmm2_scale", _ONE, "bmm2_scale"),
            ("out_dtype", torch.float16, "out_dtype,query"),
            ("o_sf_scale", 1.0, "o_sf_scale"),
            ("o_sf_vec_size", 16, "o_sf_vec_size"),
            ("kv_cache_sf", (torch.zeros(1), torch.zeros(1)), "kv_cache_sf"),
            ("skip_softmax_threshold_scale_factor", 0.5, "skip_softmax_threshold_scale_factor"),
            ("uses_shared_paged_kv_idx", False, "uses_shared_paged_kv_idx"),
            ("causal", False, "causal"),
            ("lse", torch.zeros(5, 64), "lse"),
            ("return_lse", True, "return_lse"),
            ("use_fp16_softmax", True, "use_fp16_softmax"),
            ("uses_spcompress", True, "uses_spcompress"),
        ],
        [
            ("bmm1_scale", 0.3),
            ("window_left", 3),
            ("sinks", torch.randn(64)),
            ("kv_layout", "HND"),
            ("out_dtype", torch.bfloat16),
            ("enable_pdl", True),
            ("backend", "auto"),
            ("multi_ctas_kv_counter_buffer", torch.zeros(4, dtype=torch.int32)),
            ("use_fp16_softmax", False),
            ("uses_spcompress", False),
        ],
    ),
]


def _cases(kind: str):
    return [
        pytest.param(api, *case, id=f"{api.path.rsplit('.', 1)[1]}-{case[0]}")
        for api in APIS
        for case in getattr(api, kind)
    ]


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.path.rsplit(".", 1)[1])
def test_a_call_with_flashinfers_defaults_is_routed(monkeypatch, api):
    args, kwargs, x = api.build(0)
    out = _route(monkeypatch, api.path, api.name, args, kwargs)
    _hit(out)
    # What the solution computed is what the call returns (or writes into its buffer).
    expected = _reference(api.name)(**out.seen[0])
    result = args[_positional(api.path).index(api.written)] if out.result is None else out.result
    assert _same(result, expected)


@pytest.mark.parametrize(("api", "param", "value", "rule"), _cases("refused"))
def test_a_ruled_parameter_the_definition_does_not_model_is_refused(
    monkeypatch, api, param, value, rule
):
    args, kwargs, _ = _with(api, param, value)
    out = _route(monkeypatch, api.path, api.name, args, kwargs)
    _refused(out, rule)
    assert out.originals[0][param] is value  # FlashInfer gets the call as it was made


@pytest.mark.parametrize(("api", "param", "value"), _cases("routed"))
def test_a_parameter_the_definition_reads_or_ignores_is_routed(monkeypatch, api, param, value):
    args, kwargs, _ = _with(api, param, value)
    out = _route(monkeypatch, api.path, api.name, args, kwargs)
    _hit(out)
    seen = out.seen[0]
    if isinstance(value, torch.Tensor) and param in seen:
        assert torch.equal(seen[param].flatten(), value.flatten())  # a view of it
    elif param in seen:
        assert seen[param] == value


def test_xqa_batch_decode_reference_agrees_with_flashinfers_template():
    args, _, x = _xqa_batch_decode_build(3)
    name = "xqa_batch_decode_h64_kv8_d64_ps16"
    inputs = {t.name: x[t.name] for t in _catalogue().defs[name].inputs} | {"sinks": None}
    theirs = _template("_xqa_batch_decode_reference")(
        *args, bmm1_scale=float(x["bmm1_scale"]), bmm2_scale=1.0, kv_layout="NHD"
    )
    _close(_reference(name)(**inputs), theirs)


def test_xqa_reference_agrees_with_flashinfers_template():
    import flashinfer.trace.templates.page as page

    args, _, x = _xqa_build(4)
    name = "xqa_h64_kv8_d64_ps16"
    inputs = {t.name: x[t.name] for t in _catalogue().defs[name].inputs}
    inputs |= {"sinks": None, "sliding_win_size": 0, "q_scale": 0.8}
    theirs = page._xqa_reference(*args[:5], q_scale=0.8)
    _close(_reference(name)(**inputs), theirs)


def test_trtllm_context_reference_agrees_with_flashinfers_template():
    args, _, x = _context_build(5)
    name = "trtllm_batch_context_h64_kv8_d64_ps16"
    inputs = {t.name: x[t.name] for t in _catalogue().defs[name].inputs} | {"sinks": None}
    inputs["window_left"] = -1
    theirs = _template("_trtllm_batch_context_reference")(*args[:12], kv_layout="HND")
    _close(_reference(name)(**inputs), theirs)


@pytest.mark.parametrize(
    "name", ["xqa_batch_decode_h64_kv8_d64_ps16", "xqa_h64_kv8_d64_ps16"], ids=["batch", "raw"]
)
def test_xqa_references_window_and_sinks_match_their_formulas(name):
    raw = name.startswith("xqa_h")
    build = _xqa_build if raw else _xqa_batch_decode_build
    _, _, x = build(6)
    inputs = {t.name: x[t.name] for t in _catalogue().defs[name].inputs}
    sinks = torch.randn(64) * 2
    inputs["sinks"] = sinks
    inputs["sliding_win_size" if raw else "window_left"] = 5 if raw else 4
    scale = float(inputs["q_scale"]) / 8 if raw else float(x["bmm1_scale"])
    out = _reference(name)(**inputs)
    pages_of = x["page_table" if raw else "block_tables"]
    for b in range(3):
        n = int(x["seq_lens"].flatten()[b])
        pages = pages_of[b, : (n + 15) // 16].long()
        k = x["k_cache"][pages].flatten(0, 1)[:n][-5:].repeat_interleave(8, dim=1)
        v = x["v_cache"][pages].flatten(0, 1)[:n][-5:].repeat_interleave(8, dim=1)
        q = x["q"][b, 0] if raw else x["query"][b]
        got = out[b, 0] if raw else out[b]
        _close(got, _attend(q, k, v, scale, sinks).to(torch.bfloat16))


def test_trtllm_context_reference_window_and_sinks_match_their_formulas():
    _, _, x = _context_build(7)
    name = "trtllm_batch_context_h64_kv8_d64_ps16"
    inputs = {t.name: x[t.name] for t in _catalogue().defs[name].inputs}
    sinks = torch.randn(64) * 2
    inputs |= {"sinks": sinks, "window_left": 2}
    out = _reference(name)(**inputs)
    cum = x["cum_seq_lens_q"]
    for b in range(2):
        n = int(x["seq_lens"][b])
        pages = x["block_tables"][b, : (n + 15) // 16].long()
        k = x["k_cache"][pages].flatten(0, 1)[:n].repeat_interleave(8, dim=1)
        v = x["v_cache"][pages].flatten(0, 1)[:n].repeat_interleave(8, dim=1)
        m = int(cum[b + 1] - cum[b])
        for i in range(m):
            pos = n - m + i  # end-aligned; the window keeps positions pos - 2 .. pos
            lo = max(0, pos - 2)
            want = _attend(x["query"][int(cum[b]) + i], k[lo : pos + 1], v[lo : pos + 1],
                           float(x["bmm1_scale"]), sinks)  # fmt: skip
            _close(out[int(cum[b]) + i], want.to(torch.bfloat16))


def test_mla_reference_agrees_with_flashinfers_template_for_one_query_token():
    _, _, x = _mla_build("batch_decode")(8)
    name = "trtllm_batch_decode_mla_dense_h16_d_qk576_ckv512_kpe64_nope128_ps32"
    inputs = {t.name: x[t.name] for t in _catalogue().defs[name].inputs}
    theirs = _template("_trtllm_batch_decode_mla_reference")(
        x["query"], x["kv_cache"], None, 128, 512, 64, x["block_tables"], x["seq_lens"],
        int(x["max_seq_len"]), bmm1_scale=float(x["bmm1_scale"]), bmm2_scale=1.0,
    )  # fmt: skip
    _close(_reference(name)(**inputs), theirs)


def test_mla_reference_masks_later_query_tokens_as_the_template_does_per_prefix():
    # With several query tokens, token i of m sees the first n - m + i + 1 keys: the same as
    # the template's reference (which masks nothing) on one token over that prefix.
    _, _, x = _mla_build("prefill")(9)
    name = "trtllm_prefill_mla_dense_h16_d_qk576_ckv512_kpe64_nope128_ps32"
    inputs = {t.name: x[t.name] for t in _catalogue().defs[name].inputs}
    out = _reference(name)(**inputs)
    template = _template("_trtllm_batch_decode_mla_reference")
    for i in range(3):
        prefix = x["seq_lens"] - 2 + i
        theirs = template(
            x["query"][:, i : i + 1], x["kv_cache"], None, 128, 512, 64, x["block_tables"],
            prefix, 0, bmm1_scale=float(x["bmm1_scale"]), bmm2_scale=1.0,
        )  # fmt: skip
        _close(out[:, i : i + 1], theirs)


def test_a_three_dimensional_mla_cache_reaches_the_solution_as_the_rank_4_view(monkeypatch):
    api = _mla_api("batch_decode")
    args, kwargs, x = api.build(0)
    args = (args[0], x["kv_cache"][:, 0]) + args[2:]
    out = _route(monkeypatch, api.path, api.name, args, kwargs)
    _hit(out)
    assert torch.equal(out.seen[0]["kv_cache"], x["kv_cache"])


def test_xqa_mla_reference_agrees_with_both_of_flashinfers_templates():
    # xqa_batch_decode_mla's template reference is trtllm_batch_decode_mla_dense's; the kernel
    # the wrapper calls is xqa_mla, whose template scales the logits by q_scale * kv_scale,
    # here bmm1_scale * 1.
    _, _, x = _xqa_mla_build(10)
    inputs = {t.name: x[t.name] for t in _catalogue().defs[XQA_MLA_NAME].inputs}
    ours = _reference(XQA_MLA_NAME)(**inputs)
    scale = float(x["bmm1_scale"])
    theirs = _template("_trtllm_batch_decode_mla_reference")(
        x["query"], x["kv_cache"], None, 128, 512, 64, x["block_tables"], x["seq_lens"],
        int(x["max_seq_len"]), bmm1_scale=scale, bmm2_scale=1.0,
    )  # fmt: skip
    _close(ours, theirs)
    from flashinfer.trace.templates.page import _xqa_mla_reference

    cache = x["kv_cache"][:, 0].unsqueeze(2)  # [pages, page_size, 1, 576], as the wrapper
    kernel = _xqa_mla_reference(
        x["query"], cache, cache, x["block_tables"], x["seq_lens"].unsqueeze(1),
        output=torch.empty(2, 1, 16, 512, dtype=torch.bfloat16), q_scale=scale, kv_scale=1.0,
    )  # fmt: skip
    _close(ours, kernel)


def test_xqa_mla_one_token_per_sequence_only(monkeypatch):
    api = next(a for a in APIS if a.name == XQA_MLA_NAME)
    args, kwargs, _ = api.build(0)
    args = (torch.cat([args[0], args[0]], dim=1),) + args[1:]  # two query tokens
    _refused(_route(monkeypatch, api.path, api.name, args, kwargs), "tensor:query")


def test_concat_mla_k_reference_agrees_with_flashinfers_template():
    _, _, x = _concat_k_build(11)
    k = torch.empty(5, 16, 192, dtype=torch.bfloat16)
    theirs = _template("_concat_mla_k_reference")(k, x["k_nope"], x["k_rope"])
    assert torch.equal(_reference(CONCAT_K_NAME)(x["k_nope"], x["k_rope"]), theirs)


def test_concat_mla_k_writes_the_callers_k_in_place(monkeypatch):
    api = next(a for a in APIS if a.name == CONCAT_K_NAME)
    args, kwargs, x = api.build(3)
    out = _route(monkeypatch, api.path, api.name, args, kwargs)
    _hit(out)
    assert out.result is None
    assert torch.equal(args[0][..., :128], x["k_nope"])
    assert torch.equal(args[0][..., 128:], x["k_rope"].expand(5, 16, 64))


def test_concat_mla_kv_quant_fp8_reference_is_the_saturating_cast():
    _, _, x = _concat_kv_build(12)
    kv_nope, k_pe = x["kv_nope"].clone(), x["k_pe"].clone()
    kv_nope[0, 0, :3] = torch.tensor([1000.0, -1e30, float("inf")])  # past e4m3's 448
    k_pe[1, :2] = torch.tensor([-float("inf"), 449.0])
    key, value = _reference(CONCAT_KV_NAME)(kv_nope, k_pe)
    theirs = _template("_concat_mla_kv_quant_fp8_reference")(kv_nope, k_pe)
    assert _same((key, value), theirs)
    # Saturated, never NaN: the docstring's finite overflow and +-inf to +-448.
    assert key[0, 0, :3].float().tolist() == [448.0, -448.0, 448.0]
    assert key[1, :, 128:130].float().unique(dim=0).tolist() == [[-448.0, 448.0]]
    assert torch.equal(value.float(), kv_nope[..., 128:].float().clamp(-448, 448).to(_FP8).float())


@pytest.mark.parametrize("causal", [True, False])
def test_ragged_deepseek_reference_agrees_with_flashinfers_template(causal):
    # The template's reference keeps window_left keys left of each query and none at -1 (a
    # window wider than any sequence is the causal mask it means), and writes an output of
    # the query's head dim, so it is compared where q and v have the same: 128.
    name = "trtllm_ragged_attention_deepseek_h32_d_qk128_d_v128"
    x, _ = _catalogue().inputs(
        name, seed=13, batch_size=2, batch_size_plus_1=3, num_q_tokens=5, num_kv_tokens=32
    )
    inputs = {t.name: x[t.name] for t in _catalogue().defs[name].inputs}
    inputs["is_causal"] = causal
    theirs = _template_of("gemm", "_trtllm_ragged_attention_deepseek_reference")(
        x["query"], x["key"], x["value"], None, x["seq_lens"], 16, 16,
        float(x["bmm1_scale"]), 1.0, 1.0, 2, 10**6, x["cum_seq_lens_q"],
        x["cum_seq_lens_kv"], None, causal, False,
    )  # fmt: skip
    _close(_reference(name)(**inputs), theirs)


def test_ragged_deepseek_causal_mask_is_end_aligned_with_deepseeks_head_dims():
    _, _, x = _ragged_build(14)
    inputs = {t.name: x[t.name] for t in _catalogue().defs[RAGGED_NAME].inputs}
    out = _reference(RAGGED_NAME)(**inputs)
    cum = x["cum_seq_lens_q"]
    m = int(cum[1] - cum[0])  # sequence 0: m queries over its 16 keys
    for i in range(m):
        n = 16 - m + i + 1  # query i sees keys 0 .. 16 - m + i
        for h in (0, 7):
            want = _attend(x["query"][i, h : h + 1], x["key"][:n, h : h + 1],
                           x["value"][:n, h : h + 1], float(x["bmm1_scale"]))  # fmt: skip
            _close(out[i, h : h + 1], want.to(torch.bfloat16))


def test_xqa_mla_kernel_reference_agrees_with_flashinfers_template():
    _, _, x = _xqa_mla_kernel_build(15)
    inputs = {t.name: x[t.name] for t in _catalogue().defs[XQA_MLA_KERNEL].inputs}
    ours = _reference(XQA_MLA_KERNEL)(**inputs)
    # The template rounds its result to q's FP8 unless told a dtype; in float32 without an
    # output it gives every column of the value rows, of which the kernel writes 512.
    theirs = _template_of("page", "_xqa_mla_reference")(
        x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["seq_lens"],
        output_dtype=torch.float32, q_scale=float(x["q_scale"]), kv_scale=1.0,
    )  # fmt: skip
    _close(ours, theirs[..., :512].to(torch.bfloat16))


@pytest.mark.parametrize("layout", ["PACKED_QKV", "CONTIGUOUS_Q_KV", "SEPARATE_Q_K_V"])
def test_fmha_v2_layouts_reach_the_solution_as_the_same_views(monkeypatch, layout):
    name = "trtllm_fmha_v2_prefill_h32_kv32_d128"
    args, _, x = _fmha_v2_build(4, name)
    q, k, v = x["query"], x["key"], x["value"]
    if layout == "PACKED_QKV":  # self-attention: as many keys as queries
        q = q.new_empty(32, 32, 128).normal_()
        qkv = torch.stack([q, k, v], dim=1)
        cum_q = x["cum_seq_lens_kv"]
    else:
        qkv = (q, torch.stack([k, v], dim=1)) if layout == "CONTIGUOUS_Q_KV" else (q, k, v)
        cum_q = x["cum_seq_lens_q"]
    args = (qkv, layout) + args[2:9] + (cum_q, x["cum_seq_lens_kv"])
    out = _route(monkeypatch, "flashinfer.prefill.trtllm_fmha_v2_prefill", name, args, {})
    _hit(out)
    seen = out.seen[0]
    assert torch.equal(seen["query"], q) and torch.equal(seen["key"], k)
    assert torch.equal(seen["value"], v) and seen["causal"] is True


@pytest.mark.parametrize("mask_mode", ["causal", "padding"])
def test_fmha_v2_reference_agrees_with_flashinfers_template(mask_mode):
    # The template's reference is causal whatever mask_mode says, and takes q, k and v of
    # the same heads; "padding" is checked against the formula.
    name = "trtllm_fmha_v2_prefill_h32_kv32_d128"
    _, _, x = _fmha_v2_build(5, name)
    inputs = {t.name: x[t.name] for t in _catalogue().defs[name].inputs}
    inputs["causal"] = mask_mode == "causal"
    ours = _reference(name)(**inputs)
    if mask_mode == "causal":
        theirs = _template_of("page", "_trtllm_fmha_v2_prefill_reference")(
            (x["query"], x["key"], x["value"]), x["seq_lens"], 16, 16,
            float(x["bmm1_scale"]), 1.0, 2, x["cum_seq_lens_q"], x["cum_seq_lens_kv"],
        )  # fmt: skip
        _close(ours, theirs)
        return
    cum, scale = x["cum_seq_lens_q"], float(x["bmm1_scale"])
    for b in range(2):
        k0 = int(x["cum_seq_lens_kv"][b])
        k, v = x["key"][k0 : k0 + 16], x["value"][k0 : k0 + 16]
        for i in range(int(cum[b]), int(cum[b + 1])):
            _close(ours[i], _attend(x["query"][i], k, v, scale).to(torch.bfloat16))


def test_fmha_v2_reference_repeats_key_value_heads_for_gqa():
    _, _, x = _fmha_v2_build(6)
    inputs = {t.name: x[t.name] for t in _catalogue().defs[FMHA_V2_NAME].inputs}
    ours = _reference(FMHA_V2_NAME)(**inputs)
    mha = dict(inputs, key=x["key"].repeat_interleave(8, dim=1))
    mha["value"] = x["value"].repeat_interleave(8, dim=1)
    assert torch.equal(ours, _reference(FMHA_V2_NAME)(**mha))


@pytest.mark.parametrize(
    ("kind", "causal"), [("sm120", True), ("sm120", False), ("deepseek", True)]
)
def test_fmha_v2_sm120_references_agree_with_flashinfers_templates(kind, causal):
    name, build = _sm120_build(kind)
    args, _, x = build(16)
    inputs = {t.name: x[t.name] for t in _catalogue().defs[name].inputs}
    if kind == "sm120":
        inputs["causal"] = causal
    theirs = torch.zeros_like(args[3])  # the templates write it
    extra = {"causal": causal} if kind == "sm120" else {}
    _template_of("gemm", f"_fmha_v2_prefill_{kind}_reference")(
        x["query"], x["key"], x["value"], theirs, *args[4:7], 1.0,
        scale_bmm1=float(x["scale_bmm1"]), scale_bmm2=1.0, **extra,
    )  # fmt: skip
    _close(_reference(name)(**inputs), theirs)


def test_fmha_v2_sm120_unset_scales_are_one(monkeypatch):
    api = _sm120_api("sm120")
    args, _, _ = api.build(0)
    out = _route(monkeypatch, api.path, api.name, args, {"scale_bmm1": None, "scale_bmm2": None})
    _hit(out)
    assert out.seen[0]["scale_bmm1"] == 1.0 and out.seen[0]["scale_bmm2"] == 1.0


@pytest.mark.parametrize("causal", [True, False])
def test_msa_sparse_attention_reference_agrees_with_flashinfers_template(causal):
    args, _, x = _msa_build(5)
    # Ids past a sequence's blocks select nothing, in both; so does a row of -1s.
    q2k = x["q2k_indices"].clone()
    q2k[0, 0, 0], q2k[1, 1, :] = 99, -1
    args = args[:3] + (q2k,) + args[4:]
    ours = _reference(MSA_NAME)(*args, causal, 0.09)
    theirs = _template_of("msa", "_msa_sparse_attention_reference")(
        *args, causal=causal, softmax_scale=0.09
    )
    _close(ours, theirs, atol=1e-2)
    assert (ours[:, 2:][1] == 0).all()  # query 1 of KV head 1 sees nothing: zeros


@pytest.mark.parametrize("causal", [True, False])
def test_msa_sparse_decode_attention_reference_agrees_with_flashinfers_template(causal):
    args, kwargs, x = _msa_decode_build(6)
    ours = _reference(MSA_DECODE_NAME)(*args, x["cu_seqlens_k"], causal, 0.09)
    theirs = _template_of("msa", "_msa_sparse_decode_attention_reference")(
        *args, x["cu_seqlens_k"], seqlen_q=1, causal=causal, softmax_scale=0.09
    )
    _close(ours, theirs, atol=1e-2)
    # Decode is prefill with seqlen_q tokens for each sequence.
    cu_q = torch.arange(0, 3, dtype=torch.int32)
    prefill = _reference(MSA_NAME)(*args, cu_q, x["cu_seqlens_k"], causal, 0.09)
    assert torch.equal(ours, prefill)
    # Two tokens per sequence (what the reference takes from total_q / batch_size): the
    # first sits one position earlier, so causal hides the last key from it.
    q, k, v, q2k = args
    two = (q.repeat_interleave(2, 0), k, v, q2k.repeat_interleave(2, 1), x["cu_seqlens_k"])
    ours = _reference(MSA_DECODE_NAME)(*two, causal, 0.09)
    theirs = _template_of("msa", "_msa_sparse_decode_attention_reference")(
        *two, seqlen_q=2, causal=causal, softmax_scale=0.09
    )
    _close(ours, theirs, atol=1e-2)


def test_msa_sparse_attention_leaves_a_strided_selection_to_flashinfer(monkeypatch):
    args, _, x = _msa_build(0)
    strided = x["q2k_indices"].transpose(0, 1).contiguous().transpose(0, 1)
    assert torch.equal(strided, x["q2k_indices"]) and not strided.is_contiguous()
    args = args[:3] + (strided,) + args[4:]
    api = "flashinfer.msa_ops.sparse_prefill.msa_sparse_attention"
    _refused(_route(monkeypatch, api, MSA_NAME, args, {}), "q2k_indices")


@pytest.mark.parametrize("row", ["hole", "repeat", "descending"])
@pytest.mark.parametrize("decode", [False, True])
def test_msa_sparse_attention_routes_only_ascending_selections_then_padding(
    monkeypatch, row, decode
):
    # FlashInfer's SM120 kernels stop a row at its first -1 and count a repeated block twice;
    # its SM100 kernel reads the whole row: they agree only on ascending ids, then -1s.
    args, kwargs, x = _msa_decode_build(6) if decode else _msa_build(0)
    q2k = x["q2k_indices"].clone()
    first = q2k[0, 0]
    assert int(first[0]) >= 0 and int(first[1]) >= 0
    if row == "hole":
        first[0] = -1
    elif row == "repeat":
        first[1] = first[0]
    else:
        first[0], first[1] = int(first[1]), int(first[0])
    args = args[:3] + (q2k,) + args[4:]
    api, name = (
        ("flashinfer.msa_ops.sparse_decode.msa_sparse_decode_attention", MSA_DECODE_NAME)
        if decode
        else ("flashinfer.msa_ops.sparse_prefill.msa_sparse_attention", MSA_NAME)
    )
    _refused(_route(monkeypatch, api, name, args, kwargs), "q2k_indices")


def test_msa_sparse_decode_attention_leaves_strided_operands_to_flashinfer(monkeypatch):
    args, kwargs, x = _msa_decode_build(6)
    api = "flashinfer.msa_ops.sparse_decode.msa_sparse_decode_attention"
    strided = x["q2k_indices"].transpose(0, 1).contiguous().transpose(0, 1)
    routed = _route(monkeypatch, api, MSA_DECODE_NAME, args[:3] + (strided,) + args[4:], kwargs)
    _refused(routed, "q2k_indices")
    q = args[0].transpose(0, 1).contiguous().transpose(0, 1)
    assert not q.is_contiguous()
    _refused(_route(monkeypatch, api, MSA_DECODE_NAME, (q,) + args[1:], kwargs), "q,k,v")


@pytest.mark.parametrize(
    "kwargs, rule",
    [
        # FlashInfer: 0 < num_valid_pages <= max_k_tiles (max_score's blocks), at least the
        # forced blocks. The rules read the scalar (a let over num_valid_pages and max_score)
        # before the let makes it per token, and are named by the parameters they read.
        ({"num_valid_pages": 0}, "num_valid_pages,max_score"),
        ({"num_valid_pages": 10_000}, "num_valid_pages,max_score"),
        (
            {"num_valid_pages": 4, "force_begin_blocks": 3, "force_end_blocks": 2},
            "num_valid_pages,max_score,force_begin_blocks,force_end_blocks",
        ),
        ({"force_begin_blocks": -1}, "force_begin_blocks,force_end_blocks"),
    ],
)
def test_msa_topk_select_leaves_what_flashinfer_refuses_to_it(monkeypatch, kwargs, rule):
    args, _, _ = _topk_build(17)
    api = "flashinfer.msa_ops.sparse_topk_select.msa_topk_select"
    _refused(_route(monkeypatch, api, TOPK_NAME, args, kwargs), rule)


def test_msa_topk_select_leaves_a_strided_max_score_to_flashinfer(monkeypatch):
    args, _, _ = _topk_build(17)
    strided = args[0].transpose(1, 2).contiguous().transpose(1, 2)
    assert torch.equal(strided, args[0]) and not strided.is_contiguous()
    api = "flashinfer.msa_ops.sparse_topk_select.msa_topk_select"
    _refused(_route(monkeypatch, api, TOPK_NAME, (strided,) + args[1:], {}), "max_score")


def test_msa_sparse_attention_reference_attends_the_selected_blocks_only():
    # One sequence of 3 blocks (300 keys); one query token selecting block 1 only, so it
    # attends keys 128..255 with a plain softmax; causal with 300 keys leaves them all.
    torch.manual_seed(0)
    q, k, v = (torch.randn(n, h, 128).bfloat16() for n, h in ((1, 4), (300, 2), (300, 2)))
    q2k = torch.full((2, 1, 16), -1, dtype=torch.int32)
    q2k[:, 0, 0] = 1
    cu_q, cu_k = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 300], dtype=torch.int32)
    out = _reference(MSA_NAME)(q, k, v, q2k, cu_q, cu_k, True, 0.1)
    for h in range(4):
        kk, vv = k[128:256, h // 2].float(), v[128:256, h // 2].float()
        want = torch.softmax(q[0, h].float() @ kk.T * 0.1, -1) @ vv
        _close(out[0, h], want.bfloat16(), atol=1e-2)


@pytest.mark.parametrize("valid", [None, 12, "per-token"])
def test_msa_topk_select_reference_agrees_with_flashinfers_template(monkeypatch, valid):
    # Through the dispatcher, so that None and an int become the per-token counts the
    # definition takes as the rule's `let` makes them.
    args, _, x = _topk_build(17)
    if valid == "per-token":
        valid = torch.tensor([0, 3, 16, 20, 40, 99], dtype=torch.int32)
    kwargs = {"num_valid_pages": valid, "force_begin_blocks": 2, "force_end_blocks": 3}
    api = "flashinfer.msa_ops.sparse_topk_select.msa_topk_select"
    out = _route(monkeypatch, api, TOPK_NAME, args, kwargs)
    _hit(out)
    theirs = _template_of("msa", "_msa_topk_select_reference")(x["max_score"], 16, **kwargs)
    assert torch.equal(out.result, theirs)
    if torch.is_tensor(valid):  # token 1 has 3 valid blocks: all kept, then -1s
        row = out.result[1, 0]
        assert row[:3].tolist() == [0, 1, 2] and (row[3:] == -1).all()


def test_msa_sparse_decode_falls_back_inside_graph_capture_without_reading_its_selection(
    monkeypatch,
):
    # Its selection rule reads tensor values on the host, which capture forbids (Note [data
    # rules in capture]): inside capture the call goes to FlashInfer, counted by the rule.
    from fibgen.runtime.launch import capture

    args, kwargs, _ = _msa_decode_build(6)
    api = "flashinfer.msa_ops.sparse_decode.msa_sparse_decode_attention"
    _hit(_route(monkeypatch, api, MSA_DECODE_NAME, args, kwargs))
    monkeypatch.setattr(capture, "is_capturing", lambda: True)
    _refused(_route(monkeypatch, api, MSA_DECODE_NAME, args, kwargs), "q2k_indices")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: a real capture")
def test_msa_sparse_decode_falls_back_inside_a_real_graph_capture(monkeypatch):
    # The same on a GPU: the whole fallback path (rules, counters, the original) must enqueue
    # nothing that synchronizes, or the capture raises. FlashInfer's kernel is SM100's, so the
    # original is the recording stand-in; the routed call before it runs the reference.
    def to_gpu(v):
        return v.cuda() if torch.is_tensor(v) else v

    args, kwargs, _ = _msa_decode_build(6)
    args, kwargs = tuple(map(to_gpu, args)), {k: to_gpu(v) for k, v in kwargs.items()}
    api = "flashinfer.msa_ops.sparse_decode.msa_sparse_decode_attention"
    owner, attr = patching._locate(api)
    originals: list = []
    monkeypatch.setattr(owner, attr, _recorder(getattr(owner, attr), originals))
    rt.enable_apply({MSA_DECODE_NAME: _reference(MSA_DECODE_NAME)})
    try:
        call = getattr(owner, attr)
        call(*args, **kwargs)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            result = call(*args, **kwargs)
        counts = rt.stats()[api]
    finally:
        rt.disable_apply()
    assert result == "flashinfer" and len(originals) == 1
    assert counts["hit"] == 1 and counts["rules"] == {"q2k_indices": 1}, counts
