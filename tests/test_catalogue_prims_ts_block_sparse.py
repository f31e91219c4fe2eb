"""The PrimTS block-sparse attention families (``definitions/attention_prims_ts_block_sparse.fidef``)
and the Cake VSA one (``cake_vsa_run`` of ``attention_block_sparse.fidef``) against the real
FlashInfer.

FlashInfer 0.7.2.post1 is installed; its PrimTS and Cake kernels need an SM100 GPU, so its functions
are never run here. As in ``test_catalogue_prims_ts.py``, the real function (and a wrapper's
plan) is replaced by a recorder with its signature before apply is enabled, and each check
calls the patched API:

- a call with FlashInfer's defaults is routed, and the solution sees the definition's inputs;
- each ruled parameter at a value the definition does not model is refused with its rule
  counted, and reaches FlashInfer's function unchanged; another block size names a definition
  nothing serves;
- the reference agrees with independent computations: dense attention where every block is
  selected, a direct softmax over the keys of one query's selected blocks (bottom-right
  causal), one shared pattern as that pattern given to every KV head, and the paged cache as
  the contiguous K/V it holds.
"""

from __future__ import annotations

import math

import pytest
import torch
from _shared import require_module, strided

require_module("flashinfer", "flashinfer-python 0.7.2.post1 is not installed (see .ci/run)")

import _prims_ts_calls as calls  # noqa: E402
import test_catalogue_prims_ts as base  # noqa: E402

pytestmark = base.pytestmark

MODULE = "flashinfer.attention.prims_ts.block_sparse"
ONE_SHOT = f"{MODULE}.block_sparse_attention"
PAGED = f"{MODULE}.block_sparse_attention_with_paged_kv_cache"
NAME = calls.SPARSE_NAME
WNAME = calls.SPARSE_WRAPPER_NAME
PNAME = calls.PAGED_SPARSE_NAME
PWNAME = calls.PAGED_SPARSE_WRAPPER_NAME


def _case(name: str = NAME, seed: int = 0, **axes: int):
    return calls.sparse_case(base._catalogue(), name, seed, **axes)


def _pcase(name: str = PNAME, seed: int = 0, **axes: int):
    return calls.paged_sparse_case(base._catalogue(), name, seed, **axes)


def _args(x):
    return (x["q"], x["k"], x["v"], x["block_indptr"], x["block_indices"], 64, 64)


def _pargs(x, cache=None):
    cache = calls.combined_cache(x) if cache is None else cache
    args = (x["q"], cache, x["block_tables"], x["seq_lens_kv"], x["block_indptr"])
    return (*args, x["block_indices"], 64, 64)


def _wrappers():
    from flashinfer.attention.prims_ts.block_sparse import (
        BlockSparsePagedTSWrapper,
        BlockSparseTSWrapper,
    )

    return BlockSparseTSWrapper, BlockSparsePagedTSWrapper


# ---------------------------------------------------------------------------------------
# block_sparse_attention and BlockSparseTSWrapper
# ---------------------------------------------------------------------------------------


def test_one_shot_with_flashinfers_defaults_is_routed(monkeypatch):
    x, axes = _case()
    out = base._route(monkeypatch, NAME, _args(x), {}, path=ONE_SHOT)
    base._hit(out)
    (seen,) = out.seen
    assert seen["block_indptr"] is x["block_indptr"] and seen["block_indices"] is x["block_indices"]
    # mask_type "dense" is no causal mask; sm_scale None is 1/sqrt(head_dim).
    assert (seen["causal"], seen["sm_scale"]) == (False, 1 / math.sqrt(128))
    assert torch.equal(out.result, base._reference(NAME)(**seen))
    buf = base._catalogue().buffer(NAME, "output", axes)
    kwargs = {"mask_type": "causal", "sm_scale": 0.2, "out": buf}
    out = base._route(monkeypatch, NAME, _args(x), kwargs, path=ONE_SHOT)
    base._hit(out)
    assert (out.seen[0]["causal"], out.seen[0]["sm_scale"]) == (True, 0.2)
    assert out.result is buf and torch.equal(buf, base._reference(NAME)(**out.seen[0]))


def test_one_shot_takes_one_pattern_shared_by_every_kv_head(monkeypatch):
    x, _ = _case(num_pattern_heads=1)
    kwargs = {"share_pattern_across_kv_heads": True}
    base._hit(base._route(monkeypatch, NAME, _args(x), kwargs, path=ONE_SHOT))
    # A shared pattern without the flag (or the reverse) is another call: FlashInfer's.
    out = base._route(monkeypatch, NAME, _args(x), {}, path=ONE_SHOT)
    base._refused(out, "block_indptr,share_pattern_across_kv_heads,k")


@pytest.mark.parametrize(
    ("param", "value", "rule"),
    [
        ("use_block_sparse", False, "use_block_sparse"),
        ("sparse_format", "bitmask", "sparse_format"),
        ("use_proxy_routes", True, "use_proxy_routes"),
        ("exact_block_bits", torch.zeros(1, dtype=torch.int32), "exact_block_bits"),
        ("k_summary", torch.zeros(1), "k_summary"),
        ("kv_valid_bits", torch.zeros(2, 5, dtype=torch.int32), "kv_valid_bits"),
        ("sage", object(), "sage"),
        ("mask_type", "sliding", "mask_type"),
    ],
)
def test_one_shot_parameters_the_definition_does_not_model_are_refused(
    monkeypatch, param, value, rule
):
    x, _ = _case()
    out = base._route(monkeypatch, NAME, _args(x), {param: value}, path=ONE_SHOT)
    base._refused(out, rule)
    assert out.originals[0][param] is value


def test_one_shot_another_block_size_or_dtype_is_refused(monkeypatch):
    x, _ = _case()
    args = (*_args(x)[:5], 128, 64)  # no definition has 128-query rows
    base._refused(base._route(monkeypatch, NAME, args, {}, path=ONE_SHOT), "q_block_size")
    args = (*_args(x)[:5], 64, 128)
    base._refused(base._route(monkeypatch, NAME, args, {}, path=ONE_SHOT), "kv_block_size")
    args = (x["q"].half(), x["k"].half(), x["v"].half(), *_args(x)[3:])
    base._refused(base._route(monkeypatch, NAME, args, {}, path=ONE_SHOT), "tensor:q")


def test_wrapper_is_routed_with_the_plans_mask_and_block_sizes(monkeypatch):
    W, _ = _wrappers()
    x, _ = _case(WNAME)
    plan = calls.sparse_wrapper_plan()
    out = base._route_wrapper(monkeypatch, WNAME, plan, _args(x)[:5], {}, W=W)
    base._hit(out)
    assert (out.seen[0]["causal"], out.seen[0]["sm_scale"]) == (True, 1 / math.sqrt(128))
    assert torch.equal(out.result, base._reference(WNAME)(**out.seen[0]))
    # Planned for 128-query rows or 128-key blocks: no definition has them.
    args, kwargs = plan
    for sizes, rule in (((128, 64), "plan.q_block_size"), ((64, 128), "plan.kv_block_size")):
        plan = ((*args[:6], *sizes), kwargs)
        out = base._route_wrapper(monkeypatch, WNAME, plan, _args(x)[:5], {}, W=W)
        base._refused(out, rule)


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"use_block_sparse": False, "max_blocks_per_row": None}, "plan.use_block_sparse"),
        ({"sparse_format": "bitmask"}, "plan.sparse_format"),
        ({"use_kv_valid_bits": True}, "plan.use_kv_valid_bits"),
        ({"q_data_type": torch.float16}, "plan.q_data_type"),
        ({"o_data_type": torch.float16}, "plan.o_data_type"),
        (
            {"share_pattern_across_kv_heads": True},
            "block_indptr,plan.share_pattern_across_kv_heads,k",
        ),
    ],
)
def test_wrapper_plans_the_definition_does_not_model_are_refused(monkeypatch, changes, rule):
    W, _ = _wrappers()
    x, _ = _case(WNAME)
    plan = calls.sparse_wrapper_plan(**changes)
    out = base._route_wrapper(monkeypatch, WNAME, plan, _args(x)[:5], {}, W=W)
    base._refused(out, rule)


def test_wrapper_a_plan_of_other_lengths_is_refused(monkeypatch):
    W, _ = _wrappers()
    x, _ = _case(WNAME)
    args, kwargs = calls.sparse_wrapper_plan()
    plan = ((args[0], args[1], 96, *args[3:]), kwargs)  # 96 keys planned, 160 given
    base._refused(
        base._route_wrapper(monkeypatch, WNAME, plan, _args(x)[:5], {}, W=W), "k,plan.seq_len_kv"
    )


# ---------------------------------------------------------------------------------------
# block_sparse_attention_with_paged_kv_cache and BlockSparsePagedTSWrapper
# ---------------------------------------------------------------------------------------


def test_paged_takes_the_cache_combined_or_as_a_tuple(monkeypatch):
    x, _ = _pcase()
    combined = calls.combined_cache(x)
    out = base._route(monkeypatch, PNAME, _pargs(x, combined), {"max_seq_len_kv": 192}, PAGED)
    base._hit(out)
    (seen,) = out.seen
    assert torch.equal(seen["k_cache"], x["k_cache"]) and torch.equal(seen["v_cache"], x["v_cache"])
    assert seen["k_cache"].data_ptr() == combined.data_ptr()
    assert torch.equal(out.result, base._reference(PNAME)(**seen))
    tuple_args = _pargs(x, (x["k_cache"], x["v_cache"]))
    out = base._route(monkeypatch, PNAME, tuple_args, {"max_seq_len_kv": 4096}, PAGED)
    base._hit(out)
    assert out.seen[0]["k_cache"] is x["k_cache"]


def test_paged_parameters_the_definition_does_not_model_are_refused(monkeypatch):
    x, _ = _pcase()
    bits = torch.zeros(2, 6, dtype=torch.int32)
    kwargs = {"max_seq_len_kv": 192, "kv_valid_bits": bits}
    base._refused(base._route(monkeypatch, PNAME, _pargs(x), kwargs, PAGED), "kv_valid_bits")
    kwargs = {"max_seq_len_kv": 192, "mask_type": "sliding"}
    base._refused(base._route(monkeypatch, PNAME, _pargs(x), kwargs, PAGED), "mask_type")


def test_paged_wrapper_is_routed_and_refuses_what_it_does_not_model(monkeypatch):
    _, W = _wrappers()
    x, _ = _pcase(PWNAME)
    run_args = _pargs(x)[:6]
    out = base._route_wrapper(
        monkeypatch, PWNAME, calls.paged_sparse_wrapper_plan(), run_args, {}, W=W
    )
    base._hit(out)
    assert out.seen[0]["causal"] is True
    assert torch.equal(out.result, base._reference(PWNAME)(**out.seen[0]))
    plan = calls.paged_sparse_wrapper_plan(use_kv_valid_bits=True)
    base._refused(
        base._route_wrapper(monkeypatch, PWNAME, plan, run_args, {}, W=W), "plan.use_kv_valid_bits"
    )
    args, kwargs = calls.paged_sparse_wrapper_plan()
    plan = ((*args[:8], 128), kwargs)  # pages of 128 tokens planned, 64 given
    out = base._route_wrapper(monkeypatch, PWNAME, plan, run_args, {}, W=W)
    base._refused(out, "plan.page_size")
    plan = ((*args[:6], 128, 64, 64), kwargs)
    out = base._route_wrapper(monkeypatch, PWNAME, plan, run_args, {}, W=W)
    base._refused(out, "plan.q_block_size")


# ---------------------------------------------------------------------------------------
# The references
# ---------------------------------------------------------------------------------------


def _every_block(batch: int, heads: int, rows: int, blocks: int):
    indptr = torch.arange(batch * heads * rows + 1, dtype=torch.int32) * blocks
    indptr = torch.stack([indptr[i * rows : i * rows + rows + 1] for i in range(batch * heads)])
    indices = torch.arange(blocks, dtype=torch.int32).repeat(batch * heads * rows)
    return indptr.reshape(batch, heads, rows + 1), indices


def test_reference_with_every_block_selected_is_dense_attention():
    x, _ = _case(seed=1)
    indptr, indices = _every_block(2, 8, 2, 3)
    ref = base._reference(NAME)
    for causal in (False, True):
        ours = ref(x["q"], x["k"], x["v"], indptr, indices, causal, 0.1)
        # Bottom-right causal: query i of 80 sees keys 0 .. 160 - 80 + i.
        mask = None
        if causal:
            mask = torch.arange(160)[None, :] <= torch.arange(80)[:, None] + 80
        theirs = torch.nn.functional.scaled_dot_product_attention(
            x["q"].float().transpose(1, 2),
            x["k"].float().repeat_interleave(4, dim=2).transpose(1, 2),
            x["v"].float().repeat_interleave(4, dim=2).transpose(1, 2),
            attn_mask=mask,
            scale=0.1,
        ).transpose(1, 2)
        base._close(ours, theirs)


def test_reference_attends_to_the_keys_of_each_rows_blocks_only():
    x, _ = _case(seed=2)
    q, k, v = x["q"], x["k"], x["v"]
    indptr, indices = x["block_indptr"], x["block_indices"]
    ours = base._reference(NAME)(q, k, v, indptr, indices, True, 0.2)
    for b, i, h in [(0, 0, 0), (0, 70, 5), (1, 63, 31), (1, 64, 12), (1, 79, 20)]:
        kv_head, row = h // 4, i // 64
        blocks = indices[int(indptr[b, kv_head, row]) : int(indptr[b, kv_head, row + 1])]
        keys = [j for c in blocks.tolist() for j in range(c * 64, min(c * 64 + 64, 160))]
        keys = [j for j in keys if j <= 160 - 80 + i]  # bottom-right causal
        if not keys:
            assert not ours[b, i, h].any()
            continue
        logits = (k[b, keys, kv_head].float() @ q[b, i, h].float()) * 0.2
        expected = logits.softmax(-1) @ v[b, keys, kv_head].float()
        base._close(ours[b, i, h], expected)


def test_reference_of_a_shared_pattern_is_that_pattern_given_to_every_kv_head():
    x, _ = _case(seed=3, num_pattern_heads=1)
    ref = base._reference(NAME)
    shared = ref(x["q"], x["k"], x["v"], x["block_indptr"], x["block_indices"], False, 0.1)
    # The one row list per request, repeated for each of the 8 KV heads.
    nnz = int(x["block_indptr"][-1, 0, -1])
    offsets, lists = [], []
    for b in range(2):
        row = x["block_indptr"][b, 0]
        for _ in range(8):
            start = sum(len(part) for part in lists)
            offsets.append(row - row[0] + start)
            lists.append(x["block_indices"][int(row[0]) : int(row[-1])])
    per_head = ref(
        x["q"], x["k"], x["v"], torch.stack(offsets).reshape(2, 8, -1), torch.cat(lists), False, 0.1
    )
    assert nnz == x["block_indices"].numel() and torch.equal(shared, per_head)


def test_paged_reference_is_the_contiguous_one_over_the_keys_its_pages_hold():
    x, _ = _pcase(seed=4)
    pages = x["block_tables"].long()
    ref_paged, ref = base._reference(PNAME), base._reference(NAME)
    paged = ref_paged(
        x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["seq_lens_kv"],
        x["block_indptr"], x["block_indices"], True, 0.1,
    )  # fmt: skip
    for b in range(2):
        n = int(x["seq_lens_kv"][b])
        k = x["k_cache"][pages[b]].transpose(1, 2).flatten(0, 1)[None, :n]
        v = x["v_cache"][pages[b]].transpose(1, 2).flatten(0, 1)[None, :n]
        indptr = x["block_indptr"][b : b + 1]
        start = int(indptr[0, 0, 0])
        indices = x["block_indices"][start : int(indptr[0, -1, -1])]
        one = ref(x["q"][b : b + 1], k, v, indptr - start, indices, True, 0.1)
        assert torch.equal(paged[b : b + 1], one)


# ---------------------------------------------------------------------------------------
# run_cake_vsa (definitions/attention_block_sparse.fidef): its plan is a dict of metadata
# ---------------------------------------------------------------------------------------

CAKE = "flashinfer.cake_vsa.run_cake_vsa"


def _cake_case(seed: int = 0):
    import _routable_attention as attention

    x, axes = base._catalogue().inputs(
        attention.CAKE_NAME, seed=seed, num_blocks_row=2, num_blocks_col=3
    )
    x["block_mask"][:, 0, 1] = False
    x["block_mask"][5, 1, :2] = False  # head 5's second block row sees the last block only
    return x, axes, attention


def _cake_kwargs(**changes):
    return {"out": None, "lse": None, "return_lse": False, "backend": "cake"} | changes


def test_cake_vsa_reads_the_plans_block_mask_and_scale(monkeypatch):
    x, axes, attention = _cake_case()
    plan = attention.cake_plan(x)
    args = (plan, x["q"], x["k"], x["v"])
    out = base._route(monkeypatch, attention.CAKE_NAME, args, _cake_kwargs(), path=CAKE)
    base._hit(out)
    (seen,) = out.seen
    assert seen["block_mask"] is plan["block_mask"] and seen["sm_scale"] == 0.1
    assert torch.equal(out.result, base._reference(attention.CAKE_NAME)(**seen))
    # sm_scale None in the plan is 1/sqrt(head_dim), as FlashInfer's route resolves it.
    args = (attention.cake_plan(x, sm_scale=None), *args[1:])
    out = base._route(monkeypatch, attention.CAKE_NAME, args, _cake_kwargs(), path=CAKE)
    base._hit(out)
    assert out.seen[0]["sm_scale"] == 1 / math.sqrt(128)


@pytest.mark.parametrize(
    ("plan_changes", "kwargs", "rule"),
    [
        ({}, {"backend": "cutlass"}, "backend"),
        ({}, {"return_lse": True}, "return_lse"),
        # A rule over the plan dict is counted under the parameter it reads, `plan`; with
        # no block mask, the mask's shape the key is read from cannot be computed.
        ({"block_mask": None}, {}, "unevaluable"),
        ({"R": 128, "C": 128}, {}, "plan"),
        ({"kv_block_lens": torch.tensor([64, 64, 40])}, {}, "plan"),
    ],
)
def test_cake_vsa_what_the_definition_does_not_model_is_refused(
    monkeypatch, plan_changes, kwargs, rule
):
    x, _, attention = _cake_case()
    args = (attention.cake_plan(x, **plan_changes), x["q"], x["k"], x["v"])
    out = base._route(monkeypatch, attention.CAKE_NAME, args, _cake_kwargs(**kwargs), CAKE)
    base._refused(out, rule)


def test_cake_vsa_reference_attends_to_each_heads_selected_blocks_only():
    x, _, attention = _cake_case(seed=1)
    ours = base._reference(attention.CAKE_NAME)(x["q"], x["k"], x["v"], x["block_mask"], 0.2)
    mask = x["block_mask"]
    for i, h in [(0, 0), (63, 7), (64, 5), (127, 5), (100, 23)]:
        blocks = mask[h, i // 64].nonzero().flatten().tolist()
        keys = [j for c in blocks for j in range(c * 64, c * 64 + 64)]
        logits = (x["k"][keys, h].float() @ x["q"][i, h].float()) * 0.2
        expected = logits.softmax(-1) @ x["v"][keys, h].float()
        base._close(ours[i, h], expected)


@pytest.mark.parametrize(("position", "rule"), [(0, "q,k,v"), (4, "block_indices")])
def test_strided_operands_are_left_to_flashinfer(monkeypatch, position, rule):
    # FlashInfer takes q, k, v and the routing tensors compact, and refuses others.
    x, _ = _case()
    args = list(_args(x))
    args[position] = strided(args[position])
    base._refused(base._route(monkeypatch, NAME, tuple(args), {}, path=ONE_SHOT), rule)
