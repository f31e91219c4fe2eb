"""FlashInfer's own trace output lands on the catalogue's definitions (``fibgen.format.fi_resolve``).

First the matching rules on small definitions written here. Then FlashInfer 0.7.2.post1's own
templates: for every routed entry point (a wrapper's run included), the definition JSON its
template writes for a routed call (``tests/_routable_calls.py``); and for every instance of a
routed function, for a call made from the instance's own inputs; each resolved against the
definitions of the family that routes it, with the workload's axes FlashInfer-Bench's tracer
would record for the call.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path

import pytest
import torch
from _shared import catalogue_module, require_module

from fibgen.format.fi_resolve import entry_point_of, resolve

ROOT = Path(__file__).resolve().parents[1]
FLASHINFER = "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)"


def definition(name, inputs, outputs, axes, tags=("fi_api:flashinfer.activation.silu_and_mul",)):
    return {"name": name, "tags": list(tags), "axes": axes, "inputs": inputs, "outputs": outputs}


CATALOGUE = [
    definition(
        "silu_and_mul_h4096_bf16",
        {"x": {"shape": ["num_tokens", "input_size"], "dtype": "bfloat16"}},
        {"output": {"shape": ["num_tokens", "hidden_size"], "dtype": "bfloat16"}},
        {
            "num_tokens": {"type": "var"},
            "input_size": {"type": "const", "value": 8192},
            "hidden_size": {"type": "const", "value": 4096},
        },
    ),
    definition(
        "silu_and_mul_h12288_bf16",
        {"x": {"shape": ["num_tokens", "input_size"], "dtype": "bfloat16"}},
        {"output": {"shape": ["num_tokens", "hidden_size"], "dtype": "bfloat16"}},
        {
            "num_tokens": {"type": "var"},
            "input_size": {"type": "const", "value": 24576},
            "hidden_size": {"type": "const", "value": 12288},
        },
    ),
]


def traced(width: int, dtype: str = "bfloat16", name: str | None = None) -> dict:
    """What FlashInfer's silu_and_mul template writes: named by the input's width."""
    return definition(
        name or f"silu_and_mul_h{width}",
        {"input": {"shape": ["num_tokens", "hidden_size"], "dtype": dtype}},
        {"out": {"shape": ["num_tokens", "out_size"], "dtype": dtype}},
        {
            "num_tokens": {"type": "var"},
            "hidden_size": {"type": "const", "value": width},
            "out_size": {"type": "var"},
        },
    )


def test_a_definition_of_another_name_and_schema_is_resolved_by_what_it_says():
    r = resolve(traced(24576), CATALOGUE)
    assert (r.kind, r.definition) == ("resolved", "silu_and_mul_h12288_bf16")
    assert r.entry_point == "flashinfer.activation.silu_and_mul"
    assert "input `input` is `x`" in r.differences
    assert "axis `hidden_size`=24576 is `input_size`" in r.differences
    assert r.describe().startswith("silu_and_mul_h24576 -> silu_and_mul_h12288_bf16 (resolved")


def test_the_same_name_is_same_and_a_disagreeing_call_resolves_to_nothing():
    same = resolve(traced(8192, name="silu_and_mul_h4096_bf16"), CATALOGUE)
    assert (same.kind, same.definition) == ("same", "silu_and_mul_h4096_bf16")
    # A float16 call, or a width the catalogue has no instance for, stands for none.
    for call in (traced(24576, "float16"), traced(1000)):
        r = resolve(call, CATALOGUE)
        assert (r.kind, r.definition) == ("none", None)
        assert r.differences[0].startswith("nearest `")
    # A tensor pairs only with one of its dtype: the float16 input has no place.
    why = resolve(traced(24576, "float16"), CATALOGUE).differences[0]
    assert "input `input` [num_tokens, hidden_size=24576] pairs with no input" in why


def test_a_call_that_does_not_say_enough_is_ambiguous():
    unknown = traced(24576)
    unknown["axes"]["hidden_size"] = {"type": "const"}  # the template could not read it
    r = resolve(unknown, CATALOGUE)
    assert r.kind == "ambiguous"
    assert r.candidates == ("silu_and_mul_h12288_bf16", "silu_and_mul_h4096_bf16")
    assert "FlashInfer's const axis `hidden_size` has no value" in r.differences


def test_a_viewed_tensor_pairs_when_its_sizes_multiply_to_the_other():
    cat = definition(
        "rope_d128",
        {"q": {"shape": ["t", "h", "d"], "dtype": "bfloat16"}},
        {},
        {"t": {"type": "var"}, "h": {"type": "var"}, "d": {"type": "const", "value": 128}},
    )
    flat = definition(
        "rope",
        {"query": {"shape": ["nnz", "hd"], "dtype": "bfloat16"}},
        {},
        {"nnz": {"type": "var"}, "hd": {"type": "const", "value": 512}},
    )
    assert resolve(flat, [cat]).kind == "resolved"
    flat["axes"]["hd"]["value"] = 500  # not a multiple of 128
    assert resolve(flat, [cat]).kind == "none"


def test_a_tensor_viewed_in_the_middle_pairs_where_the_other_dimensions_agree():
    # The definition reads v's keys in blocks of 16: [b, h, blocks, 16, d] of the call's
    # [b, h, n, d].
    cat = definition(
        "quant_d128",
        {"v": {"shape": ["b", "h", "blocks", "block", "d"], "dtype": "bfloat16"}},
        {},
        {
            "b": {"type": "var"},
            "h": {"type": "const", "value": 8},
            "blocks": {"type": "var"},
            "block": {"type": "const", "value": 16},
            "d": {"type": "const", "value": 128},
        },
    )

    def call(n: int | None = None, d: int = 128) -> dict:
        length = {"type": "var"} if n is None else {"type": "const", "value": n}
        axes = {"b": {"type": "var"}, "h": {"type": "var"}, "n": length}
        axes["d"] = {"type": "const", "value": d}
        v = {"shape": ["b", "h", "n", "d"], "dtype": "bfloat16"}
        return definition("quant", {"v": v}, {}, axes)

    r = resolve(call(), [cat])
    assert (r.kind, r.definition) == ("resolved", "quant_d128"), r.describe()
    assert "input `v` [b, h, n, d=128] is `v` [b, h=8, blocks, block=16, d=128] viewed" in (
        r.differences
    )
    # The dimensions beside the viewed one must agree: another head dim does not pair.
    assert resolve(call(d=64), [cat]).kind == "none"
    # A known length the blocks of 16 do not divide does not pair; one they divide does.
    assert resolve(call(n=24), [cat]).kind == "none"
    assert resolve(call(n=48), [cat]).kind == "resolved"


def test_what_flashinfer_says_less_precisely_still_pairs_and_is_said():
    axes = {"t": {"type": "var"}, "k": {"type": "const", "value": 64}}
    cat = definition(
        "quant_k64",
        {
            "x": {"shape": ["t", "k"], "dtype": "bfloat16"},
            "scale": {"shape": [], "dtype": "float32"},
        },
        {"q": {"shape": ["t", "k"], "dtype": "float4_e2m1"}},
        axes,
    )
    fi = definition(
        "quant",
        {
            "x": {"shape": ["t", "k"], "dtype": "bfloat16"},
            "scale": {"shape": None, "dtype": "float32"},  # a float or a tensor
            "out": {"shape": ["t", "k"], "dtype": "uint8"},  # the destination, bytes
            "workspace_buffer": {"shape": ["w"], "dtype": "uint8"},
        },
        {},
        axes | {"w": {"type": "var"}},
    )
    r = resolve(fi, [cat])
    assert (r.kind, r.definition) == ("resolved", "quant_k64"), r.describe()
    assert "FlashInfer's input `out` is output `q`" in r.differences
    assert "FlashInfer's input `workspace_buffer` is scratch" in r.differences
    # A byte tensor holds a one-byte dtype, not a two-byte one; an unnamed scalar never pairs.
    fi["inputs"]["out"]["dtype"] = "int16"
    assert resolve(fi, [cat]).kind == "none"
    # torch's packed FP4 dtype is the language's float4_e2m1, and no other byte dtype.
    fi["inputs"]["out"]["dtype"] = "float4_e2m1fn_x2"
    assert resolve(fi, [cat]).kind == "resolved"
    fi["inputs"]["out"]["dtype"] = "float8_e4m3fn"
    assert resolve(fi, [cat]).kind == "none"
    fi["inputs"]["out"]["dtype"] = "uint8"
    fi["inputs"]["x"] = {"shape": None, "dtype": "bfloat16"}
    why = resolve(fi, [cat]).differences[0]
    assert "input `x` is a scalar in FlashInfer's JSON and a tensor in the other" in why


def test_a_scalar_paired_by_name_with_a_tensor_is_said_on_either_side():
    # A scalar and a rank-1 tensor of one name agree; FlashInfer's tensor against the
    # definition's scalar once raised TypeError comparing their ranks.
    axes = {"n": {"type": "var"}}
    tensor = {"top_p": {"shape": ["n"], "dtype": "float32"}}
    scalar = {"top_p": {"shape": None, "dtype": "float32"}}
    r = resolve(definition("fi", tensor, {}, axes), [definition("cat", scalar, {}, axes)])
    assert r.kind == "resolved", r.describe()
    assert "input `top_p` is a scalar in the definition and a tensor in the other" in (
        r.differences
    )
    r = resolve(definition("fi", scalar, {}, axes), [definition("cat", tensor, {}, axes)])
    assert r.kind == "resolved", r.describe()
    assert "input `top_p` is a scalar in FlashInfer's JSON and a tensor in the other" in (
        r.differences
    )


def attention(name: str, heads: int | None, d: int = 128) -> dict:
    """A definition of q [tokens, heads, d]; ``heads`` None: a var head count."""
    axes = {
        "tokens": {"type": "var"},
        "heads": {"type": "var"} if heads is None else {"type": "const", "value": heads},
        "d": {"type": "const", "value": d},
    }
    q = {"q": {"shape": ["tokens", "heads", "d"], "dtype": "bfloat16"}}
    return definition(name, q, {}, axes, tags=("fi_api:flashinfer.attention.run",))


ATTENTION = [attention("attn_h32_d128", 32), attention("attn_h64_d128", 64)]


def test_the_workload_s_axes_tell_apart_what_the_json_cannot():
    # FlashInfer's JSON leaves the head count var: both instances agree with it.
    fi = attention("attn_d128", None)
    assert resolve(fi, ATTENTION).kind == "ambiguous"
    r = resolve(fi, ATTENTION, axes={"tokens": 7, "heads": 32})
    assert (r.kind, r.definition) == ("resolved", "attn_h32_d128"), r.describe()
    assert "heads=32 from the workload" in r.differences
    assert "tokens=7 from the workload" not in r.differences  # it told nothing apart
    assert resolve(fi, ATTENTION, axes={"heads": 64}).definition == "attn_h64_d128"
    # A value no candidate holds: none, with the conflicts said.
    r = resolve(fi, ATTENTION, axes={"heads": 48})
    assert (r.kind, r.definition) == ("none", None)
    assert r.candidates == ("attn_h32_d128", "attn_h64_d128")
    assert r.differences[0].startswith("the workload's axes fit none of those that agree")
    assert "`attn_h32_d128`: the workload's `heads` is 48, not 32" in r.differences[0]
    # An axis no candidate holds const excludes none of them.
    assert resolve(fi, ATTENTION, axes={"tokens": 7, "pages": 3}).kind == "ambiguous"


def test_a_candidate_that_lacks_the_axis_or_holds_it_var_is_not_excluded_by_it():
    any_heads = attention("attn_d128_any", None)
    catalogue = ATTENTION + [any_heads]
    fi = attention("attn_d128", None)
    r = resolve(fi, catalogue, axes={"heads": 32})
    assert (r.kind, r.candidates) == ("ambiguous", ("attn_d128_any", "attn_h32_d128"))
    r = resolve(fi, catalogue, axes={"heads": 48})
    assert (r.kind, r.definition) == ("resolved", "attn_d128_any"), r.describe()
    assert "heads=48 from the workload" in r.differences
    del any_heads["axes"]["heads"]
    any_heads["inputs"]["q"]["shape"] = ["tokens", "hd"]  # q viewed [tokens, heads * d]
    any_heads["axes"]["hd"] = {"type": "var"}
    assert resolve(fi, catalogue, axes={"heads": 48}).definition == "attn_d128_any"


def test_a_workload_value_that_contradicts_the_only_candidate_rules_it_out():
    # The candidate of FlashInfer's name is "same" by the JSON alone; the workload's head
    # count is the other instance's.
    fi = attention("attn_h32_d128", None)
    assert resolve(fi, ATTENTION).kind == "same"
    assert resolve(fi, ATTENTION, axes={"heads": 32}).kind == "same"
    r = resolve(fi, ATTENTION, axes={"heads": 64})
    assert (r.kind, r.definition) == ("resolved", "attn_h64_d128"), r.describe()
    # The only candidate: contradicted, none.
    only = [ATTENTION[0]]
    assert resolve(attention("attn", None), only).kind == "resolved"
    r = resolve(attention("attn", None), only, axes={"heads": 64})
    assert (r.kind, r.definition) == ("none", None)
    assert "`attn_h32_d128`: the workload's `heads` is 64, not 32" in r.differences[0]
    # A value the JSON itself holds otherwise: not one call, no candidate agrees. One it
    # holds the same is no news.
    fi = attention("attn_h32_d128", 32)
    assert resolve(fi, ATTENTION, axes={"d": 128}).kind == "same"
    r = resolve(fi, ATTENTION, axes={"d": 64})
    assert r.kind == "none"
    assert r.differences == (
        "the workload is not of FlashInfer's JSON: the workload's `d`=64, where FlashInfer's "
        "JSON says 128",
    )


def test_a_workload_s_axes_of_another_kind_are_refused_clearly():
    fi = attention("attn_d128", None)
    for axes, said in (
        ({"heads": "32"}, "the workload's axis 'heads' is '32', not a whole number"),
        ({"heads": True}, "the workload's axis 'heads' is True, not a whole number"),
        ([("heads", 32)], "the workload's axes are a mapping of axis names to sizes"),
    ):
        with pytest.raises(TypeError, match=re.escape(said)):
            resolve(fi, ATTENTION, axes=axes)


def test_no_candidates_and_no_entry_point_are_said():
    r = resolve(traced(24576), [])
    assert r.differences == (
        "no catalogue definition stands for flashinfer.activation.silu_and_mul",
    )
    untagged = traced(24576)
    untagged["tags"] = []
    assert entry_point_of(untagged) is None
    assert resolve(untagged, []).differences == ("it names no entry point (no fi_api tag)",)


# --------------------------------------------------------------- FlashInfer's own templates

# What FlashInfer 0.7.2.post1's template writes for a routed call, with the workload's axes
# FlashInfer-Bench's tracer would record for it, where it does not land on the call's
# definition, and why (the listing of issue 27 item 3), by canonical entry point:
# "ambiguous" (the JSON and the workload's axes do not say enough; the call's definition is
# among those it may be), "none", or "misread" (the template misdescribes the call, so it
# lands on another definition or on none: never on its own).
_NO_PAGE_SIZE = "ambiguous"  # a (k_cache, v_cache) tuple or an unknown layout: no page size
# The routed call's definition is the only one of its head counts, so its call lands; those
# of the other instances are ambiguous (the JSON holds no page size nor KV heads).
_NO_PAGE_SIZE_BUT_ROUTED = "ambiguous but the routed call"
NOT_LANDING = {
    # Its definition takes the slot of each row, which its `let` resolves from the packed
    # metadata (state_indices [N, 1] and query_start_loc) that FlashInfer's template records.
    "flashinfer.kda_decode.packed_fused_kda_decode": "none",
    # Its template reads the page size from a cache tensor, and a (k_cache, v_cache) tuple
    # holds none: the two page sizes of the catalogue are both possible.
    "flashinfer.page.append_paged_kv_cache": "ambiguous",
    # Its template describes the single-head layout only (state [batch, dim, dstate]); a
    # multi-head call, what the catalogue and the dataset route, is read into those axes
    # wrongly (dim = nheads, dstate = head_dim), so no definition stands for it.
    "flashinfer.mamba.selective_state_update.selective_state_update": "none",
    # Their templates give `out` the input's dtype, where the call's is float8_e4m3fn.
    "flashinfer.norm.rmsnorm_quant": "misread",
    "flashinfer.norm.fused_add_rmsnorm_quant": "misread",
    # Its template reads the page size from the second dimension of an HND cache.
    "flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache": "misread",
    # Wrapper runs whose templates read a paged cache given as a tuple, or a layout the
    # wrapper's plan holds: the page size and the KV heads are not in the JSON, and the
    # workload holds none (they are const axes of no value, read from no tensor).
    "flashinfer.cascade.MultiLevelCascadeAttentionWrapper.run": _NO_PAGE_SIZE,
    "flashinfer.attention._core.BatchAttention.run": _NO_PAGE_SIZE,
    "flashinfer.pod.PODWithPagedKVCacheWrapper.run": _NO_PAGE_SIZE,
    "flashinfer.pod.BatchPODWithPagedKVCacheWrapper.run": _NO_PAGE_SIZE,
    "flashinfer.decode.trtllm_batch_decode_with_kv_cache": _NO_PAGE_SIZE_BUT_ROUTED,
    "flashinfer.prefill.trtllm_batch_context_with_kv_cache": _NO_PAGE_SIZE_BUT_ROUTED,
    "flashinfer.decode.xqa_batch_decode_with_kv_cache": _NO_PAGE_SIZE_BUT_ROUTED,
    # Its template takes the query's length and the key's for the heads.
    "flashinfer.sparse.VariableBlockSparseAttentionWrapper.run": "misread",
    # Their templates read a 3-D MLA cache [pages, page_size, dim] as 4-D, the page size as
    # the pad dimension.
    "flashinfer.mla._core.trtllm_batch_decode_with_kv_cache_mla": "misread",
    "flashinfer.mla._core.trtllm_prefill_with_kv_cache_mla": "misread",
    "flashinfer.mla._core.xqa_batch_decode_with_kv_cache_mla": "misread",
    # Its template reads the rope width from the middle dimension of k_pe [tokens, 1, rope].
    "flashinfer.mla_kv_pack.concat_mla_kv_quant_fp8": "misread",
    # A packed QKV the template describes without the heads or the head size.
    "flashinfer.prefill.trtllm_fmha_v2_prefill": "ambiguous",
    # Its template gives the value the query's head size (192, where the call's is 128).
    "flashinfer.prefill.fmha_v2_prefill_deepseek": "misread",
    # Its template lists the gate inputs `A_log`, `a`, `b` that the kernel does not take
    # ("conceptual; not passed directly"), `b` as required.
    "flashinfer.gdn_prefill.chunk_gated_delta_rule": "none",
    # Their templates describe routing logits as bfloat16 where the kernel takes float32
    # too, and the weights in their own shuffled, blocked layout.
    "flashinfer.fused_moe.core.trtllm_fp4_block_scale_moe": "misread",
    "flashinfer.fused_moe.core.trtllm_fp4_block_scale_routed_moe": "misread",
    "flashinfer.fused_moe.core.trtllm_bf16_moe": "misread",
    "flashinfer.fused_moe.core.trtllm_bf16_routed_moe": "misread",
    # The Prims-TS backends of the same kernels, traced by the same templates.
    "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_moe": "misread",
    "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_routed_moe": "misread",
    "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_moe_partitioned": "misread",
    # Its template reads bfloat16 routing logits, as the others, and the three output scales
    # as inputs, which the definition holds to ones by rule.
    "flashinfer.fused_moe.backends.prims_ts.fp4_op.prims_ts_fp4_block_scale_moe_partitioned": (
        "misread"
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp4_op.prims_ts_fp4_block_scale_moe": "misread",
    "flashinfer.fused_moe.backends.prims_ts.fp4_op.prims_ts_fp4_block_scale_routed_moe": (
        "misread"
    ),
    # Their template describes the weights' scales as 3-D [E, rows, K / 16], where the kernels
    # take the 6-D MMA view (32, 4, rows / 128, 4, K / 64, E) of the swizzled scales.
    "flashinfer.fused_moe.cute_dsl.b12x_moe.b12x_fused_moe": "none",
    "flashinfer.fused_moe.cute_dsl.b12x_moe.B12xMoEWrapper.run": "none",
    # Its template gives the outputs [num_tokens, topk] whatever num_fused_shared_experts
    # says ("the trace covers the routed path"): a call with a fused shared expert, whose
    # outputs hold one more slot, lands on the definition without one.
    "flashinfer.fused_moe.hash_topk.hash_topk": "misread",
    # Its template writes `quant_type` as a scalar of no value: the three layouts are one JSON.
    "flashinfer.fused_moe.prepare.interleave_moe_weights_for_sm90_mixed_gemm": "ambiguous",
    # Its template reads N from the weight's first dimension, which is N only of a
    # column-major [N, K] weight where N == K: the routed call lands, other instances not.
    "flashinfer.gemm.gemm_base.mm_fp8": "misread where N != K",
    # Its template ignores `weight_column_major`: it reads K and N of column-major weights
    # the other way round.
    "flashinfer.gemm.gemm_base.SegmentGEMMWrapper.run": "misread",
    # Its template reads K from the packed FP4 activation (two values a byte: K / 2) and
    # the weight's scales as [K, N / block_size], where they are [K / 16 padded, N padded].
    "flashinfer.gemm.gemm_base.mm_fp4": "misread",
    # Its template describes the (data, scales) tuples lhs and rhs as single tensors
    # [num_groups, max_m, K] and [num_groups, N, K]: the JSON names neither N nor K.
    "flashinfer.gemm.kernels.grouped_gemm_masked_wrapper.grouped_gemm_nt_masked": "ambiguous",
}


def _lands_as_expected(r, name: str, expected: str | None, each_instance: bool = False) -> bool:
    """Whether ``r`` is what NOT_LANDING expects for a call of definition ``name``: its own
    definition, else the listed kind. The routed call of an entry listed "misread", "none" or
    "ambiguous" must not land on its own definition (the test says so when FlashInfer's
    template is fixed, or the workload's axes tell the candidates apart: the entry is stale);
    other instances may. Of an "ambiguous but the routed call" entry, the routed call must
    land, the other instances land or are ambiguous."""
    own = r.kind in ("same", "resolved") and r.definition == name
    if expected is None:
        return own
    if expected == "misread where N != K":
        return each_instance or own
    if expected == _NO_PAGE_SIZE_BUT_ROUTED:
        return own or (each_instance and r.kind == "ambiguous" and name in r.candidates)
    if own or expected == "misread":
        return each_instance or not own
    if expected == "ambiguous":
        return r.kind == "ambiguous" and name in r.candidates
    return r.kind == expected


def _workload_axes(apis, api, arguments, written: dict) -> dict[str, int]:
    """The axes FlashInfer-Bench's tracer records in the workload of a call traced as
    ``written`` (``Definition.get_axes_values_from_inputs``): each var axis of FlashInfer's
    JSON bound to the size of the call's tensor in a dimension it names. The tensor is the
    one FlashInfer's template reads for the input (its `param`, its `tuple_idx`); an input
    the call does not pass as a tensor (None, a tuple the template does not index), or whose
    rank is not the JSON's, binds nothing, and an axis two tensors give different sizes is
    left out (the tracer would record no workload)."""
    from flashinfer.trace.template import Tensor, TraceTemplate

    template = apis.template_object(api)
    if not isinstance(template, TraceTemplate):
        template = template(save_dir=None, name=None, **arguments)
        if template is None:  # a dispatch function that traces nothing for the call
            return {}
    var = {n for n, a in (written.get("axes") or {}).items() if a.get("type") == "var"}
    sizes: dict[str, set[int]] = {}
    for key, spec in (written.get("inputs") or {}).items():
        descriptor = template.inputs.get(key)
        if spec.get("shape") is None or not isinstance(descriptor, Tensor):
            continue
        value = arguments.get(descriptor.param or key)
        if descriptor.tuple_idx is not None:
            fits = isinstance(value, (tuple, list)) and len(value) > descriptor.tuple_idx
            value = value[descriptor.tuple_idx] if fits else None
        if not isinstance(value, torch.Tensor) or value.dim() != len(spec["shape"]):
            continue
        for axis, size in zip(spec["shape"], value.shape):
            if axis in var:
                sizes.setdefault(axis, set()).add(int(size))
    return {axis: next(iter(found)) for axis, found in sizes.items() if len(found) == 1}


def _routed_paths() -> list[str]:
    require_module("flashinfer", FLASHINFER)
    import _routable_calls as routable

    return list(routable.ROUTABLE)


@pytest.fixture(scope="module")
def routed():
    require_module("flashinfer", FLASHINFER)
    import _routable_calls as routable

    from fibgen.format.fi_apis import traced_apis

    module = catalogue_module()
    generated = {}
    for path in (ROOT / "generated" / "definitions").rglob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        generated[data["name"]] = data
    return routable, routable.Catalogue(module), traced_apis(), generated


@pytest.mark.slow
@pytest.mark.parametrize("path", _routed_paths())
def test_flashinfer_trace_of_a_routed_call_lands_on_its_definition(path, routed):
    routable, catalogue, apis, generated = routed
    call = routable.ROUTABLE[path](catalogue)
    api = apis.lookup(path).api
    assert api is not None, path
    owner: object = importlib.import_module(api.module)
    *classes, attr = api.qualname.split(".")
    for name in classes:
        owner = getattr(owner, name)
    args = call.args
    if classes and not (args and isinstance(args[0], owner)):
        # A wrapper's run: FlashInfer's template reads the call's tensors, and of the wrapper
        # only what its constructor leaves (the KV layout), which the call gives.
        instance = object.__new__(owner)
        vars(instance).update(call.state)
        args = (instance, *args)
    function = inspect.unwrap(getattr(owner, attr))
    bound = inspect.signature(function).bind(*args, **call.kwargs)
    bound.apply_defaults()
    written = apis.trace_definition(api, bound.arguments)
    assert entry_point_of(written) == api.path
    family = catalogue.defs[call.name].family
    candidates = [generated[n] for n, d in catalogue.defs.items() if d.family == family]
    r = resolve(written, candidates, axes=_workload_axes(apis, api, bound.arguments, written))
    expected = NOT_LANDING.get(api.path)
    stale = (
        " (a stale NOT_LANDING entry: remove it)" if expected and r.definition == call.name else ""
    )
    assert _lands_as_expected(r, call.name, expected), f"{r.describe()}, expected {expected}{stale}"


# Routed functions whose calls cannot be made from a definition's own tensors and values alone;
# one routed call of each is resolved above instead.
NOT_FROM_THE_DEFINITION = {
    # Its family's `let` views FlashInfer's flattened query and key ([nnz, heads * head_size])
    # as the definition's [num_tokens, heads, head_size]: a call made of the definition's
    # tensors would pass the unflattened ones.
    "flashinfer.rope.apply_rope_with_cos_sin_cache_inplace": "a `let` view of the call's tensors",
    "flashinfer.rope.apply_rope_with_cos_sin_cache": "a `let` view of the call's tensors",
    "flashinfer.kda_decode.packed_fused_kda_decode": "per-row slots a `let` resolves",
    # Its family's `let`s pad q, k and v to 128 tokens and view v in blocks of 16 keys: a call
    # of the definition's tensors would pass v as [.., kv_len / 16, 16, head_dim], of another
    # shape than k's, which FlashInfer refuses (its template, which checks no shapes, would
    # still describe it).
    "flashinfer.nvfp4_attention_sm120.nvfp4_attention_sm120_quantize_qkv": (
        "a `let` view of the call's tensors"
    ),
    # Parameters the families' rules fix (`local_num_experts == num_local_experts`,
    # `local_expert_offset`, `routed_scaling_factor`, the routing options) are named like no
    # axis or parameter.
    "flashinfer.fused_moe.core.trtllm_fp8_block_scale_moe": "parameters only its rules fix",
    "flashinfer.fused_moe.core.trtllm_fp8_per_tensor_scale_moe": "parameters only its rules fix",
    "flashinfer.fused_moe.core.cutlass_fused_moe": "parameters only its rules fix",
    "flashinfer.fused_moe.core.trtllm_bf16_moe": "parameters only its rules fix",
    "flashinfer.fused_moe.core.trtllm_bf16_routed_moe": "parameters only its rules fix",
    "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_moe": (
        "parameters only its rules fix"
    ),
    "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_routed_moe": (
        "parameters only its rules fix"
    ),
    "flashinfer.fused_moe.backends.prims_ts.bf16_op.prims_ts_bf16_moe_partitioned": (
        "parameters only its rules fix"
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp4_op.prims_ts_fp4_block_scale_moe": (
        "parameters only its rules fix"
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp4_op.prims_ts_fp4_block_scale_routed_moe": (
        "parameters only its rules fix"
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_per_tensor_scale_moe": (
        "parameters only its rules fix"
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_per_tensor_scale_moe_partitioned": (
        "parameters only its rules fix"
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp4_op.prims_ts_fp4_block_scale_moe_partitioned": (
        "parameters only its rules fix"
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_block_scale_moe": (
        "parameters only its rules fix"
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_block_scale_routed_moe": (
        "parameters only its rules fix"
    ),
    "flashinfer.fused_moe.backends.prims_ts.fp8_op.prims_ts_fp8_block_scale_moe_partitioned": (
        "parameters only its rules fix"
    ),
    "flashinfer.fused_moe.core.trtllm_fp4_block_scale_moe": "parameters only its rules fix",
    "flashinfer.fused_moe.core.trtllm_fp4_block_scale_routed_moe": "parameters only its rules fix",
    "flashinfer.fused_moe.core.trtllm_fp8_block_scale_routed_moe": "parameters only its rules fix",
    "flashinfer.fused_moe.core.trtllm_fp8_per_tensor_scale_routed_moe": (
        "parameters only its rules fix"
    ),
    # The definition holds w1_alpha folded with input_global_scale (fc1_alpha) and the FC1
    # input scale apart (fc1_input_scale), by `let`s: neither is the call's w1_alpha.
    "flashinfer.fused_moe.cute_dsl.b12x_moe.b12x_fused_moe": "`let`s that fold w1_alpha",
    "flashinfer.fused_moe.core.trtllm_mxint4_block_scale_moe": "parameters only its rules fix",
    # Arguments a call passes that no definition holds: a scratch buffer of its own kind,
    # a value the family's rules fix, an output's dtype, a packed tensor its `let` splits.
    "flashinfer.xqa.xqa": "its `semaphores` buffer",
    "flashinfer.xqa.xqa_mla": "its `semaphores` buffer",
    "flashinfer.fused_moe.alphamoe_nvfp4_sm100.alphamoe_nvfp4_routed_moe": (
        "its routing-plan workspaces"
    ),
    "flashinfer.cudnn.prefill.cudnn_batch_prefill_with_kv_cache": "`return_lse`, a rule",
    "flashinfer.prefill.fmha_v2_prefill_sm120": "`scale_softmax`, a rule",
    "flashinfer.prefill.fmha_v2_prefill_deepseek": "`scale_softmax`, a rule",
    "flashinfer.prefill.trtllm_ragged_attention_deepseek": "`o_sf_scale`, a rule",
    "flashinfer.prefill.trtllm_fmha_v2_prefill": "a packed `qkv` its `let` splits",
    "flashinfer.concat_ops.concat_mla_k": "the destination `k`, written in place",
    "flashinfer.attention.prims_ts.mla_decode.batch_mla_decode_with_paged_kv_cache": (
        "`causal`, a `let` of `mask_type`"
    ),
    "flashinfer.attention.prims_ts.block_sparse.block_sparse_attention": (
        "`causal`, a `let` of `mask_type`"
    ),
    "flashinfer.attention.prims_ts.block_sparse.block_sparse_attention_with_paged_kv_cache": (
        "`max_seq_len_kv`, a capacity no definition holds"
    ),
    "flashinfer.cake_vsa.run_cake_vsa": "the `plan` dict its `let`s read the mask from",
    # By family: pool mode passes `state=None` and the pool as `initial_state`; FlashInfer's
    # template describes the per-sequence state only.
    "gdn_decode_pool": "pool mode: `state=None`",
    "flashinfer.gemm.gemm_base.bmm_fp8": "the output's `dtype`",
    "flashinfer.gemm.gemm_base.bmm_mxfp8": "the output's `dtype`",
    "flashinfer.gemm.gemm_base.batch_deepgemm_fp8_nt_groupwise": "`expected_m`, a rule",
    "flashinfer.diffusion_ops.minimax_h3.minimax_h3_bf16_pre_attention": (
        "`rope_positions`, read through a `let` that stands for its None"
    ),
    # A required keyword no definition holds: which prepared layout the weight is in.
    "flashinfer.gemm.gemm_bf16_fp4.mm_bf16_fp4": "`backend`, a rule",
    # Its operands are (data, scales) tuples of permuted views, which its `let`s read
    # group-major; the definition holds the group-major tensors.
    "flashinfer.gemm.kernels.grouped_gemm_masked_wrapper.grouped_gemm_nt_masked": (
        "tuples of views its `let`s read"
    ),
}


LARGE_BYTES = 32 << 20


def _call_of(definition, family, function, catalogue) -> dict:
    """The arguments of a call of ``function`` for one definition, made from its own inputs:
    each read parameter (`<- p`, or an input named like it) gets the input, each parameter
    named like an axis or a parameter of the definition its value; the rest are defaults."""
    # Gigabytes of weights (the MoE layers, the large GEMMs): FlashInfer's template reads
    # their shapes only, so they are meta tensors; the rest are made by the input generator.
    meta = "moe" in definition.name or catalogue.input_bytes(definition.name) > LARGE_BYTES
    if meta:
        small = {a.name: 2 for a in definition.axes if a.value is None}
        values, axes = catalogue.meta_inputs(definition.name, **small)
    else:
        values, axes = catalogue.inputs(definition.name)
    signature = inspect.signature(function)
    given: dict = {}
    parts: dict[str, dict[int, object]] = {}
    for t in family.inputs:
        if t.name not in values:
            continue
        if t.source is None:
            if t.name in signature.parameters:
                given[t.name] = values[t.name]
        elif t.source.index is None:
            given[t.source.param] = values[t.name]
        else:
            parts.setdefault(t.source.param, {})[t.source.index] = values[t.name]
    given |= {p: tuple(v[i] for i in sorted(v)) for p, v in parts.items()}
    for name, value in {**axes, **dict(definition.param_values)}.items():
        if name in signature.parameters:
            given.setdefault(name, value)
    # What the call must pass besides the definition's inputs: a destination of one of its
    # outputs (`out`, `k`), and a scratch buffer (`workspace_buffer`).
    device = "meta" if meta else "cpu"
    outputs = {t.name for t in definition.outputs}
    for p in signature.parameters.values():
        if p.name in given or p.default is not inspect.Parameter.empty:
            continue
        if p.name in outputs:
            given[p.name] = catalogue.buffer(definition.name, p.name, axes, device)
        elif p.name in ("out", "output") and len(outputs) == 1:
            given[p.name] = catalogue.buffer(definition.name, *outputs, axes, device)
        elif "workspace" in p.name:
            given[p.name] = torch.empty(1 << 10, dtype=torch.uint8, device=device)
    bound = signature.bind(**given)
    bound.apply_defaults()
    return bound.arguments


@pytest.mark.slow
def test_flashinfer_trace_of_every_instance_of_a_routed_function_lands_on_it(routed):
    routable, catalogue, apis, generated = routed
    checked, problems = 0, []
    landed: dict[str, bool] = {}  # by entry point: whether every instance's call landed
    for family in catalogue.families.values():
        if family.api is None or family.plan is not None:
            continue
        api = apis.lookup(family.api.path).api
        if api is None or "." in api.qualname or api.path in NOT_FROM_THE_DEFINITION:
            continue
        if family.name in NOT_FROM_THE_DEFINITION:
            continue
        function = inspect.unwrap(getattr(importlib.import_module(api.module), api.qualname))
        definitions = [d for d in catalogue.defs.values() if d.family == family.name]
        candidates = [generated[d.name] for d in definitions]
        for d in definitions:
            try:
                arguments = _call_of(d, family, function, catalogue)
            except TypeError as exc:
                problems.append(
                    f"{d.name}: no call of {api.path} can be made from the definition alone "
                    f"({exc}); name the entry point in NOT_FROM_THE_DEFINITION with the reason"
                )
                continue
            written = apis.trace_definition(api, arguments)
            axes = _workload_axes(apis, api, arguments, written)
            r = resolve(written, candidates, axes=axes)
            checked += 1
            expected = NOT_LANDING.get(api.path)
            if not _lands_as_expected(r, d.name, expected, each_instance=True):
                problems.append(f"{d.name}: {r.describe()}, expected {expected}")
            own = r.kind in ("same", "resolved") and r.definition == d.name
            landed[api.path] = landed.get(api.path, True) and own
    # An entry whose routed call lands (checked by the test above) is stale once every other
    # instance's call lands too.
    problems += [
        f"{path}: every instance's call lands on its own definition: a stale NOT_LANDING entry"
        for path, expected in NOT_LANDING.items()
        if expected == _NO_PAGE_SIZE_BUT_ROUTED and landed.get(path, False)
    ]
    assert not problems, "\n".join(problems)
    # Every instance of the routed function families, but for those a call cannot be made
    # for from the definition alone.
    assert checked == sum(
        1
        for d in catalogue.defs.values()
        if (f := catalogue.families[d.family]).api is not None
        and f.plan is None
        and "." not in apis.lookup(f.api.path).api.qualname
        and apis.lookup(f.api.path).api.path not in NOT_FROM_THE_DEFINITION
        and f.name not in NOT_FROM_THE_DEFINITION
    )
    assert checked >= 60
