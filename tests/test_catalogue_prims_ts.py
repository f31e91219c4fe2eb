"""The PrimTS attention families (``definitions/attention_prims_ts.fidef``) against the real
FlashInfer.

FlashInfer 0.7.2.post1 is installed; its PrimTS kernels need an SM100 GPU, so its functions
are never run here. For each API the real function (and a wrapper's plan) is replaced by a
recorder with its signature before apply is enabled, and each check calls the patched API:

- a call with FlashInfer's defaults is routed, and the solution sees the definition's inputs;
- each ruled parameter at a value the definition does not model is refused with its rule
  counted, and reaches FlashInfer's function unchanged; launch options never stop a call;
- the reference agrees with independent computations: the reference of FlashInfer's own
  trace template ``trtllm_batch_decode`` (the same block-table decode, HND), and a direct
  softmax over the keys a window keeps.
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
from _shared import catalogue_module, require_module, strided

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _prims_ts_calls as calls  # noqa: E402
import _routable_calls as routable  # noqa: E402

import fibgen.runtime as rt  # noqa: E402
from fibgen.runtime.routing import patching  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:fibgen. .* never matched:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::flashinfer.api_logging.ExperimentalWarning"),
]

DECODE = "flashinfer.attention.prims_ts.decode.batch_decode_with_paged_kv_cache"
WRAPPER = "flashinfer.attention.prims_ts.decode.BatchDecodePagedTSWrapper.run"
PLAN = "flashinfer.attention.prims_ts.decode.BatchDecodePagedTSWrapper.plan"


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


@dataclass
class Outcome:
    result: Any
    seen: list  # the inputs each solution call got
    originals: list  # the arguments FlashInfer's function got, as its signature binds them
    counts: dict


def _recorder(real, calls_, plan_state=False):
    sig = inspect.signature(real)

    def original(*args, **kwargs):
        calls_.append(sig.bind(*args, **kwargs).arguments)
        if plan_state:  # what FlashInfer's plan() does to the wrapper: a new plan state
            args[0]._plan_state = object()
        return "flashinfer"

    original.__signature__ = sig
    return original


def _solution(name, seen):
    ref = _reference(name)

    def solution(**inputs):
        seen.append(inputs)
        return ref(**inputs)

    return solution


def _route(monkeypatch, name: str, args: tuple, kwargs: dict, path: str = DECODE) -> Outcome:
    """Call the patched one-shot API with a solution for ``name`` that runs the reference."""
    owner, attr = patching._locate(path)
    originals: list = []
    monkeypatch.setattr(owner, attr, _recorder(getattr(owner, attr), originals))
    seen: list = []
    rt.enable_apply({name: _solution(name, seen)})
    result = getattr(owner, attr)(*args, **kwargs)
    counts = rt.stats()[path]
    rt.disable_apply()
    return Outcome(result, seen, originals, counts)


def _route_wrapper(monkeypatch, name, plan: tuple[tuple, dict], args, kwargs, W=None) -> Outcome:
    """plan() then run() of a PrimTS wrapper through the patched methods."""
    from flashinfer.attention.prims_ts.decode import BatchDecodePagedTSWrapper

    W = BatchDecodePagedTSWrapper if W is None else W
    path = f"{W.__module__}.{W.__qualname__}.run"

    plans: list = []
    originals: list = []
    monkeypatch.setattr(W, "plan", _recorder(W.plan, plans, plan_state=True))
    monkeypatch.setattr(W, "run", _recorder(W.run, originals))
    seen: list = []
    rt.enable_apply({name: _solution(name, seen)})
    wrapper = W()  # the constructor needs no GPU: it checks the layout only
    wrapper.plan(*plan[0], **plan[1])
    result = wrapper.run(*args, **kwargs)
    counts = rt.stats()[path]
    rt.disable_apply()
    assert len(plans) == 1  # the plan always reaches FlashInfer
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
    assert a.shape == b.shape
    assert (a.float() - b.float()).abs().max().item() <= atol


# ---------------------------------------------------------------------------------------
# batch_decode_with_paged_kv_cache
# ---------------------------------------------------------------------------------------

NAME = calls.DECODE_NAME


def _case(seed: int = 0):
    return calls.decode_case(_catalogue(), NAME, seed)


def _args(x, cache=None):
    cache = calls.combined_cache(x) if cache is None else cache
    return (x["q"], cache, x["block_tables"], x["seq_lens_kv"])


def test_decode_with_flashinfers_defaults_is_routed(monkeypatch):
    x, _ = _case()
    combined = calls.combined_cache(x)
    out = _route(monkeypatch, NAME, _args(x, combined), {})
    _hit(out)
    (seen,) = out.seen
    # The one HND tensor reaches the solution as K and V views of the caller's storage.
    assert torch.equal(seen["k_cache"], x["k_cache"]) and torch.equal(seen["v_cache"], x["v_cache"])
    assert seen["k_cache"].data_ptr() == combined.data_ptr()
    # bmm1_scale None is 1/sqrt(head_dim), as FlashInfer resolves it.
    assert (seen["bmm1_scale"], seen["bmm2_scale"], seen["window_left"]) == (
        1 / math.sqrt(128),
        1.0,
        -1,
    )
    assert torch.equal(out.result, _reference(NAME)(**seen))


def test_decode_takes_the_cache_as_a_tuple_too(monkeypatch):
    x, _ = _case()
    out = _route(monkeypatch, NAME, _args(x, (x["k_cache"], x["v_cache"])), {})
    _hit(out)
    assert out.seen[0]["k_cache"] is x["k_cache"] and out.seen[0]["v_cache"] is x["v_cache"]


def test_decode_values_the_definition_reads_reach_the_solution(monkeypatch):
    x, axes = _case()
    buf = _catalogue().buffer(NAME, "output", axes)
    kwargs = {"bmm1_scale": 0.3, "bmm2_scale": 2.0, "mask_type": "causal", "window_left": 5}
    out = _route(monkeypatch, NAME, _args(x), kwargs | {"out": buf})
    _hit(out)
    (seen,) = out.seen
    assert (seen["bmm1_scale"], seen["bmm2_scale"], seen["window_left"]) == (0.3, 2.0, 5)
    assert out.result is buf and torch.equal(buf, _reference(NAME)(**seen))


@pytest.mark.parametrize(
    ("param", "value", "rule"),
    [
        ("kv_layout", "NHD", "kv_layout"),
        ("kv_scale_factors", (torch.zeros(1), torch.zeros(1)), "kv_scale_factors"),
        ("seq_len_q", 2, "seq_len_q"),
        ("qo_indptr", torch.arange(4, dtype=torch.int32), "qo_indptr"),
        ("max_seq_len_q", 2, "max_seq_len_q"),
        ("mask_type", "sliding", "mask_type"),
        ("window_left", 5, "window_left,mask_type"),  # a window needs the causal mask
        ("bmm1_scale", torch.ones(()), "bmm1_scale"),
        ("bmm1_scale", -1.0, "bmm1_scale"),
        ("bmm2_scale", 0.0, "bmm2_scale"),
        ("out_dtype", torch.float16, "out_dtype,q"),
        ("page_size", 8, "page_size"),  # encoded sub-page locators in the block table
    ],
)
def test_decode_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, param, value, rule
):
    x, _ = _case()
    out = _route(monkeypatch, NAME, _args(x), {param: value})
    _refused(out, rule)
    assert out.originals[0][param] is value


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("split_kv", False),
        ("workspace_buffer", torch.zeros(64, dtype=torch.int8)),
        ("max_kv_len", 4096),
        ("validate", False),
        ("page_size", 16),
        ("out_dtype", torch.bfloat16),
        ("mask_type", "causal"),
    ],
)
def test_decode_launch_options_never_stop_a_call(monkeypatch, param, value):
    x, _ = _case()
    _hit(_route(monkeypatch, NAME, _args(x), {param: value}))


def test_decode_inputs_of_another_dtype_or_shape_are_refused(monkeypatch):
    x, _ = _case()
    args = list(_args(x))
    args[1] = args[1].to(torch.float8_e4m3fn)  # an FP8 cache
    _refused(_route(monkeypatch, NAME, tuple(args), {}), "tensor:k_cache")
    args = list(_args(x))
    args[0] = x["q"][:, None].expand(3, 2, 32, 128)  # fixed multi-token queries [B, SQ, H, D]
    _refused(_route(monkeypatch, NAME, tuple(args), {"seq_len_q": 2}), "tensor:q")


def test_decode_reference_agrees_with_flashinfers_trtllm_template():
    import flashinfer.trace.templates.attention as templates

    for seed in range(3):
        x, _ = _case(seed)
        ours = _reference(NAME)(
            x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["seq_lens_kv"], 0.2, 0.5, -1
        )
        theirs = templates._trtllm_paged_attention_reference(
            x["q"], calls.combined_cache(x), x["block_tables"], x["seq_lens_kv"],
            bmm1_scale=0.2, bmm2_scale=0.5, kv_layout="HND",
        )  # fmt: skip
        _close(ours, theirs)


def test_decode_reference_keeps_the_last_window_left_plus_one_keys():
    x, _ = _case(seed=4)
    window = 6
    ours = _reference(NAME)(
        x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["seq_lens_kv"], 0.1, 1.0, window
    )
    page_size = x["k_cache"].shape[2]
    for b in range(3):
        n = int(x["seq_lens_kv"][b])
        pages = x["block_tables"][b, : math.ceil(n / page_size)].long()
        k = x["k_cache"][pages].transpose(1, 2).flatten(0, 1)[:n]
        v = x["v_cache"][pages].transpose(1, 2).flatten(0, 1)[:n]
        keep = slice(max(0, n - 1 - window), n)  # the query at n - 1 and window keys before it
        for h in range(32):
            logits = (x["q"][b, h].float() @ k[keep, h // 4].float().T) * 0.1
            expected = logits.softmax(-1) @ v[keep, h // 4].float()
            _close(ours[b, h], expected)


# ---------------------------------------------------------------------------------------
# BatchDecodePagedTSWrapper.plan / run
# ---------------------------------------------------------------------------------------

WNAME = calls.WRAPPER_NAME


def _wcase(seed: int = 0):
    return calls.decode_case(_catalogue(), WNAME, seed)


def _plan(**changes):
    """FlashInfer's defaults but the geometry and the dtype of a bfloat16 cache."""
    args, _ = calls.wrapper_plan()
    return args, {"q_data_type": torch.bfloat16} | changes


def _wargs(x):
    return (x["q"], calls.combined_cache(x), x["seq_lens"], x["block_tables"])


def test_wrapper_with_flashinfers_defaults_is_routed(monkeypatch):
    x, _ = _wcase()
    out = _route_wrapper(monkeypatch, WNAME, _plan(), _wargs(x), {})
    _hit(out)
    (seen,) = out.seen
    assert torch.equal(seen["k_cache"], x["k_cache"]) and torch.equal(seen["v_cache"], x["v_cache"])
    assert (seen["bmm1_scale"], seen["bmm2_scale"], seen["window_left"]) == (
        1 / math.sqrt(128),
        1.0,
        -1,
    )
    assert torch.equal(out.result, _reference(WNAME)(**seen))


def test_wrapper_reads_the_window_from_the_plan(monkeypatch):
    x, _ = _wcase()
    plan = _plan(mask_type="causal", window_left=7)
    out = _route_wrapper(monkeypatch, WNAME, plan, _wargs(x), {"bmm1_scale": 0.25})
    _hit(out)
    assert (out.seen[0]["window_left"], out.seen[0]["bmm1_scale"]) == (7, 0.25)


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"max_seq_len_q": 2}, "plan.max_seq_len_q"),
        ({"packed_query": True}, "plan.packed_query"),
        ({"q_data_type": torch.float16}, "plan.q_data_type"),
        ({"kv_data_type": torch.uint8}, "plan.kv_data_type"),
        ({"v_data_type": torch.float8_e4m3fn}, "plan.v_data_type"),
        ({"o_data_type": torch.float16}, "plan.o_data_type"),
        ({"window_left": 3}, "plan.window_left,plan.mask_type"),
        ({"seq_lens": [5, 6, 7]}, "plan.seq_lens"),
        ({"storage_page_size": 32}, "plan.storage_page_size,plan.page_size"),
    ],
)
def test_wrapper_plans_the_definition_does_not_model_are_refused(monkeypatch, changes, rule):
    x, _ = _wcase()
    out = _route_wrapper(monkeypatch, WNAME, _plan(**changes), _wargs(x), {})
    _refused(out, rule)


def test_wrapper_a_plan_of_another_batch_size_is_refused(monkeypatch):
    x, _ = _wcase()
    args, kwargs = _plan()
    out = _route_wrapper(monkeypatch, WNAME, ((*args[:1], 4, *args[2:]), kwargs), _wargs(x), {})
    _refused(out, "q,plan.batch_size")


@pytest.mark.parametrize(
    ("param", "value", "rule"),
    [
        ("kv_scale_factors", (torch.zeros(1), torch.zeros(1)), "kv_scale_factors"),
        ("qo_indptr", torch.arange(4, dtype=torch.int32), "qo_indptr"),
        ("bmm2_scale", torch.ones(()), "bmm2_scale"),
    ],
)
def test_wrapper_runs_the_definition_does_not_model_are_refused(monkeypatch, param, value, rule):
    x, _ = _wcase()
    out = _route_wrapper(monkeypatch, WNAME, _plan(), _wargs(x), {param: value})
    _refused(out, rule)
    assert out.originals[0][param] is value


def test_wrapper_launch_options_never_stop_a_call(monkeypatch):
    x, _ = _wcase()
    args, kwargs = _plan(split_kv=False, validate=False, initialize_workspace=False)
    kwargs["workspace_buffer"] = torch.zeros(64, dtype=torch.int8)
    args = ("cuda:1", *args[1:6], 9999)  # another device name and KV capacity
    _hit(_route_wrapper(monkeypatch, WNAME, (args, kwargs), _wargs(x), {"validate": False}))


# ---------------------------------------------------------------------------------------
# batch_mla_decode_with_paged_kv_cache and BatchMLADecodePagedTSWrapper
# ---------------------------------------------------------------------------------------

MLA = "flashinfer.attention.prims_ts.mla_decode.batch_mla_decode_with_paged_kv_cache"
MNAME = calls.MLA_NAME
MWNAME = calls.MLA_WRAPPER_NAME


def _mcase(seed: int = 0, seq_len_q: int = 2, name: str = MNAME):
    return calls.mla_case(_catalogue(), name, seed, seq_len_q)


def _margs(x, cache=None):
    cache = x["kv_cache"] if cache is None else cache
    return (x["query"], cache, x["block_tables"], x["seq_lens"])


def test_mla_with_flashinfers_defaults_is_routed(monkeypatch):
    x, _ = _mcase()
    out = _route(monkeypatch, MNAME, _margs(x), {}, MLA)
    _hit(out)
    (seen,) = out.seen
    assert seen["kv_cache"] is x["kv_cache"]
    # FlashInfer's defaults: the causal mask and unit scales.
    assert (seen["causal"], seen["bmm1_scale"], seen["bmm2_scale"]) == (True, 1.0, 1.0)
    assert torch.equal(out.result, _reference(MNAME)(**seen))


def test_mla_takes_the_rank_4_cache_and_the_dense_mask(monkeypatch):
    x, _ = _mcase()
    rank4 = x["kv_cache"][:, None]  # [pages, 1, page_size, 576]
    kwargs = {"mask_type": "dense", "bmm1_scale": 0.07, "bmm2_scale": 2.0}
    out = _route(monkeypatch, MNAME, _margs(x, rank4), kwargs, MLA)
    _hit(out)
    (seen,) = out.seen
    assert torch.equal(seen["kv_cache"], x["kv_cache"]) and seen["kv_cache"].data_ptr() == (
        rank4.data_ptr()
    )
    assert (seen["causal"], seen["bmm1_scale"], seen["bmm2_scale"]) == (False, 0.07, 2.0)


@pytest.mark.parametrize(
    ("param", "value", "rule"),
    [
        ("qo_indptr", torch.tensor([0, 2, 4], dtype=torch.int32), "qo_indptr"),
        ("max_seq_len_q", 3, "max_seq_len_q,query"),
        ("kv_lora_rank", 256, None),  # named like the definition's const: another's
        ("qk_rope_head_dim", 32, None),
        ("mask_type", "sliding", "mask_type"),
        ("bmm1_scale", torch.ones(()), "bmm1_scale"),
        ("bmm2_scale", -1.0, "bmm2_scale"),
        ("out_dtype", torch.float16, "out_dtype"),
    ],
)
def test_mla_parameters_the_definition_does_not_model_are_refused(monkeypatch, param, value, rule):
    x, _ = _mcase()
    out = _route(monkeypatch, MNAME, _margs(x), {param: value}, MLA)
    _refused(out, rule)
    assert out.originals[0][param] is value


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("max_kv_len", 4096),
        ("workspace_buffer", torch.zeros(64, dtype=torch.int8)),
        ("validate", False),
        ("max_seq_len_q", 2),
        ("kv_lora_rank", 512),
    ],
)
def test_mla_launch_options_never_stop_a_call(monkeypatch, param, value):
    x, _ = _mcase()
    _hit(_route(monkeypatch, MNAME, _margs(x), {param: value}, MLA))


def test_mla_an_fp8_cache_or_a_packed_query_is_refused(monkeypatch):
    x, _ = _mcase()
    args = list(_margs(x))
    args[0], args[1] = args[0].to(torch.float8_e4m3fn), args[1].to(torch.float8_e4m3fn)
    _refused(_route(monkeypatch, MNAME, tuple(args), {}, MLA), "tensor:query")
    args = list(_margs(x))
    args[0] = x["query"].flatten(0, 1)  # packed [total_q, heads, 576] without qo_indptr
    _refused(_route(monkeypatch, MNAME, tuple(args), {}, MLA), "tensor:query")


def _mla_direct(x, bmm1_scale, bmm2_scale, causal):
    """softmax over each query's visible keys, one (sequence, query, head) at a time."""
    q, cache, tables, lens = x["query"], x["kv_cache"], x["block_tables"], x["seq_lens"]
    batch, sq, heads, _ = q.shape
    page_size = cache.shape[1]
    out = torch.zeros(batch, sq, heads, 512)
    for b in range(batch):
        n = int(lens[b])
        rows = torch.cat([cache[int(p)] for p in tables[b, : math.ceil(n / page_size)]])[:n]
        for s in range(sq):
            visible = n - (sq - 1 - s) if causal else n  # the kernel's mask_visible_k_length
            kv = rows[:visible].float()
            for h in range(heads):
                p = ((kv @ q[b, s, h].float()) * bmm1_scale).softmax(-1)
                out[b, s, h] = (p @ kv[:, :512]) * bmm2_scale
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_mla_reference_agrees_with_a_direct_computation(causal):
    for seed, sq in ((1, 1), (2, 3)):
        x, _ = _mcase(seed, sq)
        ours = _reference(MNAME)(
            x["query"], x["kv_cache"], x["block_tables"], x["seq_lens"], causal, 0.05, 0.5
        )
        _close(ours, _mla_direct(x, 0.05, 0.5, causal))


def test_mla_reference_of_one_query_agrees_with_flashinfers_mla_decode_template():
    import flashinfer.trace.templates.attention as templates

    x, _ = _mcase(seed=3, seq_len_q=1)
    # FlashInfer's mla_paged decode reference over kv_indptr / kv_indices of full pages:
    # the block table's pages, with sequence lengths that fill them.
    lens = torch.tensor([32, 96], dtype=torch.int32)
    ours = _reference(MNAME)(x["query"], x["kv_cache"], x["block_tables"], lens, True, 0.05, 1.0)
    used = [x["block_tables"][0, :1], x["block_tables"][1, :3]]
    indices = torch.cat(used).to(torch.int32)
    indptr = torch.tensor([0, 1, 4], dtype=torch.int32)
    q = x["query"][:, 0]
    theirs = templates._mla_paged_decode_reference(
        q[..., :512], q[..., 512:], x["kv_cache"][..., :512], x["kv_cache"][..., 512:],
        indptr, indices, 0.05,
    )  # fmt: skip
    _close(ours[:, 0], theirs[0])


def _mwargs(x):
    return (x["query"], x["kv_cache"], x["block_tables"], x["seq_lens"])


def _mla_wrapper():
    from flashinfer.attention.prims_ts.mla_decode import BatchMLADecodePagedTSWrapper

    return BatchMLADecodePagedTSWrapper


def test_mla_wrapper_is_routed_with_the_plans_mask(monkeypatch):
    for mask, causal in (("causal", True), ("dense", False)):
        x, _ = _mcase(name=MWNAME)
        plan = calls.mla_wrapper_plan(mask_type=mask)
        out = _route_wrapper(monkeypatch, MWNAME, plan, _mwargs(x), {}, _mla_wrapper())
        _hit(out)
        (seen,) = out.seen
        assert (seen["causal"], seen["bmm1_scale"], seen["bmm2_scale"]) == (causal, 1.0, 1.0)
        assert torch.equal(out.result, _reference(MWNAME)(**seen))


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"packed_query": True}, "plan.packed_query"),
        ({"q_data_type": torch.float8_e4m3fn}, "plan.q_data_type"),
        ({"kv_data_type": torch.float8_e4m3fn}, "plan.kv_data_type"),
        ({"o_data_type": torch.float16}, "plan.o_data_type"),
        ({"mask_type": "sliding"}, "plan.mask_type"),
        ({"max_seq_len_q": 4}, "query,plan.max_seq_len_q"),
    ],
)
def test_mla_wrapper_plans_the_definition_does_not_model_are_refused(monkeypatch, changes, rule):
    x, _ = _mcase(name=MWNAME)
    plan = calls.mla_wrapper_plan(**changes)
    _refused(_route_wrapper(monkeypatch, MWNAME, plan, _mwargs(x), {}, _mla_wrapper()), rule)


def test_mla_wrapper_a_plan_of_another_batch_size_or_head_count_is_refused(monkeypatch):
    x, _ = _mcase(name=MWNAME)
    plan = calls.mla_wrapper_plan(batch_size=3)
    out = _route_wrapper(monkeypatch, MWNAME, plan, _mwargs(x), {}, _mla_wrapper())
    _refused(out, "query,plan.batch_size")
    args, kwargs = calls.mla_wrapper_plan()
    plan = ((*args[:2], 32, *args[3:]), kwargs)  # 32 heads, where the query has 16
    out = _route_wrapper(monkeypatch, MWNAME, plan, _mwargs(x), {}, _mla_wrapper())
    _refused(out, "plan.num_heads")


# ---------------------------------------------------------------------------------------
# BatchPrefillCuteDSLWrapper.plan / run (attention_cute_dsl.fidef)
# ---------------------------------------------------------------------------------------

CNAME = "cute_dsl_batch_prefill_run_h32_kv8_d128"


def _cute_wrapper():
    from flashinfer.cute_dsl.attention.wrappers.batch_prefill import BatchPrefillCuteDSLWrapper

    return BatchPrefillCuteDSLWrapper


def _route_cute(monkeypatch, name, plan, args, kwargs) -> Outcome:
    """plan() then run() of a BatchPrefillCuteDSLWrapper (its constructor needs no GPU)."""
    W = _cute_wrapper()
    path = f"{W.__module__}.{W.__qualname__}.run"
    plans: list = []
    originals: list = []
    real_plan = W.plan
    sig = inspect.signature(real_plan)

    def plan_(*a, **k):
        plans.append(sig.bind(*a, **k).arguments)
        a[0]._mask_spec = object()  # what FlashInfer's plan() does: a new mask spec

    plan_.__signature__ = sig
    monkeypatch.setattr(W, "plan", plan_)
    monkeypatch.setattr(W, "run", _recorder(W.run, originals))
    seen: list = []
    rt.enable_apply({name: _solution(name, seen)})
    wrapper = W(torch.empty(16, dtype=torch.uint8))
    wrapper.plan(*plan[0], **plan[1])
    result = wrapper.run(*args, **kwargs)
    counts = rt.stats()[path]
    rt.disable_apply()
    assert len(plans) == 1
    return Outcome(result, seen, originals, counts)


def _ccase(seed: int = 0, name: str = CNAME):
    return calls.cute_prefill_case(_catalogue(), name, seed)


def _cplan(x, **changes):
    """FlashInfer's defaults but the geometry and the dtypes of a bfloat16 call."""
    args, _ = calls.cute_prefill_plan(x, 32, 8)
    return args, {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16} | changes


def test_cute_prefill_with_flashinfers_defaults_is_routed(monkeypatch):
    x, _ = _ccase()
    out = _route_cute(monkeypatch, CNAME, _cplan(x), (x["q"], x["k"], x["v"]), {})
    _hit(out)
    (seen,) = out.seen
    assert (seen["causal"], seen["window_left"]) == (True, -1)
    assert seen["sm_scale"] == 1 / math.sqrt(128)
    assert torch.equal(out.result, _reference(CNAME)(**seen)[0])


def test_cute_prefill_returns_the_lse_when_asked_and_reads_the_plans_mask(monkeypatch):
    x, axes = _ccase()
    plan = _cplan(x, causal=False, window_left=2, sm_scale=0.2)
    lse = _catalogue().buffer(CNAME, "lse", axes)
    kwargs = {"return_lse": True, "lse": lse}
    out = _route_cute(monkeypatch, CNAME, plan, (x["q"], x["k"], x["v"]), kwargs)
    _hit(out)
    (seen,) = out.seen
    assert (seen["causal"], seen["window_left"], seen["sm_scale"]) == (False, 2, 0.2)
    output, expected_lse = _reference(CNAME)(**seen)
    assert torch.equal(out.result[0], output) and out.result[1] is lse
    assert torch.equal(lse, expected_lse)


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"head_dim_vo": 64}, "plan.head_dim_vo,plan.head_dim_qk"),
        ({"q_data_type": torch.float16}, "plan.q_data_type"),
        ({"kv_data_type": torch.float16}, "plan.kv_data_type"),  # FlashInfer's default
        ({"variant": object()}, "plan.variant"),
        ({"causal": False, "window_right": 4}, "plan.window_right"),
        ({"kv_layout": "HND"}, "plan.kv_layout"),
    ],
)
def test_cute_prefill_plans_the_definition_does_not_model_are_refused(monkeypatch, changes, rule):
    x, _ = _ccase()
    out = _route_cute(monkeypatch, CNAME, _cplan(x, **changes), (x["q"], x["k"], x["v"]), {})
    _refused(out, rule)


def test_cute_prefill_a_paged_plan_or_an_fp8_value_is_refused(monkeypatch):
    x, _ = _ccase()
    args, kwargs = _cplan(x)
    pages = torch.zeros(3, dtype=torch.int32)
    paged = {"page_size": 16, "paged_kv_indptr": pages, "paged_kv_indices": pages}
    plan = ((args[0], None, *args[2:]), kwargs | paged | {"paged_kv_last_page_len": pages})
    out = _route_cute(monkeypatch, CNAME, plan, (x["q"], x["k"], x["v"]), {})
    _refused(out, "plan.kv_indptr")
    v8 = x["v"].to(torch.float8_e4m3fn)
    out = _route_cute(monkeypatch, CNAME, _cplan(x), (x["q"], x["k"], v8), {})
    _refused(out, "tensor:v")  # the mixed-dtype PV path


def test_cute_prefill_reference_agrees_with_flashinfers_template():
    # FlashInfer's template reference: one causal MHA sequence, the whole tensors.
    import flashinfer.trace.templates.attention as templates

    name = calls.CUTE_PREFILL_NAME  # 40 heads of their own (MHA), as the template assumes
    x, _ = _ccase(seed=2, name=name)
    q, k, v = x["q"][:3], x["k"][:7], x["v"][:7]
    indptr_q, indptr_kv = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 7])
    ours, _ = _reference(name)(q, k, v, indptr_q, indptr_kv.int(), True, -1, 1 / math.sqrt(128))
    _close(ours, templates._cute_dsl_batch_prefill_run_reference(q, k, v))


def test_cute_prefill_reference_keeps_the_window_left_of_each_query():
    x, _ = _ccase(seed=5)
    q, k, v = x["q"][:2], x["k"][:6], x["v"][:6]
    indptr_q, indptr_kv = torch.tensor([0, 2]).int(), torch.tensor([0, 6]).int()
    ours, lse = _reference(CNAME)(q, k, v, indptr_q, indptr_kv, True, 1, 0.3)
    for i, pos in enumerate((4, 5)):  # the queries sit at positions 4 and 5 of 6
        for h in range(32):
            keys = slice(pos - 1, pos + 1)  # window_left 1: itself and one key before
            logits = (k[keys, h // 4].float() @ q[i, h].float()) * 0.3
            _close(ours[i, h], logits.softmax(-1) @ v[keys, h // 4].float())
            assert abs(lse[i, h].item() - torch.logsumexp(logits, 0).item() / math.log(2)) < 1e-4


# ---------------------------------------------------------------------------------------
# BatchMLADecodeCuteDSLWrapper.plan / run (attention_cute_dsl.fidef)
# ---------------------------------------------------------------------------------------

CMNAME = calls.CUTE_MLA_NAME


def _route_cute_mla(monkeypatch, plan, args, kwargs) -> Outcome:
    """plan() then run() of a BatchMLADecodeCuteDSLWrapper (its constructor needs no GPU)."""
    from flashinfer.cute_dsl.attention.wrappers.batch_mla import BatchMLADecodeCuteDSLWrapper as W

    path = f"{W.__module__}.{W.__qualname__}.run"
    plans: list = []
    originals: list = []
    sig = inspect.signature(W.plan)

    def plan_(*a, **k):
        plans.append(sig.bind(*a, **k).arguments)
        a[0]._variant = object()  # what FlashInfer's plan() does: a new variant object

    plan_.__signature__ = sig
    monkeypatch.setattr(W, "plan", plan_)
    monkeypatch.setattr(W, "run", _recorder(W.run, originals))
    seen: list = []
    rt.enable_apply({CMNAME: _solution(CMNAME, seen)})
    wrapper = W(torch.empty(16, dtype=torch.int8))
    wrapper.plan(*plan[0], **plan[1])
    result = wrapper.run(*args, **kwargs)
    counts = rt.stats()[path]
    rt.disable_apply()
    assert len(plans) == 1
    return Outcome(result, seen, originals, counts)


def _cmargs(x, cache=None):
    cache = x["kv_cache"] if cache is None else cache
    return (x["q"], cache, x["block_tables"], x["seq_lens"], 96, 0.07)


def _cmplan(**changes):
    """FlashInfer's defaults but the geometry of the call."""
    return (), {"num_heads": 16, "page_size": 32} | changes


def test_cute_mla_with_flashinfers_defaults_is_routed(monkeypatch):
    # q_dtype is left to its default, torch.bfloat16: the plan's own value reaches the rules.
    x, _ = calls.cute_mla_case(_catalogue())
    out = _route_cute_mla(monkeypatch, _cmplan(), _cmargs(x), {})
    _hit(out)
    (seen,) = out.seen
    assert (seen["softmax_scale"], seen["output_scale"], seen["max_seq_len"]) == (0.07, 1.0, 96)
    assert torch.equal(out.result, _reference(CMNAME)(**seen))


def test_cute_mla_takes_the_rank_4_cache(monkeypatch):
    x, _ = calls.cute_mla_case(_catalogue())
    rank4 = x["kv_cache"][:, None]
    out = _route_cute_mla(monkeypatch, _cmplan(), _cmargs(x, rank4), {"output_scale": 2.0})
    _hit(out)
    assert out.seen[0]["kv_cache"].data_ptr() == rank4.data_ptr()
    assert out.seen[0]["output_scale"] == 2.0


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"q_dtype": torch.float8_e4m3fn}, "plan.q_dtype"),
        ({"out_dtype": torch.float16}, "plan.out_dtype"),
        ({"variant": object()}, "plan.variant"),
        ({"is_var_seq": False}, "plan.is_var_seq"),
        ({"kv_lora_rank": 256}, None),  # named like the definition's const: another's
        ({"num_heads": 128}, "plan.num_heads"),
    ],
)
def test_cute_mla_plans_the_definition_does_not_model_are_refused(monkeypatch, changes, rule):
    x, _ = calls.cute_mla_case(_catalogue())
    _refused(_route_cute_mla(monkeypatch, _cmplan(**changes), _cmargs(x), {}), rule)


def test_cute_mla_several_query_tokens_or_a_tensor_scale_are_refused(monkeypatch):
    x, _ = calls.cute_mla_case(_catalogue())
    args = list(_cmargs(x))
    args[0] = torch.cat([x["q"], x["q"]], dim=1)  # two query tokens per sequence
    _refused(_route_cute_mla(monkeypatch, _cmplan(), tuple(args), {}), "tensor:q")
    args = list(_cmargs(x))
    args[5] = torch.tensor(0.07)
    _refused(_route_cute_mla(monkeypatch, _cmplan(), tuple(args), {}), "softmax_scale")


def test_cute_mla_reference_agrees_with_flashinfers_template():
    import flashinfer.trace.templates.attention as templates

    for seed in range(3):
        x, _ = calls.cute_mla_case(_catalogue(), seed=seed)
        ours = _reference(CMNAME)(*_cmargs(x), 0.5)
        theirs = templates._cute_dsl_batch_mla_run_reference(*_cmargs(x), 0.5)
        _close(ours, theirs)


@pytest.mark.parametrize(("position", "rule"), [(0, "q"), (2, "block_tables")])
def test_decode_strided_operands_are_left_to_flashinfer(monkeypatch, position, rule):
    # FlashInfer takes q compact and each block-table row contiguous, and refuses others.
    x, _ = _case()
    args = list(_args(x))
    args[position] = strided(args[position])
    _refused(_route(monkeypatch, NAME, tuple(args), {}), rule)


def test_mla_strided_query_is_left_to_flashinfer(monkeypatch):
    x, _ = _mcase()
    args = list(_margs(x))
    args[0] = strided(args[0])
    _refused(_route(monkeypatch, MNAME, tuple(args), {}, MLA), "query,kv_cache")
